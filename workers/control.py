"""The platform controls a node's running job: a job that ends without the node tells it.

Whenever a live job (offered or running) ends other than by its node's own submit or
failure report (the task was cancelled or failed, the job's deadline passed or its node
went silent, the worker was suspended or retired), the platform sends that node a
``stop`` naming the assignment and the reason, after commit, over the node's
authenticated ``/ws/worker/`` socket (the channel-layer group ``workers.events.worker_group``,
which only the worker's own sockets join). ``stop_on_commit`` is the one place that sends it.

A stop cannot be lost with a socket that was down: the consumer answers the node's next
heartbeat, progress or log line about an assignment that ended this way with the same
``stop`` (``workers.consumers``). See docs/job-control.md.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from django.db import transaction
from django.utils import timezone

from config.events import send_event
from workers import uploads
from workers.dashboard import worker_changed
from workers.events import StopEvent, worker_group
from workers.models import Assignment, Worker

log = logging.getLogger(__name__)

LIVE_JOB = (Assignment.State.OFFERED, Assignment.State.RUNNING)
# The reason ``workers.jobs.fail`` records: a job its own node gave up is not stopped.
GAVE_UP = "The worker gave up: "


def ended_by_platform(state: str, reason: str) -> bool:
    """Whether an assignment in ``state`` with ``reason`` is a job the platform ended
    without its node (a stop's subject), rather than one its node submitted or gave up."""
    return state == Assignment.State.EXPIRED and not reason.startswith(GAVE_UP)


def send_stop(worker_id: Any, assignment_id: Any, reason: str) -> None:
    """Tell the worker's open sockets to stop one job (best effort: see the module docstring)."""
    event = StopEvent(type="worker.stop", assignment_id=str(assignment_id), reason=reason[:300])
    send_event(worker_group(worker_id), event)


def stop_on_commit(worker_id: Any, assignment_id: Any, reason: str) -> None:
    """Send the job's node its ``stop`` once the transaction that ended the job commits."""
    transaction.on_commit(partial(send_stop, worker_id, assignment_id, reason))


def end_worker_jobs(worker: Worker, target: str, *, by_platform: bool) -> int:
    """End a just suspended or retired worker's live jobs at once, and stop them on its node.

    An operator's action (``by_platform``) costs the worker nothing, and the requester's
    timeline says an operator did it. The owner's own suspension or retirement is the
    owner giving the job up: it costs the reported give-up's ``FAIL_PENALTY``, not the
    heavier penalty of a node that went silent. Each job ends in its own transaction,
    under its task's and its own row lock (taskstate's lock order); the worker's row is
    not held, so this runs after the state change committed. One that fails is left to
    the scheduler's periodic expiry (which also ends a suspended worker's jobs).
    Returns how many jobs ended.
    """
    from workers.jobs import FAIL_PENALTY  # jobs and taskstate import this module

    verb = "retired" if target == Worker.State.RETIRED else "suspended"
    if by_platform:
        reason = f"An operator {verb} the worker."
        message = f"An operator {verb} the worker running this job; reassigning."
        penalty = 0
    else:
        reason = f"The worker's owner {verb} it."
        message = f"The owner of {worker.name} {verb} it; reassigning."
        penalty = FAIL_PENALTY
    ended = 0
    for pk in Assignment.objects.filter(worker=worker, state__in=LIVE_JOB).values_list("pk", flat=True):
        try:
            ended += _end(pk, worker, reason, message, penalty)
        except Exception:
            log.exception("could not end assignment %s of %s now; the periodic expiry will", pk, worker.pk)
    return ended


def _end(assignment_id: Any, worker: Worker, reason: str, message: str, penalty: int) -> int:
    from workers import taskstate

    with transaction.atomic():
        assignment, task = taskstate.lock(assignment_id, worker=worker)
        if assignment.state not in LIVE_JOB:
            return 0
        assignment.state = Assignment.State.EXPIRED
        assignment.settled_at = timezone.now()
        assignment.reason = reason
        assignment.save(update_fields=["state", "settled_at", "reason"])
        if penalty:
            taskstate.penalise(worker.pk, penalty)
        taskstate.sync_status(task, message)
        stop_on_commit(worker.pk, assignment.pk, reason)
        transaction.on_commit(partial(taskstate.schedule_later, task.pk))
        transaction.on_commit(partial(worker_changed, worker.pk))
        transaction.on_commit(partial(uploads.discard, assignment.pk))
    return 1
