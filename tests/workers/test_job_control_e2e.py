"""The platform controls a running job on a real node (daphne, a platform Celery worker, a
real agent process): a cube_training task cancelled mid-training stops computing on its
node within 10 s and the node takes its next job; a node told to stop (SIGTERM) mid-job
stops within seconds and reports the job abandoned, so it is reassigned at once."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from rest_framework.test import APIClient

from marketplace import services as marketplace
from marketplace.models import Task, TaskStatus
from tests.workers import processes as p
from tests.workers.test_cube_e2e import TINY_CUBE, post, upload
from training.cube.data import synthetic_embeddings
from workers.assignments import scheduler
from workers.models import Assignment, Worker

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# Trains for many minutes on one shared core: it is stopped long before its end.
LONG_CUBE = {**TINY_CUBE, "epochs": 1000}
STOPPED_LINE = "stopped by the platform: The requester cancelled the task."


def logs(tmp_path: Path) -> str:
    return "\n".join(
        f"--- {name}\n{(tmp_path / name).read_text(errors='replace')[-3000:]}"
        for name in ("agent.log", "platform.log", "daphne.log")
        if (tmp_path / name).exists()
    )


def training_started(client: APIClient, tmp_path: Path) -> tuple[Task, Assignment]:
    """A long cube_training task posted, scheduled, and reporting progress from the node."""
    embeddings, _ = synthetic_embeddings(320, 32, seed=7)
    task = post(client, "cube_training", LONG_CUBE, upload(client, embeddings, "teacher.npy"))
    scheduler.schedule(task.pk)

    def training() -> bool:
        row = Assignment.objects.filter(task=task).first()
        return row is not None and row.state == Assignment.State.RUNNING and row.progress > 0

    p.wait_for(training, 120, "the node never reported training progress", explain=lambda: logs(tmp_path))
    return task, Assignment.objects.get(task=task)


def test_a_cancelled_cube_task_stops_on_its_node_within_10_s_and_the_node_takes_the_next_job(
    alice: Any, bob: Any, tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROOFWORK_MEDIA_ROOT", str(settings.MEDIA_ROOT))
    client = APIClient()
    client.force_authenticate(bob)
    _, api_token = marketplace.create_api_token(bob, "e2e")
    agent_log = tmp_path / "agent.log"
    with p.daphne(tmp_path) as url, p.platform_worker(tmp_path):
        key = p.register_agent(tmp_path, url, alice, "cube-node")
        worker = Worker.objects.get(owner=alice)
        with p.spawn(p.agent_cmd(key, "run", *p.broker_args()), agent_log, p.child_env()):
            p.wait_for(lambda: Worker.objects.get(pk=worker.pk).is_online, 60, "the agent never sent a heartbeat")
            task, assignment = training_started(client, tmp_path)
            # An epoch summary line of the trainer reached the task's log, not only "started".
            p.wait_for(
                lambda: any("epoch" in line for line in Assignment.objects.get(pk=assignment.pk).log_tail),
                60,
                "no epoch line reached the task log",
                explain=lambda: f"{Assignment.objects.get(pk=assignment.pk).log_tail}\n{logs(tmp_path)}",
            )

            # The same cancel the task page's button makes (marketplace.services.cancel_task).
            response = httpx.post(
                f"{url}/api/v1/tasks/{task.pk}/cancel/", headers={"Authorization": f"Token {api_token}"}
            )
            assert response.status_code == 200, response.text
            cancelled_at = time.monotonic()

            p.wait_for(
                lambda: STOPPED_LINE in Assignment.objects.get(pk=assignment.pk).log_tail,
                10,
                "the node did not say it stopped within 10 s",
                explain=lambda: logs(tmp_path),
            )
            assert time.monotonic() - cancelled_at <= 10
            text = agent_log.read_text(errors="replace")
            assert "stopped by the platform: The requester cancelled the task." in text
            assert "nothing is uploaded or submitted" in text
            assert Task.objects.get(pk=task.pk).status == TaskStatus.CANCELLED

            # Its computation returned (Celery logs the job's end), well before the training's end.
            p.wait_for(
                lambda: "'stopped'" in agent_log.read_text(errors="replace"),
                10,
                "the job did not return",
                explain=lambda: logs(tmp_path),
            )

            # And it is free: the next task runs on it to the end.
            follow = post(client, "cube_training", TINY_CUBE, upload(client, synthetic_embeddings(320, 32, 8)[0], "b"))
            scheduler.schedule(follow.pk)
            p.wait_for(
                lambda: Task.objects.get(pk=follow.pk).status in (TaskStatus.COMPLETED, TaskStatus.FAILED),
                180,
                "the next task did not settle",
                explain=lambda: logs(tmp_path),
            )
            assert Task.objects.get(pk=follow.pk).status == TaskStatus.COMPLETED, logs(tmp_path)
    stored = Assignment.objects.get(pk=assignment.pk)
    assert stored.state == Assignment.State.EXPIRED
    assert stored.result == {}  # nothing was submitted


def test_sigterm_stops_a_node_mid_job_within_seconds_and_reports_it_abandoned(
    alice: Any, bob: Any, tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROOFWORK_MEDIA_ROOT", str(settings.MEDIA_ROOT))
    client = APIClient()
    client.force_authenticate(bob)
    agent_log = tmp_path / "agent.log"
    with p.daphne(tmp_path) as url, p.platform_worker(tmp_path):
        key = p.register_agent(tmp_path, url, alice, "cube-node")
        worker = Worker.objects.get(owner=alice)
        with p.spawn(p.agent_cmd(key, "run", *p.broker_args()), agent_log, p.child_env()) as agent:
            p.wait_for(lambda: Worker.objects.get(pk=worker.pk).is_online, 60, "the agent never sent a heartbeat")
            task, assignment = training_started(client, tmp_path)
            agent.send_signal(signal.SIGTERM)
            try:
                code = agent.wait(timeout=15)
            except Exception:
                pytest.fail(f"the agent did not exit within 15 s of SIGTERM\n{logs(tmp_path)}")
            assert code == 0, logs(tmp_path)
    stored = Assignment.objects.get(pk=assignment.pk)
    assert stored.state == Assignment.State.EXPIRED, logs(tmp_path)
    assert stored.reason == "The worker gave up: abandoned: the node is shutting down"
    assert stored.result == {}
    assert Task.objects.get(pk=task.pk).status in (TaskStatus.OPEN, TaskStatus.ASSIGNED)
