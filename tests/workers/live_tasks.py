"""Tasks on a platform running in real processes (``processes.platform_and_node``): posted
through the REST API on an uploaded dataset, run to their end by the node, and checked
once settled."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rest_framework.test import APIClient

from ledger.models import Transaction
from ledger.sealer import seal_all
from marketplace.models import Task, TaskStatus
from tests.factories import upload as uploaded_file
from tests.workers import processes as p
from workers.assignments import scheduler
from workers.models import Assignment, Worker


def upload(client: APIClient, name: str, content: bytes, content_type: str = "application/octet-stream") -> Any:
    """Upload a dataset through the REST API; returns the created dataset's JSON."""
    file = uploaded_file(content, name, content_type)
    response = client.post("/api/v1/datasets/", {"file": file, "name": name}, format="multipart")
    assert response.status_code == 201, response.json()
    return response.json()


def post(client: APIClient, kind: str, spec: dict[str, Any], dataset: str) -> Task:
    """Post a task through the REST API with a budget of 5 credits."""
    body = {"kind": kind, "spec": spec, "dataset": dataset, "budget": "5"}
    response = client.post("/api/v1/tasks/", body, format="json")
    assert response.status_code == 201, response.json()
    return Task.objects.get(pk=response.json()["id"])


def run_to_the_end(task: Task, tmp_path: Path, timeout: float = 120) -> Task:
    """Schedule ``task`` and wait until it settles; it must have completed."""
    scheduler.schedule(task.pk)

    def settled() -> bool:
        return Task.objects.get(pk=task.pk).status in (TaskStatus.COMPLETED, TaskStatus.FAILED)

    def explain() -> str:
        t = Task.objects.get(pk=task.pk)
        states = list(Assignment.objects.filter(task=t).values_list("state", "reason"))
        return f"task {t.status} ({t.status_reason}); assignments {states}\n{p.logs(tmp_path)}"

    p.wait_for(settled, timeout, "task not settled", explain=explain)
    done = Task.objects.get(pk=task.pk)
    assert done.status == TaskStatus.COMPLETED, explain()
    return done


def accepted(task: Task) -> Assignment:
    """The task's one assignment, which the platform must have accepted."""
    assignment = Assignment.objects.get(task=task)
    assert assignment.state == Assignment.State.ACCEPTED
    return assignment


def paid_and_sealed(worker: Worker, *tasks: Task) -> None:
    """``worker`` was credited one job for each of ``tasks``, and once sealed, its
    SUBMIT_RESULT of each (and of no other task) is in a block."""
    worker.refresh_from_db()
    assert worker.jobs_done == len(tasks)
    seal_all()
    sealed = Transaction.objects.filter(type="SUBMIT_RESULT", sender=worker.address, status="sealed")
    assert {t.payload["compute_result"]["task_id"] for t in sealed} == {str(task.pk) for task in tasks}
