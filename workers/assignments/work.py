"""The workers app's answers to the marketplace's questions about a task's work
(``marketplace.work.TaskWork``) about its jobs, installed through ``workers.work``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings

from marketplace.models import Task
from workers.assignments import supply
from workers.assignments.jobs import ledger_trail, result_file, result_files
from workers.live.task_page import task_live_state as live_state
from workers.market.book import expected_run_seconds as expected_run
from workers.market.book import expected_wait
from workers.models import Assignment

__all__ = [
    "expected_run",
    "expected_wait",
    "ledger_trail",
    "live_state",
    "result_file",
    "result_files",
    "start_times",
    "survey",
]


def survey(kind: str, spec: dict[str, Any], min_reputation: int, bid: int | None = None) -> supply.Survey:
    """The online workers, by whether they could take a task of ``kind`` and ``spec`` now."""
    need = supply.Need.of(kind, spec, min_reputation, bid=bid)
    return supply.survey(need, max_age=settings.SUPPLY_SNAPSHOT_SECONDS)


def start_times(task: Task) -> list[datetime]:
    """When each of the task's jobs started."""
    starts = Assignment.objects.filter(task=task, started_at__isnull=False).values_list("started_at", flat=True)
    return [at for at in starts if at is not None]
