"""The cube kinds with real processes: a cube_training task posted through the REST API on
an uploaded .npy, its held-out rows split off by the platform, trained by a real agent with
live progress, verified on the rows it never received, paid and sealed; then a
cube_inference task on that model, spot-checked and paid."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from tests.factories import TINY_CUBE, array_npy
from tests.workers import processes as p
from tests.workers.live_tasks import accepted, paid_and_sealed, post, run_to_the_end, upload
from training.cube.data import synthetic_embeddings

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("shared_media")]

# 4 epochs of 17 steps: a 68-segment trace, of which the platform replays 30 or more.
CUBE = {**TINY_CUBE, "epochs": 4}


def test_cube_training_then_inference_on_a_real_agent(alice: Any, bob_client: APIClient, tmp_path: Path) -> None:
    embeddings, _ = synthetic_embeddings(320, 32, seed=7)
    with p.platform_and_node(tmp_path, alice, "cube-node") as node:
        assert {"cube_training", "cube_inference"} <= set(node.worker.capabilities["kinds"])
        teacher = upload(bob_client, "teacher.npy", array_npy(embeddings))
        training = run_to_the_end(post(bob_client, "cube_training", CUBE, str(teacher["id"])), tmp_path)

        inputs = upload(bob_client, "inputs.npy", array_npy(synthetic_embeddings(24, 32, seed=7, stream=5)[0]))
        spec = {"source_task": str(training.pk), "verify_samples": 4}
        inference = run_to_the_end(post(bob_client, "cube_inference", spec, str(inputs["id"])), tmp_path)

    trained = accepted(training)
    summary = training.result_summary
    assert summary["result_hash"] == trained.result["compute_result"]["result_hash"]
    assert summary["heldout_val_loss"] < summary["untrained_val_loss"]
    assert summary["heldout_rows"] == 32  # a tenth of 320, never sent to the worker
    # Accepted: the claim was the model's loss on the worker's own validation rows, and the
    # challenged segments of its trace re-executed.
    assert trained.metrics["segments_replayed"] >= 30
    # The loss curve reached the task page's live chart.
    assert any("loss" in point for point in trained.history), trained.history
    assert "loss" in training.metrics

    accepted(inference)
    assert inference.result_summary["rows_checked"] == 4
    paid_and_sealed(node.worker, training, inference)
