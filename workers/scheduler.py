"""Matching open tasks to online workers and handing out assignments.

The scheduler runs on the trusted ``platform`` queue: when a task opens (on commit of
post_task), periodically for tasks still waiting, and when a job comes back. It never
trusts what a worker says about itself beyond the capabilities it registered.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from datetime import datetime, timedelta
from functools import partial
from uuid import UUID

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from marketplace.kinds import KINDS
from marketplace.models import ACTIVE, Task, TaskStatus
from marketplace.services import set_reason_locked, transition_locked
from workers import heldout, nodebroker, supply, taskstate, uploads
from workers.dashboard import worker_changed
from workers.models import BARS_PROVIDER, REPLICA_HELD, UNSETTLED, Assignment, Shortfall, Worker

log = logging.getLogger(__name__)

GENESIS_SEED = "0" * 64
EXPIRE_PENALTY = 5  # reputation points lost when a job expires in a worker's hands


def latest_block_hash() -> str:
    """Seed material: the newest sealed block's hash (unknowable before it was sealed)."""
    from ledger.models import Block

    return Block.objects.order_by("-height").values_list("hash", flat=True).first() or GENESIS_SEED


def eligible_workers(task: Task, exclude: set[UUID], owners: Collection[int] = ()) -> list[Worker]:
    """Online, active, free workers whose registered capabilities fit the task, best first,
    none of them in ``exclude`` or of a provider in ``owners``.

    The same check as ``supply.survey``, with what SQL can filter filtered there: this runs
    for every task scheduled, the survey only for one that waits.
    """
    need = supply.Need.of(task.kind, task.spec, task.min_reputation)
    candidates = (
        Worker.objects.online()
        .filter(reputation__gte=task.min_reputation)
        .exclude(pk__in=exclude)
        .exclude(owner_id__in=owners)
        # One unsettled job per worker: its SUBMIT_RESULT nonce is then always the next one.
        .exclude(assignments__state__in=UNSETTLED)
        .order_by("-reputation", "last_heartbeat_at")
    )
    return [worker for worker in candidates if supply.misfit(worker, need) is None]


def waiting_reason(task: Task, exclude: set[UUID], taken: set[UUID], owners: set[int]) -> str:
    """Why the task waits: the online workers besides ``taken`` (just given the task), by
    the first requirement each one misses."""
    need = supply.Need.of(task.kind, task.spec, task.min_reputation)
    return supply.survey(need, exclude, taken, owners=owners).reason()


def _lock_free_workers(candidates: list[Worker], wanted: int) -> list[Worker]:
    """Up to ``wanted`` of the candidates, each row locked and re-checked free.

    Two tasks scheduled at once (each under its own task lock) could otherwise both offer
    a job to the same idle worker, and hand out one SUBMIT_RESULT nonce twice; a sweep of
    the worker's earnings (workers/sweep.py) takes the same row lock. A row another
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


def schedule(task_id: UUID) -> list[Assignment]:
    """Give a task to as many eligible workers as its replication still needs.

    Locks the task row; creates assignments and syncs the task's status in one
    transaction; the Celery messages to the workers' queues go out after commit. A kind
    with a held-out split has it prepared first, outside the transaction. A task whose
    attempts are used up fails with a refund, once no replica's result awaits a verdict.
    """
    if not heldout.ensure_prepared(task_id):
        return []
    with transaction.atomic():
        task = Task.objects.select_for_update().filter(pk=task_id).first()
        if task is None or task.status not in ACTIVE or not KINDS[task.kind].available:
            return []
        previous = list(Assignment.objects.filter(task=task).values_list("worker_id", "state"))
        failed_attempts = sum(
            1 for _, state in previous if state in (Assignment.State.REJECTED, Assignment.State.EXPIRED)
        )
        if failed_attempts >= task.max_attempts * task.replication:
            if any(state == Assignment.State.SUBMITTED for _, state in previous):
                return []  # a result still awaits its verdict, which may pay; decide after it
            taskstate.end_live_assignments(task, "The task failed: its other attempts were used up.")
            transition_locked(task, TaskStatus.FAILED, "Failed: every attempt was rejected or expired.")
            _after_failure(task)
            return []
        missing = taskstate.missing_replicas(task)
        if missing <= 0:
            return []
        exclude = {w for w, _ in previous}
        # Replicas are computed by different providers: one that holds a live or accepted
        # replica is not given another (a trained model's result depends only on the spec and
        # the data, so one provider's nodes could compute once and submit it r times), nor
        # one whose result fell short of the task's bar (BARS_PROVIDER).
        owners = set(Assignment.objects.filter(BARS_PROVIDER, task=task).values_list("worker__owner_id", flat=True))
        workers = _lock_free_workers(eligible_workers(task, exclude, owners), missing)
        short = missing - len(workers)
        taken = {w.pk for w in workers}
        reason = _short_reason(task, short, exclude, taken, owners | {w.owner_id for w in workers}) if short else ""
        if not workers:
            shortfall = _latest_shortfall(task)
            if shortfall is not None and _waited_out(shortfall):
                failed = _SHORTFALL_FAILED.format(minutes=_wait_minutes())
                transition_locked(task, TaskStatus.FAILED, failed, reason=failed)
                _after_failure(task)
                return []
            set_reason_locked(task, (_SHORTFALL_NOTE.format(minutes=_wait_minutes()) if shortfall else "") + reason)
            return []
        seed = latest_block_hash()
        deadline = timezone.now() + timedelta(seconds=settings.ASSIGNMENT_DEADLINE)
        created = [
            Assignment.objects.create(
                task=task, worker=w, attempt=failed_attempts + 1, seed_block_hash=seed, deadline=deadline
            )
            for w in workers
        ]
        names = ", ".join(w.name for w in workers)
        taskstate.sync_status(task, f"Assigned to {names}.", reason=reason)
        for assignment in created:
            transaction.on_commit(partial(dispatch, assignment))
            transaction.on_commit(partial(worker_changed, assignment.worker_id))
    return created


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
    "A result fell short of the task's quality bar, so its provider is not offered the task again;"
    " if no other provider takes it within {minutes} minutes, it fails with a full refund."
    " Cancelling also refunds it in full. "
)


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


def _after_failure(task: Task) -> None:
    """Refund a failed task's escrow (wired to ledger.services.refund)."""
    from workers.settlement import refund_task

    refund_task(task)


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
    """Tasks of runnable kinds still short of workers, oldest first: candidates for
    another scheduling pass (open ones, and those whose other replicas are in hand)."""
    runnable = [name for name, kind in KINDS.items() if kind.available]
    return list(
        taskstate.needing_workers().filter(kind__in=runnable).order_by("opened_at").values_list("pk", flat=True)[:200]
    )


def expire_overdue() -> int:
    """Expire assignments past their deadline or whose worker went silent; reopen the task.

    Returns how many were expired. Each is expired under its task's and its own row lock
    (taskstate's lock order), re-checked, so a result that arrives at the same moment
    either wins cleanly or is refused. One failing row does not stop the others.
    """
    now = timezone.now()
    silent = now - timedelta(seconds=settings.WORKER_HEARTBEAT_TIMEOUT)
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
        assignment, task = taskstate.lock(assignment_id)
        worker = assignment.worker
        still_overdue = assignment.state in (Assignment.State.OFFERED, Assignment.State.RUNNING) and (
            assignment.deadline < now
            or worker.state in ("suspended", "retired")
            or (worker.last_heartbeat_at is not None and worker.last_heartbeat_at < silent)
        )
        if not still_overdue:
            return 0
        assignment.state = Assignment.State.EXPIRED
        assignment.settled_at = now
        assignment.reason = "Deadline passed or the worker went silent."
        assignment.save(update_fields=["state", "settled_at", "reason"])
        taskstate.penalise(worker.pk, EXPIRE_PENALTY)
        taskstate.sync_status(task, f"{worker.name} went silent; reassigning.")
        transaction.on_commit(partial(taskstate.schedule_later, task.pk))
        transaction.on_commit(partial(worker_changed, worker.pk))
        transaction.on_commit(partial(uploads.discard, assignment.pk))
    return 1
