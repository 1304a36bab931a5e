"""A task's lifecycle: the one module that locks a task's row and changes its status.

Every status change goes through ``transition_locked``, which refuses (IllegalTransition,
changing nothing) a move the table ``marketplace.models.TRANSITIONS`` does not allow, records
it in the task's timeline and tells the task's page and its owner's dashboard after commit.
The moves that carry money do their escrow work here, in the caller's transaction: opening
locks the budget in escrow; cancelling, failing and completing refund what is left of it.

Lock order, everywhere: the task's row first (``lock_task``, ``lock_own_task``), then the
rows that hang from it (its assignments: ``workers.assignments.lifecycle.lock``), then
ledger accounts (in address order: ``ledger.services``). A cancellation, an expiry and a
node's call racing one another on PostgreSQL then wait for each other instead of
deadlocking. The workers app sits above this module and calls it to lock or move a
task; how a task's replicas set its active status is its own concern
(``workers.assignments.lifecycle.sync_status``).
"""

from __future__ import annotations

from datetime import timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from rest_framework.exceptions import NotFound, ValidationError

from config.celery import enqueue
from config.events import send_event
from ledger import services as ledger
from ledger.units import format_credits
from marketplace.events import DashboardTaskEvent, TaskStatusEvent, dashboard_group, task_group
from marketplace.kinds import get_kind
from marketplace.models import Task, TaskEvent, TaskStatus, User, check_transition
from marketplace.signals import task_cancelling

# --- The task's row lock ----------------------------------------------------------------


def lock_task(task_id: Any, *fields: str) -> Task | None:
    """The task's row, locked (select_for_update) until the caller's transaction ends;
    None when there is none. ``fields`` loads only those columns (the primary key always)."""
    rows = Task.objects.select_for_update().filter(pk=task_id)
    return (rows.only(*fields) if fields else rows).first()


def lock_own_task(owner: User, task_id: Any) -> Task:
    """One of owner's tasks, its row locked; another user's task is reported missing
    (DRF's NotFound)."""
    task = Task.objects.owned_by(owner).select_for_update().filter(pk=task_id).first()
    if task is None:
        raise NotFound("No such task.")
    return task


# --- Transitions (task row locked) ------------------------------------------------------


def transition_locked(task: Task, target: str, message: str, *, reason: str = "") -> None:
    """Move a task along the state machine and record it in the timeline.

    Expects the task row to be locked (``lock_task``) in the caller's transaction.
    Raises IllegalTransition, changing nothing, when the move is not allowed.
    """
    check_transition(task.status, target)
    now = timezone.now()
    task.status = target
    task.status_reason = reason
    fields = ["status", "status_reason", "updated_at"]
    if target == TaskStatus.RUNNING and task.started_at is None:
        task.started_at = now
        fields.append("started_at")
    if target in (TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED):
        task.finished_at = now
        fields.append("finished_at")
    task.save(update_fields=fields)
    TaskEvent.objects.create(task=task, at=now, status=target, message=message)
    event = TaskStatusEvent(
        type="task.status", task_id=str(task.pk), status=target, status_reason=reason, progress=task.progress
    )
    summary = DashboardTaskEvent(
        type="dashboard.task",
        task_id=str(task.pk),
        status=target,
        status_label=TaskStatus(target).label,
        progress=task.progress,
    )
    owner_id = task.owner_id

    def publish() -> None:
        send_event(task_group(task.pk), event)
        send_event(dashboard_group(owner_id), summary)

    transaction.on_commit(publish)


def set_reason_locked(task: Task, reason: str) -> None:
    """Say why the task is where it is now, its status unchanged (task row locked).

    The task's page hears of it like a status change, so a requester watching a waiting
    task reads the current reason (a worker came online, or went busy), not the first one.
    """
    if task.status_reason == reason:
        return
    task.status_reason = reason
    task.save(update_fields=["status_reason", "updated_at"])
    event = TaskStatusEvent(
        type="task.status", task_id=str(task.pk), status=task.status, status_reason=reason, progress=task.progress
    )
    transaction.on_commit(lambda: send_event(task_group(task.pk), event))


def open_locked(task: Task) -> None:
    """Move a locked draft to OPEN with its budget in escrow; schedule it after commit.

    Expects the caller's transaction and row lock. When the owner's account owes credits
    (a refunded or disputed purchase) or its available balance cannot cover the budget,
    raises a ValidationError naming ``budget`` and, with the caller's transaction rolled
    back, nothing is written.
    """
    kind = get_kind(task.kind)
    try:
        ledger.check_not_owing(task.owner, "open tasks")
    except ledger.Owes as exc:
        raise ValidationError({"budget": [str(exc)]}) from None
    try:
        ledger.lock_escrow(task.pk, task.owner, task.budget, reference=f"escrow:{task.pk}")
    except ledger.InsufficientFunds:
        available = format_credits(ledger.balance(task.owner))
        raise ValidationError(
            {"budget": [f"Your available balance is {available} credits; it does not cover this budget."]}
        ) from None
    opened = timezone.now()
    give_up = opened + timedelta(seconds=settings.TASK_MAX_WAIT)
    reason = (
        ""
        if kind.available
        else f"No provider runs {kind.label} tasks yet; if none does by {give_up:%Y-%m-%d %H:%M} UTC,"
        " the task fails with a full refund."
    )
    transition_locked(task, TaskStatus.OPEN, "Task opened for workers; budget held in escrow.", reason=reason)
    task.opened_at = opened
    task.save(update_fields=["opened_at"])
    if kind.available:
        transaction.on_commit(partial(enqueue, "workers.schedule_task", str(task.pk)))


CANCELLED_BY_OWNER = "Cancelled by you."


def cancelled_by_operator(reason: str) -> str:
    """What the requester reads when an operator cancelled their task: who, and why."""
    return f"Cancelled by an operator: {reason}"


def cancel_locked(task: Task, *, operator_reason: str = "") -> None:
    """Cancel a locked task: it ends and its whole escrow is refunded.

    The requester cancels it, or, with ``operator_reason``, the platform's operators do;
    the timeline and the status reason say which (the requester reads them, so the
    requester's own cancel reads "by you"). The workers app ends the task's jobs first
    (``task_cancelling``), or refuses while a replica's result is being verified: that
    result may still be paid. An illegal move raises IllegalTransition before anyone hears
    of it.
    """
    check_transition(task.status, TaskStatus.CANCELLED)
    task_cancelling.send(sender=Task, task=task)
    said = cancelled_by_operator(operator_reason) if operator_reason else CANCELLED_BY_OWNER
    transition_locked(task, TaskStatus.CANCELLED, said, reason=said)
    _refund(task)


def fail_locked(task: Task, message: str, *, reason: str) -> None:
    """Fail a locked task and refund what is left of its escrow (all of it unless a
    replica was paid from it)."""
    transition_locked(task, TaskStatus.FAILED, message, reason=reason)
    _refund(task)


def complete_locked(task: Task, summary: dict[str, Any]) -> None:
    """Complete a locked task with its verified result's ``summary``; the rest of its
    escrow, beyond the rewards already paid from it, goes back to the requester."""
    task.result_summary = summary
    task.progress = 100.0
    task.save(update_fields=["result_summary", "progress"])
    transition_locked(task, TaskStatus.COMPLETED, "Verified and paid.")
    _refund(task)


def _refund(task: Task) -> None:
    """Return what is left in the task's escrow to its owner (one refund per task)."""
    ledger.refund(task.pk, reference=f"refund:{task.pk}")
