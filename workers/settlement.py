"""Settlement: what happens to money, reputation and the task once a result is judged.

Accepted → the reward leaves escrow for the worker (minus the platform fee), the
worker's signed SUBMIT_RESULT enters the mempool, reputation rises; when every replica
is accepted the task completes and the rest of the escrow goes back to the requester.
Rejected → REJECT_RESULT on the chain, reputation falls, the job is reassigned until
the task's attempts run out, then the task fails with a full refund.
All of it in one database transaction per verdict, idempotent per assignment.
"""

from __future__ import annotations

import logging
from uuid import UUID

from django.db import transaction
from django.db.models import F
from django.db.models.functions import Least
from django.utils import timezone

from ledger import services as ledger
from marketplace.models import Task, TaskStatus
from marketplace.services import transition_locked
from workers.models import Assignment, Worker

log = logging.getLogger(__name__)

REPUTATION_UP = 2
REPUTATION_DOWN = 10


def reward_per_replica(task: Task) -> int:
    """What one accepted replica earns: the task's price estimate, bounded by the budget share."""
    return min(task.price_estimate, task.budget // task.replication)


def accept(assignment_id: UUID, metrics: dict[str, object]) -> Assignment | None:
    """Settle an accepted result. Returns None when it was already settled."""
    with transaction.atomic():
        assignment = Assignment.objects.select_for_update().select_related("worker").get(pk=assignment_id)
        if assignment.state != Assignment.State.SUBMITTED:
            return None
        task = Task.objects.select_for_update().get(pk=assignment.task_id)
        worker = assignment.worker
        reward = reward_per_replica(task)
        release = ledger.release_to_worker(task.pk, worker.address, reward, reference=f"reward:{assignment.pk}")
        from workers.jobs import tx_from_json

        tx, signature = tx_from_json(assignment.result["transaction"])
        row = ledger.submit_transaction(tx, signature, reference=f"submit:{assignment.pk}")
        if row.status == "refused":
            # The platform built this template; a refusal is our bug, not the worker's.
            # Raising rolls the reward back and leaves the result submitted for a retry.
            raise ledger.LedgerError(row.reason, f"SUBMIT_RESULT refused: {row.reason_detail or row.reason}")
        assignment.state = Assignment.State.ACCEPTED
        assignment.settled_at = timezone.now()
        assignment.metrics = {**assignment.metrics, **metrics}
        assignment.save(update_fields=["state", "settled_at", "metrics"])
        gflops = metrics.get("gflops")
        Worker.objects.filter(pk=worker.pk).update(
            reputation=Least(F("reputation") + REPUTATION_UP, 100),
            jobs_done=F("jobs_done") + 1,
            earnings=F("earnings") + release.amount,
            **({"benchmark_gflops": float(gflops)} if isinstance(gflops, int | float) else {}),
        )
        accepted = Assignment.objects.filter(task=task, state=Assignment.State.ACCEPTED).count()
        if accepted >= task.replication and task.status == TaskStatus.VERIFYING:
            task.result_summary = {
                "result_hash": assignment.result["compute_result"]["result_hash"],
                "workers": list(
                    Assignment.objects.filter(task=task, state=Assignment.State.ACCEPTED).values_list(
                        "worker__address", flat=True
                    )
                ),
                **{k: v for k, v in metrics.items() if isinstance(v, int | float | str)},
            }
            task.progress = 100.0
            task.save(update_fields=["result_summary", "progress"])
            transition_locked(task, TaskStatus.COMPLETED, "Verified and paid.")
            ledger.refund(task.pk, reference=f"refund:{task.pk}")
        elif task.status == TaskStatus.VERIFYING:
            transition_locked(task, TaskStatus.OPEN, f"{accepted}/{task.replication} replicas verified.")
            transaction.on_commit(lambda: _schedule(task.pk))
    return assignment


def reject(assignment_id: UUID, reason: str) -> Assignment | None:
    """Settle a rejected result. Returns None when it was already settled."""
    with transaction.atomic():
        assignment = Assignment.objects.select_for_update().select_related("worker").get(pk=assignment_id)
        if assignment.state != Assignment.State.SUBMITTED:
            return None
        task = Task.objects.select_for_update().get(pk=assignment.task_id)
        ledger.reject_result(task.pk, assignment.worker.address, reason, reference=f"reject:{assignment.pk}")
        assignment.state = Assignment.State.REJECTED
        assignment.settled_at = timezone.now()
        assignment.reason = reason[:300]
        assignment.save(update_fields=["state", "settled_at", "reason"])
        Worker.objects.filter(pk=assignment.worker_id).update(reputation=F("reputation") - REPUTATION_DOWN)
        Worker.objects.filter(pk=assignment.worker_id, reputation__lt=0).update(reputation=0)
        if task.status in (TaskStatus.VERIFYING, TaskStatus.RUNNING, TaskStatus.ASSIGNED):
            transition_locked(task, TaskStatus.OPEN, f"Result of {assignment.worker.name} rejected: {reason[:200]}")
            transaction.on_commit(lambda: _schedule(task.pk))
    return assignment


def refund_task(task: Task) -> None:
    """Return a failed or cancelled task's whole escrow (within the caller's transaction)."""
    ledger.refund(task.pk, reference=f"refund:{task.pk}")


def _schedule(task_id: UUID) -> None:
    from workers.tasks import schedule_task

    schedule_task.delay(str(task_id))
