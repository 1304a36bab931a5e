"""Finished runs for the run page's tests, made through the platform's own services from
the point a result was submitted: a completed cube_training task paid to its worker, and an
asl_training task whose result fell short of its bar and which waits again.

The verifiers themselves are exercised in tests/workers/test_cube_kinds.py and
test_asl_kinds.py; here the verdicts' numbers are fixed and their words are the verifier's
own (``cube._checks``, ``asl._checks``).
"""

from __future__ import annotations

from typing import Any

from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.db import transaction

from ledger import services as ledger
from ledger.units import UNITS_PER_CREDIT
from marketplace import lifecycle
from marketplace.kinds import KINDS
from marketplace.models import Task, TaskStatus
from tests.factories import islr_zip_bytes, make_dataset, make_worker, post_task
from tests.workers.test_pages import make_assignment
from workers.assignments import scheduler, settlement
from workers.assignments.jobs import artifact_path
from workers.models import Assignment
from workers.verification import asl, cube

CUBE_METRICS: dict[str, Any] = {
    "heldout_val_loss": 0.42,
    "reported_val_loss": 0.41,
    "untrained_val_loss": 1.0,
    "constant_val_loss": 0.9,
    "heldout_rows": 64,
    "required_loss_reduction_pct": 20,
}
ASL_METRICS: dict[str, Any] = {
    "heldout_top1": 0.3,
    "heldout_top5": 0.9,
    "reported_top1": 0.3,
    "heldout_sequences": 12,
    "min_accuracy": 0.5,
    "signs": 3,
}
# What the verifier says of ASL_METRICS: the first bar it misses.
ASL_SHORT_REASON = next(c.words for c in asl.asl_training_bars(ASL_METRICS) if not c.met)
CUBE_CHECKS = cube.cube_training_bars(CUBE_METRICS)


def _move(task: Task, *targets: str) -> None:
    for target in targets:
        with transaction.atomic():
            locked = lifecycle.lock_task(task.pk)
            assert locked is not None
            lifecycle.transition_locked(locked, target, f"Now {target}.")


def completed_cube(owner: Any, *, title: str = "Cube run", spec: dict[str, Any] | None = None) -> Task:
    """A cube_training task completed with a verified result: its worker paid from escrow
    (a reward and the platform's fee), its result files stored, the rest refunded."""
    task = post_task(owner, kind="cube_training", spec=spec, budget=100 * UNITS_PER_CREDIT, title=title)
    worker = make_worker(owner, name=f"cube-node-{str(task.pk)[:4]}").worker
    assignment = make_assignment(task, worker, state=Assignment.State.ACCEPTED, metrics=CUBE_METRICS, progress=100.0)
    for i, name in enumerate(KINDS["cube_training"].artifacts):
        default_storage.save(artifact_path(assignment, name), ContentFile(b"x" * (1500 * (i + 1))))
    _move(task, TaskStatus.RUNNING, TaskStatus.VERIFYING)
    with transaction.atomic():
        locked = lifecycle.lock_task(task.pk)
        assert locked is not None
        ledger.release_to_worker(
            task.pk, worker.address, 3 * UNITS_PER_CREDIT, f"reward:{assignment.pk}", fee=UNITS_PER_CREDIT // 2
        )
        Assignment.objects.filter(pk=assignment.pk).update(settled_at=locked.updated_at)
        lifecycle.complete_locked(locked, {"result_hash": "ab" * 32, "workers": [worker.address], **CUBE_METRICS})
    task.refresh_from_db()
    return task


def short_asl(owner: Any, *, title: str = "ASL run") -> Task:
    """An asl_training task whose only result was a true claim short of its bar: rejected
    by ``settlement.reject`` as the verifier's verdict has it, and open again, waiting."""
    dataset = make_dataset(owner, islr_zip_bytes(), "islr.zip")
    task = post_task(owner, kind="asl_training", budget=100 * UNITS_PER_CREDIT, dataset=dataset.pk, title=title)
    worker = make_worker(owner, name=f"asl-node-{str(task.pk)[:4]}").worker
    assignment = make_assignment(task, worker, state=Assignment.State.SUBMITTED, progress=100.0)
    _move(task, TaskStatus.RUNNING)
    Task.objects.filter(pk=task.pk).update(progress=100.0)
    _move(task, TaskStatus.VERIFYING)
    settlement.reject(assignment.pk, ASL_SHORT_REASON, penalise=False, metrics=ASL_METRICS)
    scheduler.schedule(task.pk)  # no other provider: the task says why it waits
    task.refresh_from_db()
    return task
