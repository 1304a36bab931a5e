"""The platform controls a running job on a real node (daphne, a platform Celery worker, a
real agent process): a cube_training task cancelled mid-training stops computing on its
node within 10 s and the node takes its next job; a node told to stop (SIGTERM) mid-job
stops within seconds and reports the job abandoned, so it is reassigned at once."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import pytest
from rest_framework.test import APIClient

from marketplace import services as marketplace
from marketplace.models import Task, TaskStatus, User
from tests.factories import TINY_CUBE, array_npy
from tests.workers import processes as p
from tests.workers.live_tasks import post, upload
from training.cube.data import synthetic_embeddings
from workers.assignments import scheduler
from workers.models import Assignment

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("shared_media")]

# Trains for many minutes on one shared core: it is stopped long before its end.
LONG_CUBE = {**TINY_CUBE, "epochs": 1000}
STOPPED_LINE = "stopped by the platform: The requester cancelled the task."


def training_started(client: APIClient, tmp_path: Path) -> tuple[Task, Assignment]:
    """A long cube_training task posted, scheduled, and reporting progress from the node."""
    embeddings, _ = synthetic_embeddings(320, 32, seed=7)
    task = post(client, "cube_training", LONG_CUBE, str(upload(client, "teacher.npy", array_npy(embeddings))["id"]))
    scheduler.schedule(task.pk)

    def training() -> bool:
        row = Assignment.objects.filter(task=task).first()
        return row is not None and row.state == Assignment.State.RUNNING and row.progress > 0

    p.wait_for(training, 120, "the node never reported training progress", explain=lambda: p.logs(tmp_path))
    return task, Assignment.objects.get(task=task)


def said_it_stopped(assignment: Assignment, tmp_path: Path) -> None:
    """The node's stopped line reaches the assignment's log within 10 s."""
    p.wait_for(
        lambda: STOPPED_LINE in Assignment.objects.get(pk=assignment.pk).log_tail,
        10,
        "the node did not say it stopped within 10 s",
        explain=lambda: p.logs(tmp_path),
    )


def test_a_cancelled_cube_task_stops_on_its_node_within_10_s_and_the_node_takes_the_next_job(
    alice: User, bob: User, bob_client: APIClient, tmp_path: Path
) -> None:
    _, api_token = marketplace.create_api_token(bob, "e2e")
    with p.platform_and_node(tmp_path, alice, "cube-node", online_within=60) as node:
        task, assignment = training_started(bob_client, tmp_path)
        # An epoch summary line of the trainer reached the task's log, not only "started".
        p.wait_for(
            lambda: any("epoch" in line for line in Assignment.objects.get(pk=assignment.pk).log_tail),
            60,
            "no epoch line reached the task log",
            explain=lambda: f"{Assignment.objects.get(pk=assignment.pk).log_tail}\n{p.logs(tmp_path)}",
        )

        # The same cancel the task page's button makes (marketplace.services.cancel_task).
        response = httpx.post(
            f"{node.url}/api/v1/tasks/{task.pk}/cancel/", headers={"Authorization": f"Token {api_token}"}
        )
        assert response.status_code == 200, response.text
        cancelled_at = time.monotonic()

        said_it_stopped(assignment, tmp_path)
        assert time.monotonic() - cancelled_at <= 10
        text = node.log.read_text(errors="replace")
        assert "stopped by the platform: The requester cancelled the task." in text
        assert "nothing is uploaded or submitted" in text
        assert Task.objects.get(pk=task.pk).status == TaskStatus.CANCELLED

        # Its computation returned (Celery logs the job's end), well before the training's end.
        p.wait_for(
            lambda: "'stopped'" in node.log.read_text(errors="replace"),
            10,
            "the job did not return",
            explain=lambda: p.logs(tmp_path),
        )

        # And it is free: the next task (a short one) runs on it to the end.
        follow_data = upload(bob_client, "b", array_npy(synthetic_embeddings(320, 32, 8)[0]))
        follow = post(bob_client, "cube_training", {**TINY_CUBE, "epochs": 2}, str(follow_data["id"]))
        scheduler.schedule(follow.pk)
        p.wait_for(
            lambda: Task.objects.get(pk=follow.pk).status in (TaskStatus.COMPLETED, TaskStatus.FAILED),
            180,
            "the next task did not settle",
            explain=lambda: p.logs(tmp_path),
        )
        assert Task.objects.get(pk=follow.pk).status == TaskStatus.COMPLETED, p.logs(tmp_path)
    stored = Assignment.objects.get(pk=assignment.pk)
    assert stored.state == Assignment.State.EXPIRED
    assert stored.result == {}  # nothing was submitted


def test_sigterm_stops_a_node_mid_job_within_seconds_and_reports_it_abandoned(
    alice: User, bob_client: APIClient, tmp_path: Path
) -> None:
    with p.platform_and_node(tmp_path, alice, "cube-node", online_within=60) as node:
        task, assignment = training_started(bob_client, tmp_path)
        node.agent.send_signal(signal.SIGTERM)
        try:
            code = node.agent.wait(timeout=15)
        except Exception:
            pytest.fail(f"the agent did not exit within 15 s of SIGTERM\n{p.logs(tmp_path)}")
        assert code == 0, p.logs(tmp_path)
    stored = Assignment.objects.get(pk=assignment.pk)
    assert stored.state == Assignment.State.EXPIRED, p.logs(tmp_path)
    assert stored.reason == "The worker gave up: abandoned: the node is shutting down"
    assert stored.result == {}
    assert Task.objects.get(pk=task.pk).status in (TaskStatus.OPEN, TaskStatus.ASSIGNED)
