"""The quote of a task not posted yet: its price, the budget it needs, the resources it
asks of a worker, and who could take it now. The API's ``POST /tasks/quote/`` and the
post page's estimate both read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from marketplace.kinds import Kind, Resources
from marketplace.work import Supply, work


@dataclass(frozen=True)
class Quote:
    """What posting a task of ``kind`` with a valid ``spec`` would cost and meet."""

    kind: Kind
    spec: dict[str, Any]
    price: int  # per replica, base units
    replication: int | None  # None while the form's field does not parse
    resources: Resources
    supply: Supply
    bid: int | None = None  # per replica, fee included; None when the request names none yet
    wait_seconds: float | None = None  # the likely wait for a node at the bid (None: unknown)
    run_seconds: float | None = None  # the likely time from a node's offer to the verdict (None: unknown)

    @property
    def budget_needed(self) -> int | None:
        """What check_task_request asks the budget to cover: every replica is paid."""
        return self.price * self.replication if self.replication else None

    @property
    def warning(self) -> str:
        """Why the task would wait for workers, or "" when enough of them fit now and take its bid."""
        return (self.supply.posting_warning(self.replication or 1) + self.supply.bid_advice()).strip()


def quote_task(
    kind: Kind, spec: dict[str, Any], min_reputation: int, replication: int | None, bid: int | None = None
) -> Quote:
    """Price and supply for a validated ``spec`` of ``kind``, and the market at ``bid``."""
    supply = work().survey(kind.name, spec, min_reputation, bid)
    wait = None if bid is None else work().expected_wait(kind.name, bid, supply.at_bid, len(supply.free))
    return Quote(
        kind=kind,
        spec=spec,
        price=kind.estimate_price(spec),
        replication=replication,
        resources=kind.resources(spec),
        supply=supply,
        bid=bid,
        wait_seconds=wait,
        run_seconds=work().expected_run(kind.name, kind.tflop(spec)),
    )
