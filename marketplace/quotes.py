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

    @property
    def budget_needed(self) -> int | None:
        """What check_task_request asks the budget to cover: every replica is paid."""
        return self.price * self.replication if self.replication else None

    @property
    def warning(self) -> str:
        """Why the task would wait for workers, or "" when enough of them fit now."""
        return self.supply.posting_warning(self.replication or 1)


def quote_task(kind: Kind, spec: dict[str, Any], min_reputation: int, replication: int | None) -> Quote:
    """Price and supply for a validated ``spec`` of ``kind``."""
    return Quote(
        kind=kind,
        spec=spec,
        price=kind.estimate_price(spec),
        replication=replication,
        resources=kind.resources(spec),
        supply=work().survey(kind.name, spec, min_reputation),
    )
