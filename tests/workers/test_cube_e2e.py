"""The cube kinds with real processes: a cube_training task posted through the REST API on
an uploaded .npy, its held-out rows split off by the platform, trained by a real agent with
live progress, verified on the rows it never received, paid and sealed; then a
cube_inference task on that model, spot-checked and paid."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from ledger.models import Transaction
from ledger.sealer import seal_all
from marketplace.models import Task, TaskStatus
from tests.workers import processes as p
from training.cube.data import synthetic_embeddings
from workers.assignments import scheduler
from workers.models import Assignment, Worker

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# A 3³ lattice on 32-wide embeddings: a few seconds of training on one shared core.
TINY_CUBE = {
    "teacher_dim": 32,
    "lattice_edge": 3,
    "state_size": 8,
    "steps": 2,
    "epochs": 3,
    "batch_size": 16,
    "warmup_steps": 5,
    "learning_rate": 3e-3,
    "synthetic_samples": 0,
    "seed": 1,
}


def npy_upload(array: np.ndarray, name: str) -> SimpleUploadedFile:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return SimpleUploadedFile(name, buffer.getvalue(), content_type="application/octet-stream")


def post(client: APIClient, kind: str, spec: dict[str, Any], dataset: str) -> Task:
    body = {"kind": kind, "spec": spec, "dataset": dataset, "budget": "5"}
    response = client.post("/api/v1/tasks/", body, format="json")
    assert response.status_code == 201, response.json()
    return Task.objects.get(pk=response.json()["id"])


def upload(client: APIClient, array: np.ndarray, name: str) -> str:
    response = client.post("/api/v1/datasets/", {"file": npy_upload(array, name), "name": name}, format="multipart")
    assert response.status_code == 201, response.json()
    return str(response.json()["id"])


def run_to_the_end(task: Task, tmp_path: Path, timeout: float = 120) -> Task:
    scheduler.schedule(task.pk)

    def settled() -> bool:
        return Task.objects.get(pk=task.pk).status in (TaskStatus.COMPLETED, TaskStatus.FAILED)

    def explain() -> str:
        t = Task.objects.get(pk=task.pk)
        states = list(Assignment.objects.filter(task=t).values_list("state", "reason"))
        logs = "\n".join(
            f"--- {name}\n{(tmp_path / name).read_text()[-3000:]}" for name in ("agent.log", "platform.log")
        )
        return f"task {t.status} ({t.status_reason}); assignments {states}\n{logs}"

    p.wait_for(settled, timeout, "task not settled", explain=explain)
    done = Task.objects.get(pk=task.pk)
    assert done.status == TaskStatus.COMPLETED, explain()
    return done


def test_cube_training_then_inference_on_a_real_agent(
    alice: Any, bob: Any, tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The child processes must read and write the same files as this test process.
    monkeypatch.setenv("PROOFWORK_MEDIA_ROOT", str(settings.MEDIA_ROOT))
    env = p.child_env()
    client = APIClient()
    client.force_authenticate(bob)
    embeddings, _ = synthetic_embeddings(320, 32, seed=7)
    with p.daphne(tmp_path) as url, p.platform_worker(tmp_path):
        key = p.register_agent(tmp_path, url, alice, "cube-node")
        worker = Worker.objects.get(owner=alice)
        assert {"cube_training", "cube_inference"} <= set(worker.capabilities["kinds"])
        with p.spawn(p.agent_cmd(key, "run", *p.broker_args()), tmp_path / "agent.log", env):
            p.wait_for(lambda: Worker.objects.get(pk=worker.pk).is_online, 30, "the agent never sent a heartbeat")

            training = post(client, "cube_training", TINY_CUBE, upload(client, embeddings, "teacher.npy"))
            training = run_to_the_end(training, tmp_path)

            inputs = synthetic_embeddings(24, 32, seed=7, stream=5)[0]
            inference = post(
                client,
                "cube_inference",
                {"source_task": str(training.pk), "verify_samples": 4},
                upload(client, inputs, "inputs.npy"),
            )
            inference = run_to_the_end(inference, tmp_path)

    trained = Assignment.objects.get(task=training)
    assert trained.state == Assignment.State.ACCEPTED
    summary = training.result_summary
    assert summary["result_hash"] == trained.result["compute_result"]["result_hash"]
    assert summary["heldout_val_loss"] < summary["untrained_val_loss"]
    assert summary["heldout_rows"] == 32  # a tenth of 320, never sent to the worker
    assert abs(summary["heldout_val_loss"] - summary["reported_val_loss"]) <= 0.2 * summary["heldout_val_loss"] + 1e-3
    # The loss curve reached the task page's live chart.
    assert any("loss" in point for point in trained.history), trained.history
    assert "loss" in training.metrics

    served = Assignment.objects.get(task=inference)
    assert served.state == Assignment.State.ACCEPTED
    assert inference.result_summary["rows_checked"] == 4

    worker.refresh_from_db()
    assert worker.jobs_done == 2
    seal_all()
    sealed = Transaction.objects.filter(type="SUBMIT_RESULT", sender=worker.address, status="sealed")
    assert {t.payload["compute_result"]["task_id"] for t in sealed} == {str(training.pk), str(inference.pk)}
