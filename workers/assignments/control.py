"""The platform controls a node's running job: a job that ends without the node tells it.

Whenever a live job (offered or running) ends other than by its node's own submit or
failure report (the task was cancelled or failed, the job's deadline passed or its node
went silent, the worker was suspended or retired), the platform sends that node a
``stop`` naming the assignment and the reason, after commit, over the node's
authenticated ``/ws/worker/`` socket (the channel-layer group ``workers.live.events.worker_group``,
which only the worker's own sockets join). ``stop_on_commit`` is the one place that sends it.

A stop cannot be lost with a socket that was down: the consumer answers the node's next
heartbeat, progress or log line about an assignment that ended this way with the same
``stop`` (``workers.api.node_socket``). See docs/job-control.md.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from django.db import transaction

from config.events import send_event
from workers.live.events import StopEvent, worker_group
from workers.models import Assignment

LIVE_JOB = (Assignment.State.OFFERED, Assignment.State.RUNNING)
# The reason ``workers.assignments.jobs.fail`` records: a job its own node gave up is not stopped.
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
