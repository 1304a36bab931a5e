"""A market pass (workers.market has the rule): read every waiting task and every free online node from the database,
match them by the rule (``workers.market.matching``), and hand each match to the
scheduler, which re-checks it under the task's and the node's row locks."""

from __future__ import annotations

import gc
import json
import logging
import math
from collections import defaultdict
from collections.abc import Hashable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django.db.models import Count, Exists, F, OuterRef, Q, TextField
from django.db.models.functions import Cast, Coalesce

from ledger.models import Account, AccountKind
from marketplace import pricing
from marketplace.kinds import KINDS
from marketplace.models import ACTIVE, Task
from workers.assignments import supply
from workers.market.asks import ask_for, asks_of
from workers.market.matching import Match, Node, Order, match
from workers.models import REPLICA_HELD, UNSETTLED, Assignment, Shortfall, Worker
from workers.models import REPLICA_HELD as HELD

log = logging.getLogger(__name__)

# How much less a node that lost the task, or its provider, comes: after every fresher node.
PROVIDER_LOST, NODE_LOST = 1, 2
EXPIRED = Assignment.State.EXPIRED
MAX_MEMORY = 2**62  # more than any node reports (capabilities are bounded far below)


@dataclass
class Book:
    """What one pass decides on."""

    orders: list[Order]
    nodes: list[Node]


def read_orders() -> list[Order]:
    """Every active task of a runnable kind short of workers, with what bars or defers nodes."""
    runnable = [name for name, kind in KINDS.items() if kind.available]
    # Oldest first, so a row's place is its age among equal bids (no timestamps to parse);
    # features as text, parsed once per distinct list.
    # A requester that owes (a refunded or disputed purchase) is offered no new job.
    owing = Account.objects.filter(kind=AccountKind.USER, owed__gt=0).values("user_id")
    rows = list(
        Task.objects.filter(status__in=ACTIVE, kind__in=runnable)
        .exclude(owner__in=owing)
        .annotate(
            held=Count("assignments", filter=Q(assignments__state__in=HELD)),
            since=Coalesce("opened_at", "created_at"),
            needs=Cast("features", TextField()),
        )
        .filter(held__lt=F("replication"))
        .order_by("since", "pk")
        .values_list(
            "pk",
            "kind",
            "bid",
            "replication",
            "held",
            "max_attempts",
            "work_tflop",
            "memory_bytes",
            "needs",
            "min_reputation",
        )
    )
    # The jobs these tasks had, for the ones that had any: one read.
    had = Task.objects.filter(status__in=ACTIVE, kind__in=runnable, assignments__isnull=False)
    history: dict[UUID, list[tuple[UUID, int, str, bool]]] = defaultdict(list)
    jobs = Assignment.objects.filter(task__in=had.values("pk"))
    for task_id, worker_id, owner_id, state, shortfall in jobs.values_list(
        "task_id", "worker_id", "worker__owner_id", "state", "shortfall"
    ):
        # BARS_PROVIDER: a live or accepted replica, or a result short of the task's bar.
        bars = state in REPLICA_HELD or shortfall != Shortfall.NONE
        history[task_id].append((worker_id, owner_id, state, bars))
    # Tiers over nodes: the provider's other nodes by its owner, the node's own by its id.
    lost_by_owner = _nodes_of({o for jobs_of in history.values() for _, o, state, _ in jobs_of if state == EXPIRED})
    orders = []
    parsed: dict[str, frozenset[str] | None] = {}
    for age, (pk, kind, bid, replication, held, max_attempts, tflop, memory, needs, rep) in enumerate(rows):
        if needs not in parsed:
            parsed[needs] = _needs(needs)
        features = parsed[needs]
        if features is None or not math.isfinite(tflop) or tflop < 0:
            continue  # a row no posting writes: no node is known to fit it, so it waits
        jobs_of = history.get(pk)
        if not jobs_of:
            orders.append(Order(pk, kind, bid, float(age), replication - held, tflop, memory, features, rep))
            continue
        failed = sum(1 for _, _, state, _ in jobs_of if state in (Assignment.State.REJECTED, Assignment.State.EXPIRED))
        if failed >= max_attempts * replication:
            continue  # the scheduler fails it (or waits for a verdict): nothing to offer
        lost_nodes = {w for w, _, state, _ in jobs_of if state == EXPIRED}
        lost_owners = {o for _, o, state, _ in jobs_of if state == EXPIRED}
        retakers: dict[Hashable, int] = {
            node: NODE_LOST if node in lost_nodes else PROVIDER_LOST
            for owner in lost_owners
            for node in lost_by_owner.get(owner, ())
        }
        orders.append(
            Order(
                id=pk,
                kind=kind,
                bid=bid,
                opened=float(age),
                slots=replication - held,
                tflop=tflop,
                memory_bytes=memory,
                features=features,
                min_reputation=rep,
                exclude=frozenset(supply.not_offered_again((w, state) for w, _, state, _ in jobs_of)),
                owners=frozenset(o for _, o, _, bars in jobs_of if bars),
                retakers=retakers,
            )
        )
    return orders


def _needs(text: str | None) -> frozenset[str] | None:
    """A task's stored features, or None when they are not a list of names."""
    try:
        names = json.loads(text or "[]")
    except ValueError:
        return None
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        return None
    return frozenset(names)


def _nodes_of(owners: set[int]) -> dict[int, list[UUID]]:
    """The nodes of each of ``owners``, in one read."""
    out: dict[int, list[UUID]] = defaultdict(list)
    for pk, owner in Worker.objects.filter(owner_id__in=owners).values_list("pk", "owner_id"):
        out[owner].append(pk)
    return out


def read_nodes() -> list[Node]:
    """Every online node holding no unsettled job, with its asks."""
    rows = list(
        Worker.objects.online()
        .exclude(Exists(Assignment.objects.filter(worker=OuterRef("pk"), state__in=UNSETTLED)))
        .values_list("pk", "owner_id", "reputation", "benchmark_gflops", "capabilities")
    )
    asks = asks_of(pk for pk, *_ in rows)
    return [_node(pk, owner, rep, bench, caps, asks.get(pk)) for pk, owner, rep, bench, caps in rows]


def _node(pk: UUID, owner: int, rep: int, bench: float | None, caps: Any, asks: Any) -> Node:
    caps = caps if isinstance(caps, dict) else {}
    kinds = caps.get("kinds")
    features = caps.get("features")
    try:
        memory = max(int(caps.get("gpu_memory_bytes") or 0), int(caps.get("ram_bytes") or 0))
    except (TypeError, ValueError, OverflowError):
        memory = 0
    memory = min(max(memory, 0), MAX_MEMORY)  # the matcher's arrays are int64
    offered = frozenset(k for k in kinds if isinstance(k, str)) if isinstance(kinds, list) else frozenset()
    return Node(
        id=pk,
        owner=owner,
        reputation=rep,
        benchmark=bench or 0.0,
        memory_bytes=memory,
        kinds=offered,
        features=frozenset(f for f in features if isinstance(f, str)) if isinstance(features, list) else frozenset(),
        asks={kind: ask_for(asks, kind) for kind in offered},
    )


def read_book() -> Book:
    return Book(read_orders(), read_nodes())


def decide(book: Book) -> list[Match]:
    return match(book.orders, book.nodes, pricing.largest_price_under)


@contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic garbage collector held off while a pass reads and decides: the pass
    builds tens of thousands of short-lived rows, which free themselves by reference
    count, and the collections they would trigger cost more than the pass (a 10,000-task
    book: about 90 ms read with it held, 250 without). It runs again right after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def offer_waiting() -> int:
    """One pass: match, then offer each match through the scheduler. Returns jobs offered."""
    with paused_gc():
        matches = decide(read_book())
    return offer(matches)


def offer(matches: Iterable[Match]) -> int:
    """Offer each task its matched nodes through the scheduler, which re-checks them under
    the rows' locks; the reasons of tasks left short read the online nodes once."""
    from workers.assignments import scheduler  # the scheduler calls this pass: import at use

    offered = 0
    with supply.one_pass():
        for task_id, nodes in _by_task(matches).items():
            try:
                offered += len(scheduler.schedule(task_id, chosen=nodes))
            except Exception:
                log.exception("offering task %s its matched nodes failed; the next pass tries again", task_id)
    return offered


def _by_task(matches: Iterable[Match]) -> dict[Any, list[Any]]:
    out: dict[Any, list[Any]] = {}
    for m in matches:
        out.setdefault(m.order, []).append(m.node)
    return out
