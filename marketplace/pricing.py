"""What a job costs on each side of the market, in base units.

A provider's *ask* is what its node is paid for a job: per TFLOP of the kind's work
measure (the FLOPs the platform estimates from the spec, ``Kind.flops``) with a minimum per
job. The platform's fee (``LEDGER_PLATFORM_FEE_BPS`` of the ask) is charged to the
requester on top, so a provider keeps its whole ask, less the gas of the SUBMIT_RESULT it
signs. A requester's *bid* is the most it pays per replica, fee included: a node is
offered a task only when ``charge(its price) <= bid`` (docs/market.md).

A node that never set an ask for a kind asks the platform's reference rate
(``PROOFWORK_PRICE_PER_TFLOP_UNITS`` with the minimum job price): the requester then pays
what ``Kind.estimate_price`` quotes, as before there was a market.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from django.conf import settings

from ledger import gas
from protocol import encoding

BPS = 10_000


def fee_on(price: int) -> int:
    """The platform's fee on a job paid ``price`` (rounded down: never more than its share)."""
    return price * settings.LEDGER_PLATFORM_FEE_BPS // BPS


def charge(price: int) -> int:
    """What the requester pays for a job that pays its node ``price``."""
    return price + fee_on(price)


def largest_price_under(bid: int) -> int:
    """The highest node price whose charge fits in ``bid``."""
    bps = settings.LEDGER_PLATFORM_FEE_BPS
    price = bid * BPS // (BPS + bps)
    while charge(price + 1) <= bid:
        price += 1
    while price > 0 and charge(price) > bid:
        price -= 1
    return price


@dataclass(frozen=True)
class Ask:
    """A node's terms for one kind: units per TFLOP, and the least it takes for a job."""

    per_tflop: int
    minimum: int

    def price(self, tflop: float) -> int:
        """What the node is paid for a job of ``tflop`` TFLOP (rounded up to a unit)."""
        return max(self.minimum, math.ceil(self.per_tflop * tflop))


def minimum_reward() -> int:
    """The gas a job's node pays: the SUBMIT_RESULT it signs (out of its reward) and the
    TRANSFER that sweeps the rest to its provider's wallet (workers/assignments/sweep.py)."""
    price = settings.LEDGER_GAS_PRICE
    return gas.fee_for(encoding.SUBMIT_RESULT, price) + gas.fee_for(encoding.TRANSFER, price)


def floor_price() -> int:
    """The least any job may pay a node, and so the least an ask's minimum may be: the
    platform's minimum job price, and never less than the gas the node pays for it."""
    return max(settings.MIN_TASK_PRICE_UNITS, minimum_reward())


def reference_ask() -> Ask:
    """The ask of a node that set none for a kind: the platform's rate, less its fee, and
    the floor price. ``Kind.estimate_price`` quotes what a requester pays such a node."""
    return Ask(per_tflop=largest_price_under(settings.PRICE_PER_TFLOP_UNITS), minimum=floor_price())
