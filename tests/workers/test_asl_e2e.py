"""The ASL kinds with real processes: an asl_training task posted through the REST API with
an uploaded ISLR-format zip, its held-out participants split off by the platform, trained by
a real agent with live progress, verified on the participants it never received (with a
minimum accuracy), paid and sealed; then an asl_inference task on that model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from marketplace.models import Task
from tests import factories
from tests.workers import processes as p
from tests.workers.live_tasks import accepted, paid_and_sealed, post, run_to_the_end, upload
from training.asl.synthetic import generate

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("shared_media"),
]

TINY_ASL = {**factories.TINY_ASL, "min_accuracy": 0.5}


def upload_zip(client: APIClient, path: Path) -> str:
    dataset = upload(client, path.name, path.read_bytes(), "application/zip")
    assert dataset["format"] == "zip"
    return str(dataset["id"])


def test_asl_training_then_inference_on_a_real_agent(alice: Any, bob_client: APIClient, tmp_path: Path) -> None:
    signs = generate(tmp_path / "signs.zip", n_signs=5, n_participants=5, per_participant=2, max_frames=20, as_zip=True)
    new = generate(
        tmp_path / "new.zip", n_signs=5, n_participants=1, per_participant=1, max_frames=20, seed=9, as_zip=True
    )
    with p.platform_and_node(tmp_path, alice, "asl-node") as node:
        assert {"asl_training", "asl_inference"} <= set(node.worker.capabilities["kinds"])
        training = run_to_the_end(post(bob_client, "asl_training", TINY_ASL, upload_zip(bob_client, signs)), tmp_path)

        spec = {"source_task": str(training.pk), "top_k": 3, "verify_samples": 3}
        inference = run_to_the_end(post(bob_client, "asl_inference", spec, upload_zip(bob_client, new)), tmp_path)

    trained = accepted(training)
    summary = training.result_summary
    assert summary["result_hash"] == trained.result["compute_result"]["result_hash"]
    assert summary["heldout_sequences"] == 10  # one participant of five, never sent to the worker
    assert summary["heldout_top1"] >= TINY_ASL["min_accuracy"]
    # The loss curve and the validation accuracy reached the task page's live chart.
    assert any("loss" in point for point in trained.history), trained.history
    assert any("val_top1" in point for point in trained.history), trained.history

    accepted(inference)
    assert inference.result_summary["sequences_checked"] == 3
    paid_and_sealed(node.worker, training, inference)
    assert Task.objects.get(pk=inference.pk).status == "completed"
