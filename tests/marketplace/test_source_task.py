"""An inference task names the training task whose model it runs: that task must exist,
be the requester's own, have completed, and be of the matching training kind. Each refusal
is a 400 naming spec.source_task and the reason, and creates nothing."""

from __future__ import annotations

import io
import uuid
from typing import Any

import numpy as np
import pytest
from rest_framework.test import APIClient

from marketplace.models import Task, TaskStatus
from tests.factories import make_dataset, post_task, zip_bytes

pytestmark = pytest.mark.django_db

TASKS = "/api/v1/tasks/"


def completed(task: Task) -> Task:
    Task.objects.filter(pk=task.pk).update(status=TaskStatus.COMPLETED)
    return task


def inference(kind: str, dataset: Any, source: Task) -> dict[str, Any]:
    """The body posting (or quoting) an inference task of ``source`` on ``dataset``."""
    return {"kind": kind, "budget": "100", "dataset": str(dataset.pk), "spec": {"source_task": str(source.pk)}}


def dataset_refusals(client: APIClient, body: dict[str, Any]) -> list[list[str]]:
    """The ``dataset`` errors of posting and of quoting ``body``: both must be 400s, and
    neither may write a task."""
    before = Task.objects.count()
    errors = []
    for url in (TASKS, f"{TASKS}quote/"):
        response = client.post(url, body, format="json")
        assert response.status_code == 400, response.json()
        errors.append(response.json()["dataset"])
    assert Task.objects.count() == before
    return errors


@pytest.mark.parametrize(
    ("kind", "fmt"),
    [("cube_inference", "npy"), ("asl_inference", "zip")],
)
def test_every_reason_a_source_task_is_refused(
    alice: Any, bob: Any, alice_client: APIClient, kind: str, fmt: str
) -> None:
    dataset = make_dataset(alice) if fmt == "npy" else make_dataset(alice, zip_bytes(), "in.zip")
    training = "cube_training" if kind == "cube_inference" else "asl_training"
    other_training = "asl_training" if training == "cube_training" else "cube_training"
    theirs = completed(post_task(bob, "synthetic", {"n": 64}))
    Task.objects.filter(pk=theirs.pk).update(kind=training)
    running = post_task(alice, "synthetic", {"n": 64})
    Task.objects.filter(pk=running.pk).update(kind=training)
    wrong_kind = completed(post_task(alice, "synthetic", {"n": 64}))
    other = completed(post_task(alice, "synthetic", {"n": 64}))
    Task.objects.filter(pk=other.pk).update(kind=other_training)
    cases = [
        (uuid.uuid4(), f"No {training} task of yours with this id."),
        (theirs.pk, f"No {training} task of yours with this id."),
        (running.pk, "That training task has not completed."),
        (wrong_kind.pk, f"That task is a synthetic task; {kind} needs a {training} task."),
        (other.pk, f"That task is a {other_training} task; {kind} needs a {training} task."),
    ]
    before = Task.objects.count()
    for source, message in cases:
        body = {"kind": kind, "budget": "100", "dataset": str(dataset.pk), "spec": {"source_task": str(source)}}
        response = alice_client.post(TASKS, body, format="json")
        assert response.status_code == 400, (source, response.json())
        assert response.json()["spec"]["source_task"] == [message]
    assert Task.objects.count() == before


def test_a_malformed_source_task_names_the_field(alice: Any, alice_client: APIClient) -> None:
    dataset = make_dataset(alice)
    body = {"kind": "cube_inference", "budget": "100", "dataset": str(dataset.pk), "spec": {"source_task": "nope"}}
    response = alice_client.post(TASKS, body, format="json")
    assert response.status_code == 400
    assert "source_task" in response.json()["spec"]


@pytest.mark.parametrize(
    ("array", "words"),
    [
        (np.zeros((4, 8), dtype=np.float32), "shape [4, 8], but the source model takes rows of teacher_dim 32"),
        (np.zeros((4, 32), dtype=np.int64), "dtype int64 is not a float type"),
        (np.zeros((32,), dtype=np.float32), "shape [32]"),
    ],
)
def test_cube_inference_inputs_must_fit_the_source_model(
    alice: Any, alice_client: APIClient, array: np.ndarray, words: str
) -> None:
    source = completed(post_task(alice, "cube_training", {"teacher_dim": 32, "synthetic_samples": 64}))
    buffer = io.BytesIO()
    np.save(buffer, array)
    dataset = make_dataset(alice, buffer.getvalue(), "inputs.npy")
    body = {
        "kind": "cube_inference",
        "budget": "100",
        "dataset": str(dataset.pk),
        "spec": {"source_task": str(source.pk)},
    }
    response = alice_client.post(TASKS, body, format="json")
    assert response.status_code == 400
    assert words in response.json()["dataset"][0]


def test_cube_inference_inputs_in_safetensors_are_checked_too(
    alice: Any, alice_client: APIClient, tmp_path: Any
) -> None:
    from safetensors.numpy import save_file

    source = completed(post_task(alice, "cube_training", {"teacher_dim": 32, "synthetic_samples": 64}))
    save_file({"embeddings": np.zeros((3, 16), dtype=np.float32)}, str(tmp_path / "in.safetensors"))
    dataset = make_dataset(alice, (tmp_path / "in.safetensors").read_bytes(), "in.safetensors")
    body = {
        "kind": "cube_inference",
        "budget": "100",
        "dataset": str(dataset.pk),
        "spec": {"source_task": str(source.pk)},
    }
    response = alice_client.post(TASKS, body, format="json")
    assert response.status_code == 400
    assert "shape [3, 16]" in response.json()["dataset"][0]
    save_file({"embeddings": np.zeros((3, 32), dtype=np.float32)}, str(tmp_path / "ok.safetensors"))
    good = make_dataset(alice, (tmp_path / "ok.safetensors").read_bytes(), "ok.safetensors")
    response = alice_client.post(TASKS, {**body, "dataset": str(good.pk)}, format="json")
    assert response.status_code == 201, response.json()


def test_a_safetensors_header_nested_too_deeply_is_refused_naming_the_dataset(
    alice: Any, alice_client: APIClient
) -> None:
    source = completed(post_task(alice, "cube_training", {"teacher_dim": 32, "synthetic_samples": 64}))
    header = b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    dataset = make_dataset(alice, len(header).to_bytes(8, "little") + header, "deep.safetensors")
    for errors in dataset_refusals(alice_client, inference("cube_inference", dataset, source)):
        assert "nested too deeply" in errors[0]
    # A float tensor without its data_offsets cannot be read (nor scanned for NaN): a 400 too.
    header = b'{"embeddings":{"dtype":"F32","shape":[2,32]}}'
    bare = make_dataset(alice, len(header).to_bytes(8, "little") + header + bytes(256), "bare.safetensors")
    refused = ["bare.safetensors: the header entry of tensor 'embeddings' lacks data_offsets."]
    assert dataset_refusals(alice_client, inference("cube_inference", bare, source)) == [refused] * 2


def test_cube_inference_inputs_shorter_than_their_header_are_refused(
    alice: Any, alice_client: APIClient, tmp_path: Any
) -> None:
    # The header says 1000 rows, the file holds two: no worker could load it.
    from safetensors.numpy import save_file

    source = completed(post_task(alice, "cube_training", {"teacher_dim": 32, "synthetic_samples": 64}))
    buffer = io.BytesIO()
    np.save(buffer, np.zeros((1000, 32), dtype=np.float32))
    cut_npy = buffer.getvalue()[: 128 + 2 * 32 * 4]
    save_file({"embeddings": np.zeros((1000, 32), dtype=np.float32)}, str(tmp_path / "in.safetensors"))
    whole = (tmp_path / "in.safetensors").read_bytes()
    cut_safetensors = whole[: len(whole) - 998 * 32 * 4]
    for content, name in ((cut_npy, "cut.npy"), (cut_safetensors, "cut.safetensors")):
        dataset = make_dataset(alice, content, name)
        too_short = f"{name}: the file is {len(content)} bytes, too short for the {1000 * 32 * 4}-byte tensor its header describes."
        assert dataset_refusals(alice_client, inference("cube_inference", dataset, source)) == [[too_short]] * 2


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_cube_inference_inputs_holding_nan_or_infinity_are_refused(
    alice: Any, alice_client: APIClient, tmp_path: Any, dtype: Any
) -> None:
    # Every worker would fail on them, losing reputation for the requester's data.
    from safetensors.numpy import save_file

    source = completed(post_task(alice, "cube_training", {"teacher_dim": 32, "synthetic_samples": 64}))
    rows = np.ones((5000, 32), dtype=dtype)
    rows[4321, 7] = np.nan
    buffer = io.BytesIO()
    np.save(buffer, rows)
    rows[4321, 7] = -np.inf
    save_file({"embeddings": rows, "other": np.zeros(3, dtype=np.float32)}, str(tmp_path / "in.safetensors"))
    for content, name in (
        (buffer.getvalue(), "nan.npy"),
        ((tmp_path / "in.safetensors").read_bytes(), "nan.safetensors"),
    ):
        dataset = make_dataset(alice, content, name)
        refused = [f"{name}: row 4321 holds NaN or infinite values."]
        assert dataset_refusals(alice_client, inference("cube_inference", dataset, source)) == [refused] * 2
    # Clean inputs of the same shape are taken, in either format.
    rows[4321, 7] = 1.0
    clean = io.BytesIO()
    np.save(clean, rows)
    body = inference("cube_inference", make_dataset(alice, clean.getvalue(), "clean.npy"), source)
    assert alice_client.post(f"{TASKS}quote/", body, format="json").status_code == 200


@pytest.mark.parametrize(
    ("files", "words"),
    [
        ({"readme.txt": b"no sequences here"}, "in.zip: holds no .parquet sequence files."),
        ({"train.csv": b"path,participant_id,sequence_id,sign\n"}, "in.zip: train.csv: lists no sequences."),
        (
            {"train.csv": b"path,participant_id,sequence_id,sign\nmissing.parquet,1,2,hello\n"},
            "in.zip: train.csv line 2: sequence file 'missing.parquet' is missing from the dataset.",
        ),
        (
            {
                "train.csv": b"path,participant_id,sequence_id,sign\na.parquet,1,2,hello\na.parquet,1,3,bye\n",
                "a.parquet": b"not read at posting",
            },
            "in.zip: train.csv line 3: sequence file 'a.parquet' is listed twice (first on line 2).",
        ),
    ],
)
def test_asl_inference_inputs_must_hold_sequences(
    alice: Any, alice_client: APIClient, files: dict[str, bytes], words: str
) -> None:
    # Checked before any money is held or any worker is sent a job it can only fail.
    source = completed(post_task(alice, "synthetic", {"n": 64}))
    Task.objects.filter(pk=source.pk).update(kind="asl_training")
    dataset = make_dataset(alice, zip_bytes(files), "in.zip")
    assert dataset_refusals(alice_client, inference("asl_inference", dataset, source)) == [[words]] * 2


def test_the_inference_form_tells_same_titled_training_runs_apart(alice: Any, bob: Any) -> None:
    """Untitled runs all carry their kind's label: the choices add when each finished and
    its id, newest first; nobody else's runs are offered."""
    from datetime import timedelta

    from django.test import Client
    from django.urls import reverse
    from django.utils import timezone

    older, newer = (post_task(alice, "cube_training", {"synthetic_samples": 64}) for _ in range(2))
    theirs = completed(post_task(bob, "cube_training", {"synthetic_samples": 64}))
    now = timezone.now()
    for task, ago in ((older, 2), (newer, 1)):
        Task.objects.filter(pk=task.pk).update(status=TaskStatus.COMPLETED, finished_at=now - timedelta(hours=ago))
    client = Client()
    client.force_login(alice)
    page = client.get(reverse("task-post", args=["cube_inference"])).content.decode()
    labels = [
        f"Cube training · finished {(now - timedelta(hours=ago)):%Y-%m-%d %H:%M} UTC · {str(task.pk)[:8]}"
        for task, ago in ((newer, 1), (older, 2))
    ]
    assert labels[0] in page
    assert labels[1] in page
    assert page.index(labels[0]) < page.index(labels[1])
    assert str(theirs.pk) not in page
