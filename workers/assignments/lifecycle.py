"""A task's status while work is in hand, derived from its replicas.

A task with replication r is done when r replicas are accepted. Until then its status
says what its live replicas (offered, running, submitted) are doing, whatever order
they reach their states in: running when one runs, verifying when one waits for its
verdict and none runs, assigned when the live ones are only offered, open when none is
live. Every place that changes an assignment calls ``sync_status`` under the task's row
lock, so a replica verified while another still runs leaves the task running, never
open (where the last acceptance could not complete it).

Lock order, everywhere: the task row first (``marketplace.lifecycle.lock_task``, which
owns the task's row lock and every status move), then its assignment rows (``lock``), so
a cancellation or an expiry racing a node's call cannot deadlock with it.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from django.db import transaction
from django.db.models import Count, F, Q, QuerySet
from django.db.models.functions import Greatest
from django.utils import timezone

from config.celery import enqueue
from marketplace.lifecycle import lock_task, set_reason_locked, transition_locked
from marketplace.models import ACTIVE, IllegalTransition, Task, TaskStatus
from workers.assignments import uploads
from workers.assignments.control import LIVE_JOB, stop_on_commit
from workers.live.dashboard import worker_changed
from workers.models import UNSETTLED, Assignment, Worker

log = logging.getLogger(__name__)

LIVE = UNSETTLED
# Replicas that count toward the task's replication: live or already paid.
HELD = (*LIVE, Assignment.State.ACCEPTED)
FAIL_PENALTY = 3  # reputation points; going silent costs more (scheduler.EXPIRE_PENALTY)


def lock(assignment_id: Any, **match: Any) -> tuple[Assignment, Task]:
    """Lock an assignment's task row, then the assignment row (the one lock order).

    ``match`` narrows the assignment (``worker=…``); Assignment.DoesNotExist when none.
    """
    task_id = Assignment.objects.filter(pk=assignment_id, **match).values_list("task_id", flat=True).first()
    if task_id is None:
        raise Assignment.DoesNotExist(f"no assignment {assignment_id}")
    task = lock_task(task_id)
    if task is None:
        raise Task.DoesNotExist(f"no task {task_id}")
    assignment = Assignment.objects.select_for_update().select_related("worker").get(pk=assignment_id, **match)
    return assignment, task


def live_status(task: Task) -> str:
    """The active status the task's replicas call for (never a terminal one)."""
    states = set(Assignment.objects.filter(task=task, state__in=LIVE).values_list("state", flat=True))
    if Assignment.State.RUNNING in states:
        return TaskStatus.RUNNING
    if Assignment.State.SUBMITTED in states:
        return TaskStatus.VERIFYING
    if Assignment.State.OFFERED in states:
        return TaskStatus.ASSIGNED
    return TaskStatus.OPEN


def sync_status(task: Task, message: str, reason: str | None = "") -> None:
    """Move an active task to the status its replicas call for (task row locked).

    A terminal task stays as it is; an unchanged status only takes the new reason (a
    reason describes the status now, so an outdated one is cleared). ``reason=None``
    keeps the current one: a replica that starts or submits leaves as many in hand, so
    "1/2 replicas in hand. Waiting for a worker: …" still holds.
    """
    if task.status not in ACTIVE:
        return
    if reason is None:
        reason = task.status_reason
    target = live_status(task)
    if target == TaskStatus.OPEN and task.progress:
        # Progress is the share done of the run in hand: with none in hand (the last result
        # was rejected, or its worker dropped it) the task is back at the start.
        task.progress = 0.0
        task.save(update_fields=["progress"])
    if target != task.status:
        transition_locked(task, target, message, reason=reason)
    else:
        set_reason_locked(task, reason)


def missing_replicas(task: Task) -> int:
    """How many more workers the task needs now."""
    held = Assignment.objects.filter(task=task, state__in=HELD).count()
    return max(task.replication - held, 0)


def needing_workers() -> QuerySet[Task]:
    """Active tasks with fewer live or accepted replicas than their replication."""
    return (
        Task.objects.filter(status__in=ACTIVE)
        .annotate(held=Count("assignments", filter=Q(assignments__state__in=HELD)))
        .filter(held__lt=F("replication"))
    )


def fully_accepted() -> QuerySet[Task]:
    """Active tasks with as many accepted replicas as their replication (to complete)."""
    return (
        Task.objects.filter(status__in=ACTIVE)
        .annotate(accepted=Count("assignments", filter=Q(assignments__state=Assignment.State.ACCEPTED)))
        .filter(accepted__gte=F("replication"))
    )


def schedule_later(task_id: Any) -> None:
    """Queue a scheduling pass for the task (on the control queue); call it on commit."""
    enqueue("workers.schedule_task", str(task_id))


def penalise(worker_id: Any, points: int) -> None:
    """Take reputation points from a worker, never below zero (one clamped update)."""
    Worker.objects.filter(pk=worker_id).update(reputation=Greatest(F("reputation") - points, 0))


def end_live_assignments(task: Task, reason: str) -> int:
    """Expire the task's offered and running jobs, without penalty: the task ended, not
    the worker. Refuses (IllegalTransition) while a replica's result awaits its verdict,
    since that result may still be paid from the escrow. Task row locked; returns how
    many jobs ended. Each job's node is told to stop it after commit (``workers.assignments.control``).
    """
    if Assignment.objects.filter(task=task, state=Assignment.State.SUBMITTED).exists():
        raise IllegalTransition(
            task.status,
            TaskStatus.CANCELLED,
            "A worker's result for this task is being verified; it can be cancelled once that is settled.",
        )
    ended = list(
        Assignment.objects.select_for_update()
        .filter(task=task, state__in=[Assignment.State.OFFERED, Assignment.State.RUNNING])
        .values_list("pk", "worker_id")
    )
    if ended:
        Assignment.objects.filter(pk__in=[pk for pk, _ in ended]).update(
            state=Assignment.State.EXPIRED, settled_at=timezone.now(), reason=reason[:300]
        )
    for pk, worker_id in ended:
        stop_on_commit(worker_id, pk, reason[:300])
        transaction.on_commit(partial(uploads.discard, pk))
        transaction.on_commit(partial(worker_changed, worker_id))
    return len(ended)


def on_task_cancelling(sender: Any, task: Task, **kwargs: Any) -> None:
    """marketplace.signals.task_cancelling: the requester cancels; end the jobs first."""
    end_live_assignments(task, "The requester cancelled the task.")


def end_worker_jobs(worker: Worker, target: str, *, by_platform: bool) -> int:
    """End a just suspended or retired worker's live jobs at once, and stop them on its node.

    An operator's action (``by_platform``) costs the worker nothing, and the requester's
    timeline says an operator did it. The owner's own suspension or retirement is the
    owner giving the job up: it costs the reported give-up's ``FAIL_PENALTY``, not the
    heavier penalty of a node that went silent. Each job ends in its own transaction,
    under its task's and its own row lock (lifecycle's lock order); the worker's row is
    not held, so this runs after the state change committed. One that fails is left to
    the scheduler's periodic expiry, which ends it on the same terms (``suspension_terms``).
    Returns how many jobs ended.
    """
    reason, message, penalty = _terms(worker, target, by_platform=by_platform)
    ended = 0
    for pk in Assignment.objects.filter(worker=worker, state__in=LIVE_JOB).values_list("pk", flat=True):
        try:
            ended += _end(pk, worker, reason, message, penalty)
        except Exception:
            log.exception("could not end assignment %s of %s now; the periodic expiry will", pk, worker.pk)
    return ended


def _terms(worker: Worker, target: str, *, by_platform: bool) -> tuple[str, str, int]:
    """(the job's reason, the task timeline's message, the reputation it costs) for a job
    ended because its worker was suspended or retired (see ``end_worker_jobs``)."""
    verb = "retired" if target == Worker.State.RETIRED else "suspended"
    if by_platform:
        return (
            f"An operator {verb} the worker.",
            f"An operator {verb} the worker running this job; reassigning.",
            0,
        )
    return f"The worker's owner {verb} it.", f"The owner of {worker.name} {verb} it; reassigning.", FAIL_PENALTY


def suspension_terms(worker: Worker) -> tuple[str, str, int]:
    """``end_worker_jobs``'s terms for a job of a suspended or retired worker that the
    periodic expiry reaches first (between the state's commit and the jobs' end, or after
    that end failed): an operator's suspension (``held_by_platform``) still costs nothing.
    A retirement does not record who made it, and costs nothing here."""
    if worker.state == Worker.State.RETIRED:
        return "The worker was retired.", f"{worker.name} was retired; reassigning.", 0
    return _terms(worker, worker.state, by_platform=worker.held_by_platform)


def _end(assignment_id: Any, worker: Worker, reason: str, message: str, penalty: int) -> int:
    with transaction.atomic():
        assignment, task = lock(assignment_id, worker=worker)
        if assignment.state not in LIVE_JOB:
            return 0
        assignment.state = Assignment.State.EXPIRED
        assignment.settled_at = timezone.now()
        assignment.reason = reason
        assignment.save(update_fields=["state", "settled_at", "reason"])
        if penalty:
            penalise(worker.pk, penalty)
        sync_status(task, message)
        stop_on_commit(worker.pk, assignment.pk, reason)
        transaction.on_commit(partial(schedule_later, task.pk))
        transaction.on_commit(partial(worker_changed, worker.pk))
        transaction.on_commit(partial(uploads.discard, assignment.pk))
    return 1
