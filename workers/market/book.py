"""The order book of a kind, and the wait a bid can expect: what the market page and a
task's quote show."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from datetime import timedelta

from django.db.models import Exists, OuterRef
from django.utils import timezone

from marketplace import pricing
from marketplace.models import ACTIVE, Task
from workers.market.asks import ask_for, asks_of
from workers.models import REPLICA_HELD as HELD
from workers.models import UNSETTLED, Assignment, Worker

RECENT_JOBS = 50  # accepted jobs of a kind a wait is estimated from
RECENT_PRICES = 20  # prices paid the market page lists


def typical_run_seconds(kind: str) -> float | None:
    """The median time the kind's recent accepted jobs took, offer to verdict; None with none."""
    rows = (
        Assignment.objects.filter(task__kind=kind, state=Assignment.State.ACCEPTED, settled_at__isnull=False)
        .order_by("-settled_at")
        .values_list("created_at", "settled_at")[:RECENT_JOBS]
    )
    spans = [(settled - created).total_seconds() for created, settled in rows if settled is not None]
    return statistics.median(spans) if spans else None


def expected_run_seconds(kind: str, tflop: float) -> float | None:
    """Seconds a job of ``tflop`` (the kind's work measure) would likely take, offer to
    verdict: the median seconds per TFLOP of the kind's recent accepted jobs (their task's
    ``work_tflop``), times ``tflop``. Where the work measure says nothing (no TFLOPs to
    scale by), the median job time; None when the kind has no accepted job to time."""
    rows = (
        Assignment.objects.filter(task__kind=kind, state=Assignment.State.ACCEPTED, settled_at__isnull=False)
        .order_by("-settled_at")
        .values_list("created_at", "settled_at", "task__work_tflop")[:RECENT_JOBS]
    )
    spans: list[float] = []
    rates: list[float] = []
    for created, settled, work in rows:
        if settled is None:
            continue
        span = (settled - created).total_seconds()
        spans.append(span)
        if work and work > 0:
            rates.append(span / work)
    if tflop > 0 and rates:
        return statistics.median(rates) * tflop
    return statistics.median(spans) if spans else None


def expected_wait(kind: str, bid: int, at_bid: int, free: int) -> float | None:
    """Seconds a task bidding ``bid`` would likely wait for a node: none when a node that
    takes the bid is free; else the waiting tasks of the kind bidding as much or more go
    first, ``at_bid`` nodes at a time, each round as long as the kind's typical job. None
    when no node takes the bid, or the kind has no accepted job to estimate from."""
    if at_bid <= 0:
        return None
    if free > 0:
        return 0.0
    typical = typical_run_seconds(kind)
    if typical is None:
        return None
    ahead = Task.objects.filter(status__in=ACTIVE, kind=kind, bid__gte=bid).exclude(
        Exists(Assignment.objects.filter(task=OuterRef("pk"), state__in=HELD))
    )
    rounds = math.ceil((ahead.count() + 1) / at_bid)
    return rounds * typical


@dataclass(frozen=True)
class Level:
    """One price in the book: what a requester pays (fee included) and how many at it."""

    charge: int
    count: int


@dataclass(frozen=True)
class OrderBook:
    kind: str
    tflop: float  # the work the asks are priced at: the kind's default spec
    asks: list[Level]  # online nodes offering the kind, cheapest first
    bids: list[Level]  # waiting tasks of the kind, highest first
    recent: list[tuple[int, float]]  # (price paid, when: a timestamp) of the latest accepted jobs
    online: int
    free: int


def order_book(kind: str, tflop: float) -> OrderBook:
    """The kind's market now: the asks of its online nodes for a job of ``tflop``
    (the market page prices the kind's default job: ``offers.default_job_tflop``), the bids
    of its waiting tasks, recent prices paid."""
    busy = Exists(Assignment.objects.filter(worker=OuterRef("pk"), state__in=UNSETTLED))
    nodes = [
        (pk, caps, is_busy)
        for pk, caps, is_busy in Worker.objects.online().annotate(busy=busy).values_list("pk", "capabilities", "busy")
        if isinstance(caps, dict) and isinstance(caps.get("kinds"), list) and kind in caps["kinds"]
    ]
    asks = asks_of(pk for pk, _, _ in nodes)
    charges = sorted(pricing.charge(ask_for(asks.get(pk), kind).price(tflop)) for pk, _, _ in nodes)
    waiting = (
        Task.objects.filter(status__in=ACTIVE, kind=kind)
        .exclude(Exists(Assignment.objects.filter(task=OuterRef("pk"), state__in=HELD)))
        .order_by("-bid")
        .values_list("bid", flat=True)
    )
    since = timezone.now() - timedelta(days=7)
    recent = [
        (price, at.timestamp())
        for price, at in Assignment.objects.filter(
            task__kind=kind, state=Assignment.State.ACCEPTED, price__isnull=False, settled_at__gte=since
        )
        .order_by("-settled_at")
        .values_list("price", "settled_at")[:RECENT_PRICES]
        if price is not None and at is not None
    ]
    return OrderBook(
        kind=kind,
        tflop=tflop,
        asks=_levels(charges),
        bids=_levels(list(waiting)),
        recent=recent,
        online=len(nodes),
        free=sum(1 for _, _, is_busy in nodes if not is_busy),
    )


def _levels(values: list[int]) -> list[Level]:
    levels: list[Level] = []
    for value in values:
        if levels and levels[-1].charge == value:
            levels[-1] = Level(value, levels[-1].count + 1)
        else:
            levels.append(Level(value, 1))
    return levels
