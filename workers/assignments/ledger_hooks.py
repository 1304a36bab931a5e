"""The answer the ledger asks of the workers app: may this SUBMIT_RESULT be admitted?"""

from __future__ import annotations

from uuid import UUID

from workers.models import Assignment


def check_assignment(task_id: UUID, worker_address: str) -> str | None:
    """None when (task, worker) has a submitted, unsettled assignment; else a refusal code."""
    states = list(
        Assignment.objects.filter(task_id=task_id, worker__address=worker_address).values_list("state", flat=True)
    )
    if not states:
        return "no_assignment"
    if Assignment.State.SUBMITTED in states:
        return None
    return "assignment_settled"
