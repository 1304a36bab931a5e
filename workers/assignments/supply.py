"""Which online workers could take a task, and why each of the others cannot.

One check (``misfit``) decides both what the scheduler hands out and what a requester is
told: the post page's estimate ("2 of the 3 online workers fit, 1 free now") and a
waiting task's reason ("of the 3 online, 2 run an agent without poc:aes256ctr; ...").
Only capabilities the worker registered count, never what it says later.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Collection, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol
from uuid import UUID

from django.db.models import Exists, OuterRef

from ledger.units import format_credits
from marketplace import pricing
from marketplace.kinds import KINDS, Kind, memory
from workers.assignments import lifecycle
from workers.market.asks import asks_of
from workers.models import BARS_PROVIDER, UNSETTLED, Assignment, Worker

log = logging.getLogger(__name__)

# Why an online worker cannot take a task, in the order they are checked: a worker counts
# once, under the first requirement it fails.
KIND, FEATURES, MEMORY, REPUTATION, TOOK_PART, BUSY = "kind", "features", "memory", "reputation", "took_part", "busy"
SAME_PROVIDER = "same_provider"  # its owner's other node holds a replica of the task
ASK = "ask"  # it asks more for the task than the task bids (docs/market.md)
REASONS = (KIND, FEATURES, MEMORY, REPUTATION, TOOK_PART, SAME_PROVIDER, ASK, BUSY)


@dataclass(frozen=True)
class Need:
    """What a task asks of a worker."""

    kind: Kind
    memory_bytes: int
    features: frozenset[str]
    min_reputation: int
    tflop: float = 0.0  # the kind's work measure of the spec: what asks price
    bid: int | None = None  # per replica, the fee included; None: any ask fits (a quote without one)

    @classmethod
    def of(cls, kind_name: str, spec: dict[str, Any], min_reputation: int, bid: int | None = None) -> Need:
        kind = KINDS[kind_name]
        return cls(
            kind,
            kind.resources(spec).memory_bytes,
            frozenset(kind.features(spec)),
            min_reputation,
            kind.tflop(spec),
            bid,
        )

    def charge(self, asks: dict[str, pricing.Ask] | None) -> int:
        """What the requester would pay a node with ``asks`` for the task, fee included."""
        own = (asks or {}).get(self.kind.name)
        return pricing.charge((own or pricing.reference_ask()).price(self.tflop))

    def sentence(self) -> str:
        supporting = f" (agent supporting {', '.join(sorted(self.features))})" if self.features else ""
        reputation = f" and reputation ≥ {self.min_reputation}" if self.min_reputation else ""
        return (
            f"It needs a worker that offers {self.kind.label}{supporting}"
            f" with {memory(self.memory_bytes)} of memory{reputation}."
        )


def misfit(worker: _Candidate, need: Need) -> str | None:
    """The first of the task's requirements the worker's registered capabilities fail."""
    caps = worker.capabilities if isinstance(worker.capabilities, dict) else {}
    kinds = caps.get("kinds")
    if not isinstance(kinds, list) or need.kind.name not in kinds:
        return KIND
    features = caps.get("features")
    if not need.features <= ({f for f in features if isinstance(f, str)} if isinstance(features, list) else set()):
        return FEATURES
    try:
        memory = max(int(caps.get("gpu_memory_bytes") or 0), int(caps.get("ram_bytes") or 0))
    except (TypeError, ValueError, OverflowError):
        memory = 0
    if memory < need.memory_bytes:
        return MEMORY
    if worker.reputation < need.min_reputation:
        return REPUTATION
    return None


@dataclass
class Survey:
    """The online workers, by whether they could take the task now."""

    need: Need
    free: list[UUID] = field(default_factory=list)  # fit and hold no unsettled job, best first
    short: Counter[str] = field(default_factory=Counter)  # the others, by reason (REASONS)
    taken: int = 0  # workers just given the task, left out of the rest
    providers: set[int] = field(default_factory=set)  # owners of the fitting workers
    charges: list[int] = field(default_factory=list)  # what each fitting worker would cost, free or busy
    busy_at_bid: int = 0  # fitting workers whose ask fits the bid, busy with another job

    @property
    def lowest_asks(self) -> list[int]:
        """What the cheapest fitting workers (free or busy) would cost, the fee included."""
        return sorted(self.charges)[:5]

    @property
    def at_bid(self) -> int:
        """Fitting workers, free or busy, that would take the task at its bid."""
        return len(self.free) + self.busy_at_bid

    @property
    def online(self) -> int:
        return len(self.free) + sum(self.short.values())

    @property
    def fitting(self) -> int:
        """Workers that meet the requirements, free or busy."""
        return len(self.free) + self.short[BUSY]

    def reason(self) -> str:
        """Why the task waits. Called once the free workers were given its job, so a free
        one still counted was taken by another task meanwhile: it counts as busy."""
        counts = self.short + Counter({BUSY: len(self.free)})
        return f"Waiting for a worker: {self._state(counts)}. {self.need.sentence()}{self.bid_advice()}"

    def bid_advice(self) -> str:
        """When no fitting worker takes the task at its bid: the bid that one would take."""
        if self.need.bid is None or self.at_bid or not self.charges:
            return ""
        return (
            f" Its bid of {format_credits(self.need.bid)} credits is under every fitting node's ask:"
            f" the lowest asks {format_credits(min(self.charges))} credits with the platform's fee;"
            " a bid of that much would be taken."
        )

    def warning(self) -> str:
        """For a task not posted yet, when no online worker fits it."""
        return f"No worker can take this task now: {self._state(self.short)}. {self.need.sentence()}"

    def posting_warning(self, replication: int) -> str:
        """For a task not posted yet: why it would wait, or "" when enough workers fit.
        Replicas go to different providers, so r replicas need r providers' workers."""
        if not self.fitting:
            return self.warning()
        if len(self.providers) < replication:
            n = len(self.providers)
            have = "1 provider has" if n == 1 else f"{n} providers have"
            return (
                f"Only {have} fitting workers online, and its {replication} replicas must go to"
                f" {replication} different providers."
            )
        return ""

    def _state(self, counts: Counter[str]) -> str:
        other = " other" if self.taken else ""
        if not self.online:
            return f"no{other} worker is online"
        parts = [_describe(reason, counts[reason], self.need) for reason in REASONS if counts[reason] > 0]
        return f"of the {self.online}{other} online, " + "; ".join(parts)


def _describe(reason: str, count: int, need: Need) -> str:
    one = count == 1
    if reason == KIND:
        return f"{count} {'does' if one else 'do'} not offer {need.kind.label}"
    if reason == FEATURES:
        features = ", ".join(sorted(need.features))
        return f"{count} {'runs an agent' if one else 'run agents'} without {'all of ' if len(need.features) > 1 else ''}{features}"
    if reason == MEMORY:
        return f"{count} {'has' if one else 'have'} less than {memory(need.memory_bytes)} of memory"
    if reason == REPUTATION:
        return f"{count} {'has' if one else 'have'} reputation below {need.min_reputation}"
    if reason == TOOK_PART:
        return (
            f"{count} {'has' if one else 'have'} this task already, had {'its' if one else 'their'} result for it"
            " rejected, or lost it twice"
        )
    if reason == SAME_PROVIDER:
        return (
            f"{count} {'belongs' if one else 'belong'} to a provider already computing a replica of it"
            " (or whose result fell short of its quality bar)"
        )
    if reason == ASK:
        return f"{count} {'asks' if one else 'ask'} more than its bid"
    return f"{count} {'fits but is' if one else 'fit but are'} busy with another job"


class _Candidate(Protocol):
    @property
    def capabilities(self) -> Any: ...
    @property
    def reputation(self) -> int: ...


class Online(NamedTuple):
    """What a survey reads of one online worker."""

    pk: UUID
    reputation: int
    capabilities: Any
    busy: bool  # holds an unsettled job
    owner_id: int
    asks: dict[str, pricing.Ask] | None = None  # its own asks by kind (none: the reference ask)


def online_workers(max_age: float = 0.0) -> list[Online]:
    """Every online, active worker, best first (reputation, then longest since heartbeat).

    Read afresh, or the list already read in this ``one_pass``, or, with ``max_age``, one
    this process read at most that many seconds ago (a post page checked as the requester
    types, a quote: each would otherwise read the whole pool).
    """
    global _recent
    shared = _pass.get()
    if shared:
        return shared[0]
    now, recent = time.monotonic(), _recent
    if max_age > 0 and recent is not None and now - recent[0] <= max_age:
        return recent[1]
    busy = Exists(Assignment.objects.filter(worker=OuterRef("pk"), state__in=UNSETTLED))
    rows = [
        Online(*row)
        for row in Worker.objects.online()
        .annotate(busy=busy)
        .order_by("-reputation", "last_heartbeat_at")
        .values_list("pk", "reputation", "capabilities", "busy", "owner_id")
    ]
    asks = asks_of(row.pk for row in rows)
    rows = [row._replace(asks=asks.get(row.pk)) for row in rows]
    if shared is not None:
        shared.append(rows)
    _recent = (now, rows)
    return rows


_recent: tuple[float, list[Online]] | None = None
_pass: ContextVar[list[list[Online]] | None] = ContextVar("supply_pass", default=None)


@contextmanager
def one_pass() -> Iterator[None]:
    """Surveys inside read the online workers once: a scheduling pass over many waiting
    tasks costs one read of them, not one per task. What changes during the pass shows
    anyway where it matters: a fitting worker not given the job counts as busy."""
    token = _pass.set([])
    try:
        yield
    finally:
        _pass.reset(token)


def survey(
    need: Need,
    exclude: Collection[UUID] = (),
    taken: Collection[UUID] = (),
    *,
    owners: Collection[int] = (),
    max_age: float = 0.0,
) -> Survey:
    """Sort every online worker: free and fitting, or the first requirement it misses.

    ``exclude``: workers that hold the task, whose result on it was rejected or that lost it twice (never
    offered it again; one whose job expired may take it again); ``taken``:
    those just given it, left out (even if the list read earlier missed them); ``owners``:
    providers that hold a replica of it already or fell short of its bar (BARS_PROVIDER:
    their other nodes are not offered it).
    """
    result = Survey(need, taken=len(taken))
    for worker in online_workers(max_age):
        if worker.pk in taken:
            continue
        reason = misfit(worker, need)
        if reason is None and worker.pk in exclude:
            reason = TOOK_PART
        if reason is None and worker.owner_id in owners:
            reason = SAME_PROVIDER
        if reason is None:
            charge = need.charge(worker.asks)
            result.charges.append(charge)
            if need.bid is not None and charge > need.bid:
                reason = ASK
        if reason is None and worker.busy:
            reason = BUSY
            result.busy_at_bid += 1
        if reason is None:
            result.free.append(worker.pk)
        else:
            result.short[reason] += 1
        if reason in (None, BUSY):
            result.providers.add(worker.owner_id)
    return result


# --- The other way round: the waiting tasks, as one worker sees them --------------------

DEMAND_SAMPLE = 200  # waiting tasks looked at, oldest first (as many as a scheduling pass)


@dataclass
class Demand:
    """The tasks waiting for a worker, by whether one worker could take them."""

    waiting: int = 0
    fits: int = 0  # it could take them (once free, if busy)
    short: Counter[str] = field(default_factory=Counter)  # the others, by reason (REASONS)
    kinds: set[str] = field(default_factory=set)  # labels of the kinds it does not offer
    features: set[str] = field(default_factory=set)  # agent features it lacks
    memory_bytes: int = 0  # the worker's own memory, as the tasks it lacks memory for see it
    reputation: int = 0  # the worker's own reputation
    more: bool = False  # more tasks wait than the DEMAND_SAMPLE looked at
    highest_bid_under: int = 0  # the highest bid among the tasks its ask prices out

    def lines(self) -> list[str]:
        """One sentence per reason, for the provider: what would win it more work."""
        out = []
        if self.short[KIND]:
            kinds = ", ".join(sorted(self.kinds))
            some = "a kind" if len(self.kinds) == 1 else "kinds"
            out.append(f"{self.short[KIND]} {_are(self.short[KIND])} of {some} it does not offer ({kinds}).")
        if self.short[FEATURES]:
            out.append(
                f"{self.short[FEATURES]} {_need(self.short[FEATURES])} an agent supporting"
                f" {', '.join(sorted(self.features))}: update the agent on the node."
            )
        if self.short[MEMORY]:
            out.append(
                f"{self.short[MEMORY]} {_need(self.short[MEMORY])} more memory than its {memory(self.memory_bytes)}."
            )
        if self.short[REPUTATION]:
            out.append(
                f"{self.short[REPUTATION]} {_need(self.short[REPUTATION])} a reputation above its"
                f" {self.reputation}; verified results raise it."
            )
        if self.short[TOOK_PART]:
            out.append(
                f"It already has {self.short[TOOK_PART]} of them, had its result for them rejected, or lost them twice."
            )
        if self.short[ASK]:
            count = self.short[ASK]
            out.append(
                f"{count} {_bid(count)} less than it asks for {'it' if count == 1 else 'them'} (the highest bids"
                f" {format_credits(self.highest_bid_under)} credits, the platform's fee included): a lower ask"
                " would win them (docs/market.md)."
            )
        if self.short[SAME_PROVIDER]:
            count = self.short[SAME_PROVIDER]
            out.append(
                f"{count} {'has a replica' if count == 1 else 'have replicas'} on another of your nodes"
                " (or had one short of its quality bar): replicas go to different providers."
            )
        return out


def _are(count: int) -> str:
    return "is" if count == 1 else "are"


def _bid(count: int) -> str:
    return "bids" if count == 1 else "bid"


def _need(count: int) -> str:
    return "needs" if count == 1 else "need"


# A node may take back a task it lost once: a crash or a restart is forgiven, but /fail/'s
# reason is the node's own text, so a node that loses the same task again (on purpose or
# not) could otherwise spend all of the task's attempts alone.
RETAKES = 1


def not_offered_again(previous: Iterable[tuple[UUID, str]]) -> set[UUID]:
    """The workers a task is not offered to again, from (worker, state) of its jobs: those
    that hold it or whose result on it was rejected, and those that lost it (expired or
    gave it up) more than ``RETAKES`` times."""
    previous = list(previous)
    lost = Counter(worker for worker, state in previous if state == Assignment.State.EXPIRED)
    held = {worker for worker, state in previous if state != Assignment.State.EXPIRED}
    return held | {worker for worker, times in lost.items() if times > RETAKES}


def demand(worker: Worker) -> Demand:
    """The oldest waiting tasks (up to ``DEMAND_SAMPLE``), sorted by the first requirement
    ``worker`` misses; only counts and the worker's own figures, never whose tasks they are
    or what they ask beyond it. A task whose stored spec cannot be read is left out."""
    runnable = [name for name, kind in KINDS.items() if kind.available]
    tasks = list(
        lifecycle.needing_workers()
        .filter(kind__in=runnable)
        .order_by("opened_at")
        .only("kind", "spec", "min_reputation", "bid")[: DEMAND_SAMPLE + 1]
    )
    result = Demand(more=len(tasks) > DEMAND_SAMPLE)
    tasks = tasks[:DEMAND_SAMPLE]
    # A task this worker lost may come back to it once (not_offered_again).
    mine: dict[UUID, list[tuple[UUID, str]]] = {}
    for task_id, state in Assignment.objects.filter(worker=worker, task__in=[t.pk for t in tasks]).values_list(
        "task_id", "state"
    ):
        mine.setdefault(task_id, []).append((worker.pk, state))
    had = {task_id for task_id, jobs in mine.items() if not_offered_again(jobs)}
    # Replicas go to different providers: a task another of the owner's nodes holds a
    # replica of (or fell short of the bar of) is not this node's to take either.
    siblings = set(
        Assignment.objects.filter(BARS_PROVIDER, worker__owner_id=worker.owner_id, task__in=[t.pk for t in tasks])
        .exclude(worker=worker)
        .values_list("task_id", flat=True)
    )
    caps = worker.capabilities if isinstance(worker.capabilities, dict) else {}
    features = caps.get("features")
    offered = {f for f in features if isinstance(f, str)} if isinstance(features, list) else set()
    own_asks = asks_of([worker.pk]).get(worker.pk)
    for task in tasks:
        try:
            need = Need.of(task.kind, task.spec, task.min_reputation, bid=task.bid)
            reason = misfit(worker, need)
        except (KeyError, TypeError, ValueError):
            log.warning("task %s: its stored spec cannot be read; left out of demand", task.pk)
            continue
        result.waiting += 1
        if reason is None and task.pk in had:
            reason = TOOK_PART
        if reason is None and task.pk in siblings:
            reason = SAME_PROVIDER
        if reason is None and need.bid is not None and need.charge(own_asks) > need.bid:
            reason = ASK
            result.highest_bid_under = max(result.highest_bid_under, need.bid)
        if reason is None:
            result.fits += 1
            continue
        result.short[reason] += 1
        if reason == KIND:
            result.kinds.add(need.kind.label)
        elif reason == FEATURES:
            result.features |= need.features - offered
    try:
        result.memory_bytes = max(int(caps.get("gpu_memory_bytes") or 0), int(caps.get("ram_bytes") or 0))
    except (TypeError, ValueError):
        result.memory_bytes = 0
    result.reputation = worker.reputation
    return result
