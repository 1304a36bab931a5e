"""The live state of a task page: its jobs' progress, chart history and log tail, built the
same for the first render (``marketplace.work``) and for ``live.json`` on every reconnect."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from marketplace.models import Task
from workers.models import Assignment

# A healthy node beats every 10 s and its beat is stored at most every 5 s: older than
# this, the task page says when the worker was last heard from.
SILENT_AFTER_SECONDS = 25


def assignment_live_state(assignment: Assignment) -> dict[str, Any]:
    """What the task page needs to draw one assignment: progress, chart history, log tail,
    and when its worker was last heard from (a heartbeat or a progress report)."""
    heard = [at for at in (assignment.worker.last_heartbeat_at, assignment.last_progress_at) if at is not None]
    return {
        "id": str(assignment.pk),
        "worker": assignment.worker.name,
        "attempt": assignment.attempt,
        "state": assignment.state,
        "state_label": assignment.get_state_display(),
        "progress": assignment.progress,
        "metrics": assignment.metrics if isinstance(assignment.metrics, dict) else {},
        "history": assignment.history if isinstance(assignment.history, list) else [],
        "log_tail": assignment.log_tail if isinstance(assignment.log_tail, list) else [],
        # The number of the tail's last line: the page reads the lines before its tail
        # from log.json (``workers.live.log``).
        "log_count": assignment.log_count,
        "heard_at": max(heard).isoformat(timespec="milliseconds") if heard else None,
    }


def task_live_state(task: Task) -> dict[str, Any]:
    """The live part of a task page, the same on first render and on every reconnect."""
    assignments = Assignment.objects.filter(task=task).select_related("worker").order_by("created_at")
    return {
        "task_id": str(task.pk),
        "status": task.status,
        "progress": task.progress,
        "assignments": [assignment_live_state(a) for a in assignments],
        # The page counts a worker's silence on the server's clock, not the browser's.
        "now": timezone.now().isoformat(timespec="milliseconds"),
        # A live worker is heard from at least every heartbeat (the agent's 10 s, stored at
        # most every 5 s): past this the page says how long it has been silent.
        "silent_after": SILENT_AFTER_SECONDS,
    }
