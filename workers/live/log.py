"""A job's log: every line its node sends, the newest ``LOG_KEEP`` of them kept.

Lines reach ``append`` from the node's socket (``workers.api.node_socket``), already cut to
``LOG_LINE_CHARS`` characters, so one job's stored log never holds more than
``LOG_KEEP`` × ``LOG_LINE_CHARS`` characters (5,000,000) however much a node sends; older
lines are deleted as newer ones come. Each line is a ``LogLine`` numbered from 1; the job's
``log_count`` is the number of its last line, so a reader pages with ``after``. The last
``LOG_TAIL`` lines are also kept on the job's row (``log_tail``), which the task page draws
first and merges with on every reconnect.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.db import transaction

from marketplace.models import Task
from workers.models import Assignment, LogLine

LOG_KEEP = 10_000  # lines kept per job
LOG_LINE_CHARS = 500  # characters per line; the rest is cut
LOG_TAIL = 200  # lines on the job's row
PAGE_LINES = 2_000  # the most lines one read returns
HEADER_MARK = "# "  # how log.txt's line naming a job begins; no node's line begins so


def append(assignment_id: str, lines: list[str], *, once: bool = False) -> bool:
    """Store ``lines`` as the job's next lines; True when they were stored.

    With ``once``, a line already in the job's tail is not stored again (the platform's own
    stop line). The job's row is locked for the read-modify-write, so two writers (another
    web process holding a socket of the same node) cannot lose or renumber each other's lines.
    """
    sent = len(lines)
    lines = [line[:LOG_LINE_CHARS] for line in lines[-LOG_KEEP:]]
    if not lines:
        return False
    with transaction.atomic():
        row = Assignment.objects.select_for_update().filter(pk=assignment_id).values("log_tail", "log_count").first()
        if row is None:
            return False
        tail = list(row["log_tail"]) if isinstance(row["log_tail"], list) else []
        if once and any(line in tail for line in lines):
            return False
        count = row["log_count"] + sent  # lines past LOG_KEEP in one call are counted, not stored
        first = count - len(lines) + 1
        LogLine.objects.bulk_create(
            LogLine(assignment_id=assignment_id, number=first + i, text=line) for i, line in enumerate(lines)
        )
        LogLine.objects.filter(assignment_id=assignment_id, number__lte=count - LOG_KEEP).delete()
        Assignment.objects.filter(pk=assignment_id).update(log_tail=(tail + lines)[-LOG_TAIL:], log_count=count)
        return True


def page(assignment: Assignment, after: int, limit: int = PAGE_LINES) -> dict[str, Any]:
    """The job's stored lines numbered after ``after``, oldest first, at most ``limit``.

    ``first`` is the number of the oldest line still kept (older ones were dropped past
    ``LOG_KEEP``), ``count`` the number of the last line, ``next`` the ``after`` of the next
    page (None when this one reaches the end).
    """
    limit = max(1, min(limit, PAGE_LINES))
    rows = list(
        LogLine.objects.filter(assignment=assignment, number__gt=after)
        .order_by("number")
        .values_list("number", "text")[: limit + 1]
    )
    more = len(rows) > limit
    rows = rows[:limit]
    count = assignment.log_count
    return {
        "assignment_id": str(assignment.pk),
        "worker": assignment.worker.name,
        "attempt": assignment.attempt,
        "first": max(1, count - LOG_KEEP + 1) if count else 0,
        "count": count,
        "lines": [[number, text] for number, text in rows],
        "next": rows[-1][0] if more else None,
    }


def text_lines(task: Task) -> Iterator[str]:
    """The task's whole stored log as text lines: each job's lines under a header naming
    its worker and attempt, oldest job first. Read in chunks, never all at once."""
    jobs = Assignment.objects.filter(task=task).select_related("worker").order_by("created_at")
    for job in jobs:
        dropped = max(0, job.log_count - LOG_KEEP)
        yield f"{HEADER_MARK}{job.worker.name}, attempt {job.attempt} ({job.log_count} lines"
        yield f", the first {dropped} not kept)\n" if dropped else ")\n"
        for text in (
            LogLine.objects.filter(assignment=job).order_by("number").values_list("text", flat=True).iterator(1000)
        ):
            yield text + "\n"
