"""The whole flow with real processes: a synthetic task posted, scheduled to a real agent
(a Celery worker consuming its own queue), run, uploaded, signed, verified on the
platform queue by a real platform worker, paid, and sealed into a block."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ledger import services as ledger
from ledger.models import Transaction
from ledger.sealer import seal_all
from ledger.units import UNITS_PER_CREDIT
from marketplace.models import Task, TaskStatus
from tests.factories import post_task
from tests.workers import processes as p
from workers.assignments import scheduler
from workers.identity import services
from workers.models import Assignment, Worker

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_synthetic_task_runs_on_a_real_agent_and_is_paid(alice, bob, tmp_path: Path) -> None:
    key = tmp_path / "node" / "worker.pem"
    env = p.child_env()
    with p.daphne(tmp_path) as url, p.platform_worker(tmp_path):
        assert subprocess.run(p.agent_cmd(key, "init"), env=env, capture_output=True, timeout=60).returncode == 0
        _, raw = services.create_registration_token(alice)
        reg = subprocess.run(
            p.agent_cmd(key, "register", "--server", url, "--token", raw),
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert reg.returncode == 0, reg.stderr
        worker = Worker.objects.get(owner=alice)
        with p.spawn(p.agent_cmd(key, "run", *p.broker_args()), tmp_path / "agent.log", env):
            p.wait_for(lambda: Worker.objects.get(pk=worker.pk).is_online, 30, "the agent never sent a heartbeat")

            ledger.deposit(bob, 10 * UNITS_PER_CREDIT, reference="test-deposit")
            task = post_task(bob, "synthetic", {"n": 256}, budget=UNITS_PER_CREDIT)
            scheduler.schedule(task.pk)

            def settled() -> bool:
                return Task.objects.get(pk=task.pk).status in (TaskStatus.COMPLETED, TaskStatus.FAILED)

            def explain() -> str:
                t = Task.objects.get(pk=task.pk)
                states = list(Assignment.objects.filter(task=t).values_list("state", "reason"))
                logs = "\n".join(
                    f"--- {name}\n{(tmp_path / name).read_text()[-2500:]}" for name in ("agent.log", "platform.log")
                )
                return f"task {t.status} ({t.status_reason}); assignments {states}\n{logs}"

            p.wait_for(settled, 120, "task not settled", explain=explain)

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
