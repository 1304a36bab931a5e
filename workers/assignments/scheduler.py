"""Matching open tasks to online workers and handing out assignments.

The scheduler runs on the trusted ``platform`` queue: when a task opens (on commit of
post_task), periodically for tasks still waiting, and when a job comes back. It never
trusts what a worker says about itself beyond the capabilities it registered.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from datetime import datetime, timedelta
from functools import partial
from uuid import UUID

from django.conf import settings
from django.db import transaction
from django.db.models import Max, Q
from django.utils import timezone

from ledger import services as ledger
from ledger.models import Block
from ledger.units import format_credits
from marketplace import pricing
from marketplace.kinds import KINDS
from marketplace.lifecycle import fail_locked, lock_task, set_reason_locked
from marketplace.models import ACTIVE, Task
from workers.assignments import heldout, lifecycle, nodebroker, supply, uploads
from workers.assignments.control import stop_on_commit
from workers.live.dashboard import worker_changed
from workers.market import asks as market_asks
from workers.models import BARS_PROVIDER, REPLICA_HELD, UNSETTLED, Assignment, Shortfall, Worker, online_cutoff

log = logging.getLogger(__name__)

GENESIS_SEED = "0" * 64
EXPIRE_PENALTY = 5  # reputation points lost when a job expires in a worker's hands


def latest_block_hash() -> str:
    """Seed material: the newest sealed block's hash (unknowable before it was sealed)."""
    return Block.objects.order_by("-height").values_list("hash", flat=True).first() or GENESIS_SEED


def eligible_workers(task: Task, exclude: set[UUID], owners: Collection[int] = ()) -> list[Worker]:
    """Online, active, free workers whose registered capabilities fit the task and whose
    ask for it fits its bid, none of them in ``exclude`` or of a provider in ``owners``;
    cheapest first, then by reputation and verified benchmark (``workers.market``)."""
    return priced_workers(task, exclude, owners)[0]


def priced_workers(
    task: Task, exclude: set[UUID], owners: Collection[int] = (), only: Collection[UUID] | None = None
) -> tuple[list[Worker], dict[UUID, int]]:
    """``eligible_workers`` (among ``only``, when given), and what the job would pay each
    of them (its ask for the task).

    The same check as ``supply.survey``, with what SQL can filter filtered there: this runs
    for every task scheduled, the survey only for one that waits.
    """
    need = supply.Need.of(task.kind, task.spec, task.min_reputation)
    pool = Worker.objects.online() if only is None else Worker.objects.online().filter(pk__in=list(only))
    candidates = list(
        pool.filter(reputation__gte=task.min_reputation)
        .exclude(pk__in=exclude)
        .exclude(owner_id__in=owners)
        # One unsettled job per worker: its SUBMIT_RESULT nonce is then always the next one.
        .exclude(assignments__state__in=UNSETTLED)
    )
    limit = pricing.largest_price_under(task.bid)
    asks = market_asks.asks_of(w.pk for w in candidates)
    tflop = KINDS[task.kind].tflop(task.spec)
    prices = {}
    for worker in candidates:
        if supply.misfit(worker, need) is None:
            price = market_asks.ask_for(asks.get(worker.pk), task.kind).price(tflop)
            if price <= limit:
                prices[worker.pk] = price
    fitting = [w for w in candidates if w.pk in prices]
    fitting.sort(key=lambda w: (prices[w.pk], -w.reputation, -(w.benchmark_gflops or 0.0), str(w.pk)))
    return fitting, prices


def newcomers_first(candidates: list[Worker], earlier: Collection[tuple[UUID, int]]) -> list[Worker]:
    """The candidates with other providers' nodes first, then the other nodes of providers
    whose node lost the task, then the nodes that lost it themselves; best first within each.

    ``earlier``: (worker, owner) of the task's expired jobs. A node whose job expired or
    that gave it up (it died, restarted, ran out of memory) may take the task again once
    (``supply.RETAKES``), one more of its attempts, and only when no fresher node can take it now.
    """
    nodes = {worker for worker, _ in earlier}
    providers = {owner for _, owner in earlier}
    return sorted(candidates, key=lambda w: (w.owner_id in providers, w.pk in nodes))


def waiting_reason(task: Task, exclude: set[UUID], taken: set[UUID], owners: set[int]) -> str:
    """Why the task waits: the online workers besides ``taken`` (just given the task), by
    the first requirement each one misses."""
    need = supply.Need.of(task.kind, task.spec, task.min_reputation, bid=task.bid)
    return supply.survey(need, exclude, taken, owners=owners).reason()


def _lock_free_workers(candidates: list[Worker], wanted: int) -> list[Worker]:
    """Up to ``wanted`` of the candidates, each row locked and re-checked free.

    Two tasks scheduled at once (each under its own task lock) could otherwise both offer
    a job to the same idle worker, and hand out one SUBMIT_RESULT nonce twice; a sweep of
    the worker's earnings (workers/assignments/sweep.py) takes the same row lock. A row another
    transaction holds is skipped, not waited for (PostgreSQL; SQLite serialises writers).
    """
    chosen: list[Worker] = []
    for candidate in candidates:
        if len(chosen) >= wanted:
            break
        if any(w.owner_id == candidate.owner_id for w in chosen):
            continue  # replicas go to different providers
        row = Worker.objects.select_for_update(skip_locked=True).filter(pk=candidate.pk).first()
        if row is None or Assignment.objects.filter(worker=row, state__in=UNSETTLED).exists():
            continue
        chosen.append(row)
    return chosen


def schedule(task_id: UUID, chosen: Sequence[UUID] | None = None) -> list[Assignment]:
    """Give a task to as many eligible workers as its replication still needs (with
    ``chosen``: only those of them, in that order, as a market pass matched them).

    Locks the task row; creates assignments and syncs the task's status in one
    transaction; the Celery messages to the workers' queues go out after commit. A kind
    with a held-out split has it prepared first, outside the transaction. A task whose
    attempts are used up fails with a refund, once no replica's result awaits a verdict.
    """
    if not heldout.ensure_prepared(task_id):
        return []
    with transaction.atomic():
        task = lock_task(task_id)
        if task is None or task.status not in ACTIVE or not KINDS[task.kind].available:
            return []
        previous = list(Assignment.objects.filter(task=task).values_list("worker_id", "worker__owner_id", "state"))
        failed_attempts = sum(
            1 for _, _, state in previous if state in (Assignment.State.REJECTED, Assignment.State.EXPIRED)
        )
        if failed_attempts >= task.max_attempts * task.replication:
            if any(state == Assignment.State.SUBMITTED for _, _, state in previous):
                return []  # a result still awaits its verdict, which may pay; decide after it
            lifecycle.end_live_assignments(task, "The task failed: its other attempts were used up.")
            failed = _ATTEMPTS_FAILED.format(attempts=failed_attempts, refund=_refund_words(task))
            fail_locked(task, failed[:300], reason=failed)
            return []
        missing = lifecycle.missing_replicas(task)
        if missing <= 0:
            return []
        debt = ledger.owed(task.owner)
        if debt:
            # Its escrow is what is left of credits a refund or dispute took back: no new
            # job spends it (on a node of the requester's other account, say) until paid.
            set_reason_locked(task, _OWES.format(debt=format_credits(debt)))
            return []
        # A node that holds the task, or whose result on it was rejected, is not offered it
        # again; one whose job expired may be once, after every fresher node (newcomers_first).
        exclude = supply.not_offered_again((worker, state) for worker, _, state in previous)
        expired = [(worker, owner) for worker, owner, state in previous if state == Assignment.State.EXPIRED]
        # Replicas are computed by different providers: one that holds a live or accepted
        # replica is not given another (a trained model's result depends only on the spec and
        # the data, so one provider's nodes could compute once and submit it r times), nor
        # one whose result fell short of the task's bar (BARS_PROVIDER).
        owners = set(Assignment.objects.filter(BARS_PROVIDER, task=task).values_list("worker__owner_id", flat=True))
        priced, prices = priced_workers(task, exclude, owners, only=chosen)
        candidates = newcomers_first(priced, expired)
        if chosen is not None:
            by_id = {w.pk: w for w in candidates}
            candidates = [by_id[pk] for pk in chosen if pk in by_id]
        workers = _lock_free_workers(candidates, missing)
        short = missing - len(workers)
        taken = {w.pk for w in workers}
        reason = _short_reason(task, short, exclude, taken, owners | {w.owner_id for w in workers}) if short else ""
        if not workers:
            shortfall = _latest_shortfall(task)
            if shortfall is not None and _waited_out(shortfall):
                failed = _SHORTFALL_FAILED.format(minutes=_wait_minutes())
                fail_locked(task, failed, reason=failed)
                return []
            # A shortfall gives up sooner, and its note says when.
            note = _SHORTFALL_NOTE.format(minutes=_wait_minutes(), why=_why(shortfall)) if shortfall else ""
            set_reason_locked(task, note + reason + ("" if shortfall else _give_up_note(task)))
            return []
        seed = latest_block_hash()
        deadline = timezone.now() + timedelta(seconds=settings.ASSIGNMENT_DEADLINE)
        created = [
            Assignment.objects.create(
                task=task,
                worker=w,
                attempt=failed_attempts + 1,
                seed_block_hash=seed,
                deadline=deadline,
                price=prices[w.pk],
            )
            for w in workers
        ]
        names = ", ".join(w.name for w in workers)
        lifecycle.sync_status(task, f"Assigned to {names}.", reason=reason)
        for assignment in created:
            transaction.on_commit(partial(dispatch, assignment))
            transaction.on_commit(partial(worker_changed, assignment.worker_id))
    return created


_OWES = (
    "Waiting: the requester's account owes {debt} credits from a refunded or disputed purchase;"
    " no job is offered until the debt is paid."
)
_ATTEMPTS_FAILED = "Failed: all {attempts} of its attempts were used up (each rejected or expired). {refund}"


def _refund_words(task: Task) -> str:
    """How much of a failing task's escrow goes back: all of it unless a replica was paid."""
    if Assignment.objects.filter(task=task, state=Assignment.State.ACCEPTED).exists():
        return "The rest of its escrow, beyond the verified replicas' rewards, is refunded."
    return "Fully refunded."


# --- Giving up: a task no worker takes -------------------------------------------------


def waiting_since(task: Task) -> datetime | None:
    """Since when the task has waited for a worker with none of its jobs live: when it
    opened, or when its last job ended (expired, rejected or accepted), whichever is later.
    None while a job is offered, running or awaiting its verdict: that job's own deadline
    bounds the wait then."""
    jobs = Assignment.objects.filter(task=task)
    if jobs.filter(state__in=lifecycle.LIVE).exists():
        return None
    ended = jobs.aggregate(last=Max("settled_at"))["last"]
    opened = task.opened_at or task.created_at
    return max(opened, ended) if ended is not None else opened


def gives_up_at(task: Task) -> datetime | None:
    """When the waiting task fails with its refund if no worker takes it (None: a job is live)."""
    since = waiting_since(task)
    return None if since is None else since + timedelta(seconds=settings.TASK_MAX_WAIT)


def _give_up_note(task: Task) -> str:
    at = gives_up_at(task)
    if at is None:
        return ""
    return f" If no worker takes it by {at:%Y-%m-%d %H:%M} UTC, it fails with a full refund."


def give_up_waiting(now: datetime | None = None) -> int:
    """Periodic: fail, with the refund of its escrow, every active task short of workers
    that has waited ``TASK_MAX_WAIT`` with no live job (``waiting_since``), whatever kept
    it waiting: no fitting node, every one busy, a kind no provider runs, a held-out split
    that could not be prepared. Returns how many failed. Each is re-checked under its row
    lock; one failing row does not stop the others."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.TASK_MAX_WAIT)
    # Tasks with a live job or one ended since the cutoff are left out here, so the oldest
    # tasks still running cannot fill the batch and hide a waited-out one behind them.
    old = (
        lifecycle.needing_workers()
        .filter(Q(opened_at__lte=cutoff) | Q(opened_at__isnull=True, created_at__lte=cutoff))
        .exclude(assignments__state__in=lifecycle.LIVE)
        .exclude(assignments__settled_at__gt=cutoff)
    )
    failed = 0
    for task_id in list(old.order_by("opened_at").values_list("pk", flat=True)[:200]):
        try:
            failed += _give_up(task_id, now)
        except Exception:
            log.exception("could not give up waiting task %s now; the next pass tries again", task_id)
    return failed


def _give_up(task_id: UUID, now: datetime) -> int:
    with transaction.atomic():
        task = lock_task(task_id)
        if task is None or task.status not in ACTIVE:
            return 0
        at = gives_up_at(task)
        if at is None or at > now or lifecycle.missing_replicas(task) <= 0:
            return 0
        failed = (
            f"Failed: no worker took it within {_duration(settings.TASK_MAX_WAIT)}. {_refund_words(task)}"
            f" {_why_waiting(task)}"
        ).strip()
        fail_locked(task, failed[:300], reason=failed[:1000])
    log.info("task %s waited %s for a worker; failed and refunded", task_id, _duration(settings.TASK_MAX_WAIT))
    return 1


def _why_waiting(task: Task) -> str:
    """The waiting reason as it stands now, for a task that gives up."""
    kind = KINDS.get(task.kind)
    if kind is None or not kind.available:
        return f"No provider runs {kind.label if kind else task.kind} tasks."
    previous = Assignment.objects.filter(task=task)
    exclude = supply.not_offered_again(previous.values_list("worker_id", "state"))
    owners = set(previous.filter(BARS_PROVIDER).values_list("worker__owner_id", flat=True))
    try:
        return waiting_reason(task, exclude, set(), owners).replace("Waiting for a worker: ", "At the end, ", 1)
    except (KeyError, TypeError, ValueError):  # a stored spec the platform can no longer read
        return ""


def _duration(seconds: int) -> str:
    for unit, size in (("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            count = seconds // size
            return f"{count} {unit}{'' if count == 1 else 's'}"
    return f"{seconds} seconds"


def _short_reason(task: Task, short: int, exclude: set[UUID], taken: set[UUID], owners: set[int]) -> str:
    """Why the task still waits for ``short`` more workers (with how many it has, if any),
    ``taken`` of them having just been chosen."""
    held = task.replication - short
    reason = waiting_reason(task, exclude, taken, owners)
    return (f"{held}/{task.replication} replicas in hand. " if held else "") + reason


_SHORTFALL_FAILED = (
    "Failed: a result fell short of the task's quality bar and no other provider took the task"
    " within {minutes} minutes: the spec may make the bar unreachable. Fully refunded."
)
_SHORTFALL_NOTE = (
    "A result fell short of the task's quality bar ({why}), so its provider is not offered the task again;"
    " if no other provider takes it within {minutes} minutes, it fails with a full refund."
    " Cancelling also refunds it in full. "
)


def _why(shortfall: Assignment) -> str:
    """The verifier's reason for a result short of the bar, as a clause ("held-out top-1
    accuracy 0.3000 is below the required 0.5000")."""
    return shortfall.reason.rstrip(".") or "no reason recorded"


def _wait_minutes() -> int:
    return max(1, round(settings.SHORTFALL_WAIT / 60))


def _latest_shortfall(task: Task) -> Assignment | None:
    """The task's latest result rejected short of its bar, if no replica is accepted or live."""
    mine = Assignment.objects.filter(task=task)
    if mine.filter(state__in=REPLICA_HELD).exists():
        return None
    return (
        mine.filter(state=Assignment.State.REJECTED).exclude(shortfall=Shortfall.NONE).order_by("-settled_at").first()
    )


def _waited_out(shortfall: Assignment) -> bool:
    """No other provider has taken the task for ``SHORTFALL_WAIT`` seconds since ``shortfall``:
    the task's bar may be unreachable."""
    settled = shortfall.settled_at or timezone.now()
    return timezone.now() - settled >= timedelta(seconds=settings.SHORTFALL_WAIT)


def dispatch(assignment: Assignment) -> None:
    """Send the job to the worker's own queue on the node broker: JSON, the assignment id only.

    A broker that cannot take it is logged, not raised (one failed send must not stop the
    others of a scheduling pass): its nodes lose their connection too, stop looking online
    and their offered jobs expire as a silent worker's do, to be offered again.
    """
    try:
        nodebroker.publish_job(assignment.worker.address, str(assignment.pk))
    except nodebroker.PUBLISH_ERRORS:
        log.exception("job %s could not be sent to %s", assignment.pk, assignment.worker.queue)


def open_tasks_waiting() -> list[UUID]:
    """Tasks of runnable kinds still short of workers, highest bid first, then oldest:
    candidates for another scheduling pass (open ones, and those whose other replicas are
    in hand)."""
    runnable = [name for name, kind in KINDS.items() if kind.available]
    return list(
        lifecycle.needing_workers()
        .filter(kind__in=runnable)
        .order_by("-bid", "opened_at")
        .values_list("pk", flat=True)[:200]
    )


def expire_overdue() -> int:
    """Expire assignments past their deadline or whose worker went silent; reopen the task.

    Returns how many were expired. Each is expired under its task's and its own row lock
    (lifecycle's lock order), re-checked, so a result that arrives at the same moment
    either wins cleanly or is refused. One failing row does not stop the others.
    """
    now = timezone.now()
    silent = online_cutoff(now)
    live = [Assignment.State.OFFERED, Assignment.State.RUNNING]
    overdue = Assignment.objects.filter(state__in=live).filter(
        Q(deadline__lt=now) | Q(worker__last_heartbeat_at__lt=silent) | Q(worker__state__in=["suspended", "retired"])
    )
    expired = 0
    for pk in list(overdue.values_list("pk", flat=True)):
        try:
            expired += _expire(pk, now, silent)
        except Exception:
            log.exception("could not expire assignment %s now; the next pass tries again", pk)
    return expired


def _expire(assignment_id: UUID, now: datetime, silent: datetime) -> int:
    with transaction.atomic():
        assignment, task = lifecycle.lock(assignment_id)
        worker = assignment.worker
        still_overdue = assignment.state in (Assignment.State.OFFERED, Assignment.State.RUNNING) and (
            assignment.deadline < now
            or worker.state in ("suspended", "retired")
            or (worker.last_heartbeat_at is not None and worker.last_heartbeat_at < silent)
        )
        if not still_overdue:
            return 0
        reason, message, penalty = (
            "Deadline passed or the worker went silent.",
            f"{worker.name} went silent; reassigning.",
            EXPIRE_PENALTY,
        )
        if worker.state in ("suspended", "retired"):
            # Its suspension or retirement ends the job, on its terms (an operator's is free).
            reason, message, penalty = lifecycle.suspension_terms(worker)
        assignment.state = Assignment.State.EXPIRED
        assignment.settled_at = now
        assignment.reason = reason
        assignment.save(update_fields=["state", "settled_at", "reason"])
        if penalty:
            lifecycle.penalise(worker.pk, penalty)
        lifecycle.sync_status(task, message)
        stop_on_commit(worker.pk, assignment.pk, assignment.reason)
        transaction.on_commit(partial(lifecycle.schedule_later, task.pk))
        transaction.on_commit(partial(worker_changed, worker.pk))
        transaction.on_commit(partial(uploads.discard, assignment.pk))
    return 1
