"""The whole flow with real processes: a synthetic task posted, scheduled to a real agent
(a Celery worker consuming its own queue), run, uploaded, signed, verified on the
platform queue by a real platform worker, paid, and sealed into a block."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger import services as ledger
from ledger.models import Transaction
from ledger.sealer import seal_all
from ledger.units import UNITS_PER_CREDIT
from marketplace.models import Task, TaskStatus, User
from tests.factories import post_task
from tests.workers import processes as p
from tests.workers.live_tasks import run_to_the_end
from workers.models import Assignment

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_synthetic_task_runs_on_a_real_agent_and_is_paid(alice: User, bob: User, tmp_path: Path) -> None:
    with p.platform_and_node(tmp_path, alice, None) as node:
        ledger.deposit(bob, 10 * UNITS_PER_CREDIT, reference="test-deposit")
        task = run_to_the_end(post_task(bob, "synthetic", {"n": 256}, budget=UNITS_PER_CREDIT), tmp_path)
    worker = node.worker

    task = Task.objects.get(pk=task.pk)
    assert task.status == TaskStatus.COMPLETED, task.status_reason
    assignment = Assignment.objects.get(task=task)
    assert assignment.state == Assignment.State.ACCEPTED
    assert task.result_summary["result_hash"] == assignment.result["compute_result"]["result_hash"]
    worker.refresh_from_db()
    assert worker.jobs_done == 1
    assert worker.benchmark_gflops is not None
    assert worker.benchmark_gflops > 0

    seal_all()
    submit = Transaction.objects.get(type="SUBMIT_RESULT", sender=worker.address)
    assert submit.status == "sealed", list(Transaction.objects.values_list("type", "status", "reason", "block_id"))
    assert submit.block is not None
    assert submit.payload["compute_result"]["result_hash"] == task.result_summary["result_hash"]
