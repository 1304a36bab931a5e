"""The ASL kinds with real processes: an asl_training task posted through the REST API with
an uploaded ISLR-format zip, its held-out participants split off by the platform, trained by
a real agent with live progress, verified on the participants it never received (with a
minimum accuracy), paid and sealed; then an asl_inference task on that model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from ledger.models import Transaction
from ledger.sealer import seal_all
from marketplace.models import Task
from tests.workers import processes as p
from tests.workers.test_cube_e2e import post, run_to_the_end
from training.asl.synthetic import generate
from workers.models import Assignment, Worker

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# Dim 192 (the smallest the platform offers), one block, short sequences: seconds on one core.
TINY_ASL = {
    "dim": 192,
    "blocks": 1,
    "max_len": 32,
    "epochs": 6,
    "batch_size": 8,
    "grad_accumulation": 1,
    "learning_rate": 3e-3,
    "validation_fraction": 0.25,
    "min_accuracy": 0.5,
    "seed": 0,
}


def upload_zip(client: APIClient, path: Path) -> str:
    file = SimpleUploadedFile(path.name, path.read_bytes(), content_type="application/zip")
    response = client.post("/api/v1/datasets/", {"file": file, "name": path.name}, format="multipart")
    assert response.status_code == 201, response.json()
    assert response.json()["format"] == "zip"
    return str(response.json()["id"])


def test_asl_training_then_inference_on_a_real_agent(
    alice: Any, bob: Any, tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The child processes must read and write the same files as this test process.
    monkeypatch.setenv("PROOFWORK_MEDIA_ROOT", str(settings.MEDIA_ROOT))
    env = p.child_env()
    client = APIClient()
    client.force_authenticate(bob)
    signs = generate(tmp_path / "signs.zip", n_signs=5, n_participants=5, per_participant=2, max_frames=20, as_zip=True)
    new = generate(
        tmp_path / "new.zip", n_signs=5, n_participants=1, per_participant=1, max_frames=20, seed=9, as_zip=True
    )
    with p.daphne(tmp_path) as url, p.platform_worker(tmp_path):
        key = p.register_agent(tmp_path, url, alice, "asl-node")
        worker = Worker.objects.get(owner=alice)
        assert {"asl_training", "asl_inference"} <= set(worker.capabilities["kinds"])
        with p.spawn(p.agent_cmd(key, "run", *p.broker_args()), tmp_path / "agent.log", env):
            p.wait_for(lambda: Worker.objects.get(pk=worker.pk).is_online, 30, "the agent never sent a heartbeat")

            training = post(client, "asl_training", TINY_ASL, upload_zip(client, signs))
            training = run_to_the_end(training, tmp_path)

            spec = {"source_task": str(training.pk), "top_k": 3, "verify_samples": 3}
            inference = run_to_the_end(post(client, "asl_inference", spec, upload_zip(client, new)), tmp_path)

    trained = Assignment.objects.get(task=training)
    assert trained.state == Assignment.State.ACCEPTED
    summary = training.result_summary
    assert summary["result_hash"] == trained.result["compute_result"]["result_hash"]
    assert summary["heldout_sequences"] == 10  # one participant of five, never sent to the worker
    assert summary["heldout_top1"] >= TINY_ASL["min_accuracy"]
    # The loss curve and the validation accuracy reached the task page's live chart.
    assert any("loss" in point for point in trained.history), trained.history
    assert any("val_top1" in point for point in trained.history), trained.history

    served = Assignment.objects.get(task=inference)
    assert served.state == Assignment.State.ACCEPTED
    assert inference.result_summary["sequences_checked"] == 3

    worker.refresh_from_db()
    assert worker.jobs_done == 2
    seal_all()
    sealed = Transaction.objects.filter(type="SUBMIT_RESULT", sender=worker.address, status="sealed")
    assert {t.payload["compute_result"]["task_id"] for t in sealed} == {str(training.pk), str(inference.pk)}
    assert Task.objects.get(pk=inference.pk).status == "completed"
