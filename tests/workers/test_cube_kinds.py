"""The cube kinds on the platform side, in-process: the held-out split the worker never
gets, the model download for inference, and the verifiers refusing tampered work."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from rest_framework.exceptions import ValidationError
from rest_framework.test import APIClient
from safetensors.numpy import load, save_file

from ledger import services as ledger
from ledger.units import UNITS_PER_CREDIT
from marketplace.models import Task, TaskStatus
from tests.factories import CAPS, TINY_CUBE, array_npy, assign, make_dataset, make_worker, post_task
from training import kinds
from training.cube.data import synthetic_embeddings
from training.cube.run import infer, run
from training.cube.split import load_heldout, prepare
from workers.agent import capabilities, runners
from workers.assignments import heldout, jobs, scheduler
from workers.models import Assignment
from workers.verification.base import quality_bar as quality_bar_of
from workers.verification.cube import verify_cube_inference, verify_cube_training

# The held-out bar alone: the proof of training has its own tests (test_training_proof*.py).
quality_bar = quality_bar_of(verify_cube_training)

pytestmark = pytest.mark.django_db

CUBE_CAPS = {**CAPS, "kinds": ["synthetic", "cube_training", "cube_inference"]}
ROWS = 200


def teacher() -> np.ndarray:
    return synthetic_embeddings(ROWS, 32, seed=7)[0]


def sha256(path: Path) -> str:
    return runners.sha256_file(path)


def platform_seed(upload: Path) -> bytes:
    """The secret seed the platform draws the held-out rows of this upload with."""
    return heldout.dataset_seed(sha256(upload))


class Provider:
    """A registered node as the platform sees it: worker row and REST client."""

    def __init__(self, owner: Any, name: str, reputation: int = 50) -> None:
        self.worker, token, self.key = make_worker(owner, name=name, caps=CUBE_CAPS, reputation=reputation)
        self.client = APIClient()
        self.client.credentials(HTTP_AUTHORIZATION=f"Worker {token}")

    def get(self, assignment: Assignment, tail: str = "") -> Any:
        return self.client.get(f"/api/v1/assignments/{assignment.pk}/{tail}")


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model trained on exactly what the platform serves the worker for ``teacher()``."""
    root = tmp_path_factory.mktemp("cube-model")
    (root / "upload.npy").write_bytes(array_npy(teacher()))  # the bytes training_task uploads
    worker_file, _ = prepare(TINY_CUBE, root / "upload.npy", root / "split", platform_seed(root / "upload.npy"))
    assert worker_file is not None
    data = root / "data"
    data.mkdir()
    shutil.copy(worker_file, data / "embeddings.npy")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        metrics = run(TINY_CUBE, data, root / "model")
    finally:
        torch.set_num_threads(threads)
    (root / "model" / "reported.json").write_text(json.dumps({"val_loss": metrics["val_loss"]}))
    return root / "model"


@pytest.fixture
def alpha(alice: Any) -> Provider:
    return Provider(alice, "alpha", reputation=90)


@pytest.fixture
def beta(alice: Any) -> Provider:
    return Provider(alice, "beta", reputation=10)


def training_task(owner: Any, array: np.ndarray | None = None, **spec: Any) -> Task:
    dataset = make_dataset(owner, array_npy(teacher() if array is None else array), "teacher.npy")
    return post_task(owner, "cube_training", {**TINY_CUBE, **spec}, dataset=dataset.pk, budget=10 * UNITS_PER_CREDIT)


# --- The held-out split ----------------------------------------------------------------


def test_the_worker_is_served_only_rows_the_platform_does_not_hold_out(bob: Any, alpha: Provider) -> None:
    data = teacher()
    task = training_task(bob, data)
    assignment = assign(task)

    job = alpha.get(assignment).json()
    served = alpha.get(assignment, "dataset/")
    assert served.status_code == 200
    body = b"".join(served.streaming_content)
    assert job["dataset"]["size_bytes"] == len(body)
    assert job["dataset"]["format"] == "npy"
    worker_rows = np.load(io.BytesIO(body), allow_pickle=False)
    held_rows, targets = load_heldout(heldout.prepared(task).heldout_path())  # type: ignore[union-attr]
    assert targets is None

    def keys(rows: np.ndarray) -> set[bytes]:
        return {row.tobytes() for row in rows}

    assert len(held_rows) == 20  # a tenth
    assert keys(worker_rows).isdisjoint(keys(held_rows))
    assert keys(worker_rows) | keys(held_rows) == keys(data)
    # The upload itself is never what the worker downloads.
    assert body != task.dataset.file.open("rb").read()  # type: ignore[union-attr]


def test_dialogue_pairs_stay_aligned_on_both_sides(bob: Any, alpha: Provider, tmp_path: Path) -> None:
    inputs = teacher()
    save_file({"embeddings": inputs, "targets": -inputs}, str(tmp_path / "pairs.safetensors"))
    dataset = make_dataset(bob, (tmp_path / "pairs.safetensors").read_bytes(), "pairs.safetensors")
    task = post_task(
        bob, "cube_training", {**TINY_CUBE, "mode": "dialogue"}, dataset=dataset.pk, budget=UNITS_PER_CREDIT
    )
    assignment = assign(task)
    served = load(b"".join(alpha.get(assignment, "dataset/").streaming_content))
    np.testing.assert_array_equal(served["targets"], -served["embeddings"])
    held, targets = load_heldout(heldout.prepared(task).heldout_path())  # type: ignore[union-attr]
    assert targets is not None
    np.testing.assert_array_equal(targets, -held)
    assert len(served["embeddings"]) + len(held) == ROWS


def test_synthetic_data_sends_no_dataset_and_holds_out_another_stream(bob: Any, alpha: Provider) -> None:
    task = post_task(bob, "cube_training", {**TINY_CUBE, "synthetic_samples": 64}, budget=UNITS_PER_CREDIT)
    assignment = assign(task)
    assert alpha.get(assignment).json()["dataset"] is None
    assert alpha.get(assignment, "dataset/").status_code == 404
    held, _ = load_heldout(heldout.prepared(task).heldout_path())  # type: ignore[union-attr]
    train, _ = synthetic_embeddings(64, 32, seed=1)
    assert held.shape == (256, 32)
    assert {r.tobytes() for r in held}.isdisjoint({r.tobytes() for r in train})


NAN_ROWS = np.zeros((40, 32), dtype=np.float32)
NAN_ROWS[7, 3] = np.nan


@pytest.mark.parametrize(
    ("array", "spec", "words"),
    [
        (np.zeros((40, 8), dtype=np.float32), {}, "shape [40, 8], but this spec takes rows of teacher_dim 32"),
        (np.zeros((4, 4, 4), dtype=np.float32), {}, "shape [4, 4, 4]"),
        (np.zeros((3, 32), dtype=np.float32), {}, "3 rows; at least 4 are needed"),
        (NAN_ROWS, {}, "row 7 holds NaN or infinite values"),
        (np.zeros((40, 32), dtype=np.int32), {}, "dtype int32 is not a float type"),
        (np.zeros((40, 32), dtype=np.float32), {"mode": "dialogue"}, "dialogue mode needs paired targets"),
    ],
    ids=["teacher_dim", "3-D", "too few rows", "NaN", "integers", "dialogue without targets"],
)
def test_an_upload_the_split_would_refuse_is_refused_at_posting(
    bob: Any, array: np.ndarray, spec: dict[str, Any], words: str
) -> None:
    before = (ledger.balance(bob), Task.objects.count())
    with pytest.raises(ValidationError) as refused:
        training_task(bob, array, **spec)
    (message,) = refused.value.detail["dataset"]  # type: ignore[call-overload]
    assert str(message).startswith("teacher.npy: ")
    assert words in str(message)
    assert (ledger.balance(bob), Task.objects.count()) == before


def npy_with_header(header: str, version: bytes = b"\x01\x00", data: bytes = bytes(8 * 32 * 4)) -> bytes:
    text = header.encode()
    pad = 64 - (10 + len(text) + 1) % 64
    return (
        b"\x93NUMPY" + version + len(text + b" " * pad + b"\n").to_bytes(2, "little") + text + b" " * pad + b"\n" + data
    )


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (8, 32), }", b"\x04\x00"), "version"),
        (npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (True, 32), }"), "not made of integers"),
        (array_npy(np.zeros((8, 32), dtype=">f4")), "dtype >f4 is not a float type"),
    ],
    ids=["format version 4", "a boolean dimension", "big-endian"],
)
def test_an_npy_the_workers_cannot_load_is_a_400_not_a_500(
    bob: Any, alice_client: APIClient, content: bytes, words: str
) -> None:
    """Found by fuzzing: each was a 500 at posting, or a task every worker would fail."""
    client = APIClient()
    client.force_authenticate(bob)
    dataset = make_dataset(bob, content, "teacher.npy")
    for kind in ("cube_training",):
        body = {"kind": kind, "budget": "10", "dataset": str(dataset.pk), "spec": {**TINY_CUBE}}
        response = client.post("/api/v1/tasks/", body, format="json")
        assert response.status_code == 400, response.content[:300]
        assert words in response.json()["dataset"][0]


def test_a_refused_upload_is_read_once_however_often_it_is_checked(bob: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The post form checks its task on every pause in typing: a file found bad is not
    read whole again each time."""
    import training.cube.data

    reads: list[int] = []
    real = training.cube.data.first_non_finite_row

    def counted(array: np.ndarray, *args: Any, **kwargs: Any) -> int | None:
        reads.append(1)
        return real(array, *args, **kwargs)

    monkeypatch.setattr(training.cube.data, "first_non_finite_row", counted)
    dataset = make_dataset(bob, array_npy(NAN_ROWS), "teacher.npy")
    for _ in range(3):
        with pytest.raises(ValidationError, match="row 7 holds NaN"):
            post_task(bob, "cube_training", TINY_CUBE, dataset=dataset.pk, budget=10 * UNITS_PER_CREDIT)
    assert len(reads) == 1


def pairs(tmp_path: Path, **tensors: np.ndarray) -> bytes:
    save_file(tensors, str(tmp_path / "pairs.safetensors"))
    return (tmp_path / "pairs.safetensors").read_bytes()


@pytest.mark.parametrize(
    ("targets", "words"),
    [
        (None, "pairs.safetensors (targets): expected a 'targets' tensor."),
        (np.zeros((40, 8), dtype=np.float32), "(targets): shape [40, 8], but this spec takes rows of teacher_dim 32"),
        (np.zeros((39, 32), dtype=np.float32), "pairs.safetensors: 39 target rows but 40 embedding rows."),
        (np.zeros((40, 32), dtype=np.int32), "(targets): dtype I32 is not a float type"),
        (NAN_ROWS, "pairs.safetensors (targets): row 7 holds NaN or infinite values."),
    ],
    ids=["missing", "teacher_dim", "rows", "integers", "NaN"],
)
def test_dialogue_targets_the_split_would_refuse_are_refused_at_posting(
    bob: Any, tmp_path: Path, targets: np.ndarray | None, words: str
) -> None:
    tensors = {"embeddings": np.zeros((40, 32), dtype=np.float32)}
    if targets is not None:
        tensors["targets"] = targets
    dataset = make_dataset(bob, pairs(tmp_path, **tensors), "pairs.safetensors")
    before = (ledger.balance(bob), Task.objects.count())
    with pytest.raises(ValidationError) as refused:
        post_task(
            bob, "cube_training", {**TINY_CUBE, "mode": "dialogue"}, dataset=dataset.pk, budget=10 * UNITS_PER_CREDIT
        )
    (message,) = refused.value.detail["dataset"]  # type: ignore[call-overload]
    assert words in str(message)
    assert (ledger.balance(bob), Task.objects.count()) == before


def test_dialogue_pairs_are_taken_and_split_together(bob: Any, alpha: Provider, tmp_path: Path) -> None:
    data = teacher()
    dataset = make_dataset(bob, pairs(tmp_path, embeddings=data, targets=-data), "pairs.safetensors")
    task = post_task(
        bob, "cube_training", {**TINY_CUBE, "mode": "dialogue"}, dataset=dataset.pk, budget=10 * UNITS_PER_CREDIT
    )
    assert task.status == TaskStatus.OPEN
    assert len(scheduler.schedule(task.pk)) == 1
    inputs, targets = load_heldout(heldout.prepared(task).heldout_path())  # type: ignore[union-attr]
    assert targets is not None
    assert np.array_equal(targets, -inputs)


def test_an_unusable_upload_fails_the_task_with_a_full_refund_naming_it(
    bob: Any, alpha: Provider, tmp_path: Path
) -> None:
    """Posting read the upload and found it fit; the stored file is damaged before the
    split reads it (a disk, an operator): the task fails before any worker is offered it,
    naming the file as the requester uploaded it, and the budget comes back."""
    data = teacher()
    dataset = make_dataset(bob, pairs(tmp_path, embeddings=data, targets=data), "pairs.safetensors")
    before = ledger.balance(bob)
    task = post_task(
        bob, "cube_training", {**TINY_CUBE, "mode": "dialogue"}, dataset=dataset.pk, budget=10 * UNITS_PER_CREDIT
    )
    assert ledger.balance(bob) < before
    Path(dataset.file.path).write_bytes(pairs(tmp_path, embeddings=data))  # the targets are gone
    assert scheduler.schedule(task.pk) == []
    task.refresh_from_db()
    assert task.status == TaskStatus.FAILED
    assert "pairs.safetensors" in task.status_reason
    assert "targets" in task.status_reason
    assert "upload." not in task.status_reason
    assert ledger.balance(bob) == before
    assert not Assignment.objects.filter(task=task).exists()
    assert heldout.prepared(task) is None


def test_preparation_happens_once(bob: Any, alpha: Provider) -> None:
    task = training_task(bob)
    heldout.ensure_prepared(task.pk)
    first = heldout.prepared(task)
    heldout.ensure_prepared(task.pk)
    assert heldout.prepared(task) == first


def test_the_agent_advertises_exactly_the_kinds_it_has_runners_for() -> None:
    assert capabilities.detect()["kinds"] == list(kinds.KINDS)


# --- The model download for inference ------------------------------------------------


def completed_training(owner: Any, provider: Provider, model_dir: Path, task: Task | None = None) -> Task:
    """A training task (cube unless given) whose accepted result is ``model_dir`` (settled
    directly: the verification path is tested below and end to end)."""
    from marketplace.kinds import KINDS

    task = task or training_task(owner)
    assignment = assign(task)
    assert assignment.worker == provider.worker
    for name in KINDS[task.kind].model_files:
        default_storage.save(jobs.artifact_path(assignment, name), ContentFile((model_dir / name).read_bytes()))
    Assignment.objects.filter(pk=assignment.pk).update(state=Assignment.State.ACCEPTED)
    Task.objects.filter(pk=task.pk).update(status=TaskStatus.COMPLETED)
    return task


def inference_task(owner: Any, source: Task, rows: np.ndarray, samples: int = 4) -> Task:
    dataset = make_dataset(owner, array_npy(rows), "inputs.npy")
    spec = {"source_task": str(source.pk), "verify_samples": samples}
    return post_task(owner, "cube_inference", spec, dataset=dataset.pk, budget=UNITS_PER_CREDIT)


def test_only_the_assigned_worker_downloads_only_the_model_files(
    bob: Any, alpha: Provider, beta: Provider, trained: Path
) -> None:
    source = completed_training(bob, alpha, trained)
    assignment = assign(inference_task(bob, source, teacher()[:8]))
    assert assignment.worker == alpha.worker

    response = alpha.get(assignment, "model/model.safetensors/")
    assert response.status_code == 200
    weights = (trained / "model.safetensors").read_bytes()
    assert b"".join(response.streaming_content) == weights
    # A download that broke off asks for the rest.
    rest: Any = alpha.client.get(
        f"/api/v1/assignments/{assignment.pk}/model/model.safetensors/", HTTP_RANGE="bytes=100-"
    )
    assert rest.status_code == 206
    assert b"".join(rest.streaming_content) == weights[100:]
    assert alpha.get(assignment, "model/config.json/").status_code == 200
    for name in ("metrics.json", "outputs.npy", "..", "model.safetensors.bak"):
        assert alpha.get(assignment, f"model/{name}/").status_code == 404, name
    # Another worker, even of the same provider, is told the assignment does not exist.
    assert beta.get(assignment, "model/model.safetensors/").status_code == 404
    assert APIClient().get(f"/api/v1/assignments/{assignment.pk}/model/model.safetensors/").status_code in (401, 403)
    # Once the assignment is over, its model is closed.
    Assignment.objects.filter(pk=assignment.pk).update(state=Assignment.State.EXPIRED)
    assert alpha.get(assignment, "model/model.safetensors/").status_code == 409


def test_a_training_task_serves_no_model_download(bob: Any, alpha: Provider) -> None:
    assignment = assign(training_task(bob))
    assert alpha.get(assignment, "model/model.safetensors/").status_code == 404


# --- The verifiers -----------------------------------------------------------------------


def submitted(assignment: Assignment, artifact: Path, proof: dict[str, Any]) -> Assignment:
    assignment.result = {"compute_result": {"result_hash": sha256(artifact), "proof": proof}}
    return assignment


def copy_model(trained: Path, target: Path) -> Path:
    target.mkdir()
    for name in ("model.safetensors", "config.json", "metrics.json"):
        shutil.copy(trained / name, target / name)
    return target


def artifacts_of(model: Path) -> dict[str, Path]:
    return {name: model / name for name in ("model.safetensors", "config.json", "metrics.json")}


def honest_claim(task: Task, model: Path) -> int:
    """What an honest worker reports for ``model``: its loss on the worker's validation rows."""
    from training.cube.run import validation_loss
    from workers.verification.base import worker_data

    with worker_data(task) as data:
        return round(validation_loss(task.spec, data, model) * 1e6)


def reported_micro(trained: Path, factor: float = 1.0) -> int:
    return round(json.loads((trained / "reported.json").read_text())["val_loss"] * factor * 1e6)


def test_an_honest_model_is_accepted_on_the_held_out_rows(bob: Any, alpha: Provider, trained: Path) -> None:
    assignment = submitted(
        assign(training_task(bob)), trained / "model.safetensors", {"val_loss_micro": reported_micro(trained)}
    )
    verdict = quality_bar(assignment, artifacts_of(trained))
    assert verdict.ok, verdict.reason
    assert verdict.metrics["heldout_rows"] == 20
    assert verdict.metrics["heldout_val_loss"] < verdict.metrics["untrained_val_loss"]


def test_a_requester_may_ask_for_more_than_the_platforms_bar(bob: Any, alpha: Provider, trained: Path) -> None:
    """``min_loss_reduction`` raises the bar for this task (a value under the platform's
    floor leaves the floor); the worker never sees it: it is the platform's to check."""
    task = training_task(bob, min_loss_reduction=99)
    assignment = assign(task)
    assert "min_loss_reduction" not in jobs.describe(assignment)["spec"]
    assert task.spec["min_loss_reduction"] == 99
    verdict = quality_bar(
        submitted(assignment, trained / "model.safetensors", {"val_loss_micro": reported_micro(trained)}),
        artifacts_of(trained),
    )
    assert not verdict.ok  # the model the platform's 20 % takes (above)
    assert "training must remove at least 99%" in verdict.reason
    assert not verdict.penalise  # an honest claim that fell short of the requester's bar


def test_a_wrong_reported_loss_is_rejected(bob: Any, alpha: Provider, trained: Path) -> None:
    assignment = submitted(
        assign(training_task(bob)), trained / "model.safetensors", {"val_loss_micro": reported_micro(trained, 0.3)}
    )
    verdict = quality_bar(assignment, artifacts_of(trained))
    assert not verdict.ok
    assert "differs from reported" in verdict.reason
    assert verdict.penalise  # a false claim costs reputation


def test_a_proof_without_the_integer_loss_is_rejected(bob: Any, alpha: Provider, trained: Path) -> None:
    assignment = submitted(assign(training_task(bob)), trained / "model.safetensors", {"val_loss": 0.1})
    verdict = quality_bar(assignment, artifacts_of(trained))
    assert not verdict.ok
    assert "val_loss_micro" in verdict.reason


def test_a_tampered_model_is_rejected(bob: Any, alpha: Provider, trained: Path, tmp_path: Path) -> None:
    model = copy_model(trained, tmp_path / "tampered")
    tensors = load((model / "model.safetensors").read_bytes())
    tensors = {k: (v * 3.0 if v.dtype.kind == "f" else v) for k, v in tensors.items()}
    save_file(tensors, str(model / "model.safetensors"))
    task = training_task(bob)
    assignment = assign(task)

    # Committed to the honest file, uploaded the tampered one.
    honest = submitted(assignment, trained / "model.safetensors", {"val_loss_micro": reported_micro(trained)})
    verdict = quality_bar(honest, artifacts_of(model))
    assert not verdict.ok
    assert "result_hash" in verdict.reason

    # Committed to the tampered file, claiming the honest loss.
    lying = submitted(assignment, model / "model.safetensors", {"val_loss_micro": reported_micro(trained)})
    verdict = quality_bar(lying, artifacts_of(model))
    assert not verdict.ok
    assert "differs from reported" in verdict.reason


def test_a_model_other_than_the_spec_is_rejected(bob: Any, alpha: Provider, trained: Path, tmp_path: Path) -> None:
    model = copy_model(trained, tmp_path / "other")
    config = json.loads((model / "config.json").read_text())
    config["loss_weights"]["reconstruction"] = 0.0  # a cheaper loss to report
    (model / "config.json").write_text(json.dumps(config))
    assignment = submitted(
        assign(training_task(bob)), model / "model.safetensors", {"val_loss_micro": reported_micro(trained)}
    )
    verdict = quality_bar(assignment, artifacts_of(model))
    assert not verdict.ok
    assert "loss_weights" in verdict.reason


def test_an_untrained_model_honestly_reported_is_rejected(
    bob: Any, alpha: Provider, trained: Path, tmp_path: Path
) -> None:
    from training.artifacts import model_tensors, save_tensors
    from training.cube.config import CubeConfig
    from training.cube.model import CubeModel
    from training.cube.run import training_spec

    task = training_task(bob)
    assignment = assign(task)
    model = copy_model(trained, tmp_path / "untrained")
    torch.manual_seed(TINY_CUBE["seed"])
    save_tensors(model / "model.safetensors", model_tensors(CubeModel(CubeConfig.from_dict(training_spec(TINY_CUBE)))))
    verdict = quality_bar(
        submitted(assignment, model / "model.safetensors", {"val_loss_micro": honest_claim(task, model)}),
        artifacts_of(model),
    )
    assert not verdict.ok
    assert "no better than untrained" in verdict.reason
    assert not verdict.penalise  # the claim was true: not paid, but not a lie


def test_a_barely_trained_model_honestly_reported_is_not_paid(bob: Any, alpha: Provider, tmp_path: Path) -> None:
    task = training_task(bob)
    assignment = assign(task)
    # The worker's rows, trained for one optimiser step at a high rate instead of the
    # spec's 3 epochs: the model's config is still the spec's (the schedule is not in it).
    (tmp_path / "upload.npy").write_bytes(array_npy(teacher()))
    worker_file, _ = prepare(
        TINY_CUBE, tmp_path / "upload.npy", tmp_path / "split", platform_seed(tmp_path / "upload.npy")
    )
    assert worker_file is not None
    (tmp_path / "data").mkdir()
    shutil.copy(worker_file, tmp_path / "data" / "embeddings.npy")
    cheat = {**TINY_CUBE, "epochs": 1, "warmup_steps": 0, "learning_rate": 1e-2}
    run(cheat, tmp_path / "data", tmp_path / "model", max_steps_per_epoch=1)
    claim = honest_claim(task, tmp_path / "model")
    verdict = quality_bar(
        submitted(assignment, tmp_path / "model" / "model.safetensors", {"val_loss_micro": claim}),
        artifacts_of(tmp_path / "model"),
    )
    assert not verdict.ok
    # Better than untrained, which was enough before, but not by the 20 % required.
    assert verdict.metrics["heldout_val_loss"] < verdict.metrics["untrained_val_loss"]
    assert "training must remove at least 20%" in verdict.reason
    assert not verdict.penalise


def test_inference_outputs_are_spot_checked(bob: Any, alpha: Provider, trained: Path, tmp_path: Path) -> None:
    source = completed_training(bob, alpha, trained)
    rows = synthetic_embeddings(12, 32, seed=7, stream=3)[0]
    task = inference_task(bob, source, rows, samples=12)
    assignment = assign(task)
    outputs = infer(trained, rows, batch_size=5)

    def check(array: np.ndarray) -> Any:
        path = tmp_path / "outputs.npy"
        np.save(path, array)
        return verify_cube_inference(submitted(assignment, path, {"rows": len(array)}), {"outputs.npy": path})

    honest = check(outputs)
    assert honest.ok, honest.reason
    assert honest.metrics["rows_checked"] == 12

    tampered = outputs.copy()
    tampered[5] += 0.01
    verdict = check(tampered)
    assert not verdict.ok
    assert "recomputed rows differ" in verdict.reason
    assert not check(outputs[:6]).ok
    assert "dtype" in check(outputs.astype(np.int64)).reason


def test_a_pickled_output_is_refused_unread(bob: Any, alpha: Provider, trained: Path, tmp_path: Path) -> None:
    source = completed_training(bob, alpha, trained)
    assignment = assign(inference_task(bob, source, teacher()[:4]))
    path = tmp_path / "outputs.npy"
    np.save(path, np.array([{"evil": 1}], dtype=object), allow_pickle=True)
    verdict = verify_cube_inference(submitted(assignment, path, {}), {"outputs.npy": path})
    assert not verdict.ok
    assert "not a readable array" in verdict.reason


def test_one_spot_checked_row_is_enough_to_accept(bob: Any, alpha: Provider, trained: Path, tmp_path: Path) -> None:
    # verify_samples=1 is allowed: the one recomputed row must not be refused as "too few rows".
    source = completed_training(bob, alpha, trained)
    rows = synthetic_embeddings(12, 32, seed=7, stream=3)[0]
    assignment = assign(inference_task(bob, source, rows, samples=1))
    path = tmp_path / "outputs.npy"
    np.save(path, infer(trained, rows))
    verdict = verify_cube_inference(submitted(assignment, path, {}), {"outputs.npy": path})
    assert verdict.ok, verdict.reason
    assert verdict.metrics["rows_checked"] == 1


def test_a_single_input_row_runs_on_the_agent_and_is_accepted(
    bob: Any, alpha: Provider, trained: Path, tmp_path: Path
) -> None:
    # The posting check takes one row; the agent and the verifier must take it too.
    source = completed_training(bob, alpha, trained)
    row = synthetic_embeddings(4, 32, seed=7, stream=3)[0][:1]
    task = inference_task(bob, source, row, samples=1)
    assignment = assign(task)
    work = tmp_path / "work"
    work.mkdir()
    np.save(work / "dataset.npy", row)

    def fetch(url: str, target: Path) -> None:
        shutil.copy(trained / url.rstrip("/").rsplit("/", 1)[1], target)

    job = {"id": str(assignment.pk), "kind": "cube_inference", "spec": task.spec, "dataset": {"format": "npy"}}
    outcome = runners.run({**job, "fetch": fetch}, work, lambda *args: None)
    path = outcome.artifacts["outputs.npy"]
    assert np.load(path).shape == (1, 32)
    verdict = verify_cube_inference(submitted(assignment, path, {}), {"outputs.npy": path})
    assert verdict.ok, verdict.reason


def test_non_finite_outputs_are_refused_outside_the_spot_checked_rows(
    bob: Any, alpha: Provider, trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A model fed finite rows gives finite rows: a NaN anywhere is a wrong result, whichever
    # rows the spot check happens to pick (fixed here, so the NaNs miss them all).
    monkeypatch.setattr("workers.verification.base.spot_check_seed", lambda assignment: 1234)
    source = completed_training(bob, alpha, trained)
    rows = synthetic_embeddings(40, 32, seed=7, stream=3)[0]
    assignment = assign(inference_task(bob, source, rows, samples=4))
    checked = np.random.default_rng(1234).choice(40, size=4, replace=False)
    outputs = infer(trained, rows)
    for value in (np.nan, np.inf):
        wrong = np.full_like(outputs, value)
        wrong[checked] = outputs[checked]
        path = tmp_path / "outputs.npy"
        np.save(path, wrong)
        verdict = verify_cube_inference(submitted(assignment, path, {}), {"outputs.npy": path})
        assert not verdict.ok
        assert "NaN or infinite" in verdict.reason


def _lattice_free_model(trained: Path, target: Path) -> Path:
    """The cheat that skips the lattice: the spec's model trained with 0 lattice steps on the
    worker's rows (cheaper by the whole lattice), saved beside the honest config.json."""
    from training.artifacts import model_tensors, save_tensors
    from training.cube.config import CubeConfig
    from training.cube.losses import DEFAULT_WEIGHTS, total_loss
    from training.cube.model import CubeModel
    from training.cube.run import training_spec

    model_dir = copy_model(trained, target)
    torch.manual_seed(TINY_CUBE["seed"])
    model = CubeModel(CubeConfig.from_dict(training_spec(TINY_CUBE)))
    rows = torch.from_numpy(teacher())
    optimiser = torch.optim.AdamW(model.parameters(), lr=TINY_CUBE["learning_rate"])
    for _ in range(TINY_CUBE["epochs"]):
        for start in range(0, len(rows), TINY_CUBE["batch_size"]):
            batch = rows[start : start + TINY_CUBE["batch_size"]]
            loss, _ = total_loss(model(batch, steps=0), batch, DEFAULT_WEIGHTS)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
    save_tensors(model_dir / "model.safetensors", model_tensors(model))
    return model_dir


def test_a_model_trained_without_its_lattice_is_rejected(
    bob: Any, alpha: Provider, trained: Path, tmp_path: Path
) -> None:
    from training.cube.run import verify

    task = training_task(bob)
    assignment = assign(task)
    held, targets = load_heldout(heldout.prepared(task).heldout_path())  # type: ignore[union-attr]
    model = _lattice_free_model(trained, tmp_path / "no-lattice")

    # Claiming the honest model's figure: the spec's 3 lattice steps recompute another.
    verdict = quality_bar(
        submitted(assignment, model / "model.safetensors", {"val_loss_micro": reported_micro(trained)}),
        artifacts_of(model),
    )
    assert not verdict.ok
    assert "differs from reported" in verdict.reason
    assert verdict.penalise

    # Reported truthfully at the spec's 3 steps, it is not paid: the lattice it skipped is
    # what carries the input to the output face.
    honest = float(verify(model, held, targets, {"val_loss": 1.0})["recomputed"]["val_loss"])
    trained_loss = float(verify(trained, held, targets, {"val_loss": 1.0})["recomputed"]["val_loss"])
    assert trained_loss < 0.7 * honest
    verdict = quality_bar(
        submitted(assignment, model / "model.safetensors", {"val_loss_micro": honest_claim(task, model)}),
        artifacts_of(model),
    )
    assert not verdict.ok, verdict.metrics
    assert "no better than predicting the mean row" in verdict.reason
    assert not verdict.penalise  # a true claim: not paid, not a lie


@pytest.mark.parametrize("steps", [0, 1])
def test_a_config_claiming_other_lattice_steps_is_rejected(
    bob: Any, alpha: Provider, trained: Path, tmp_path: Path, steps: int
) -> None:
    model = copy_model(trained, tmp_path / "steps")
    config = json.loads((model / "config.json").read_text())
    config["steps"] = steps
    (model / "config.json").write_text(json.dumps(config))
    verdict = quality_bar(
        submitted(assign(training_task(bob)), model / "model.safetensors", {"val_loss_micro": reported_micro(trained)}),
        artifacts_of(model),
    )
    assert not verdict.ok
    assert "steps" in verdict.reason


def test_a_lattice_too_shallow_for_its_size_is_refused_naming_steps(bob: Any) -> None:
    from marketplace.kinds import KINDS

    cube = KINDS["cube_training"]
    with pytest.raises(ValidationError) as refused:
        cube.validate_spec({**TINY_CUBE, "lattice_edge": 8, "steps": 3})
    detail: Any = refused.value.detail
    assert "at least 4" in str(detail["steps"][0])
    # 0 asks for the fewest steps that reach; the price counts the steps really run.
    auto = cube.validate_spec({**TINY_CUBE, "lattice_edge": 8, "steps": 0})
    explicit = cube.validate_spec({**TINY_CUBE, "lattice_edge": 8, "steps": 4})
    assert cube.flops(auto) == cube.flops(explicit) > 0


def test_a_task_stored_with_the_retired_loss_weights_still_verifies(bob: Any, alpha: Provider, trained: Path) -> None:
    task = training_task(bob)
    Task.objects.filter(pk=task.pk).update(
        spec={**task.spec, "loss_emergence": 0.05, "loss_dynamics": 0.05, "loss_spatial": 0.05}
    )
    task.refresh_from_db()
    assignment = submitted(assign(task), trained / "model.safetensors", {"val_loss_micro": reported_micro(trained)})
    verdict = quality_bar(assignment, artifacts_of(trained))
    assert verdict.ok, verdict.reason


def test_a_cube_job_reports_held_out_figures_beside_its_training_ones(
    bob: Any, alpha: Provider, tmp_path: Path
) -> None:
    """The task page charts each term with its validation twin: after the first epoch every
    step the node reports carries the latest held-out figures, within the socket's cap."""
    from workers.api.node_socket import MAX_METRICS

    task = post_task(bob, "cube_training", {**TINY_CUBE, "synthetic_samples": 64}, budget=UNITS_PER_CREDIT)
    job = alpha.get(assign(task)).json()
    reports: list[dict[str, Any]] = []
    runners.run(job, tmp_path, lambda step, total, metrics: reports.append(dict(metrics)))
    assert "val_loss" not in reports[0]  # nothing held out is measured before an epoch ends
    late = reports[-1]
    assert {"val_loss", "val_reconstruction", "val_cosine"} <= set(late)
    assert {"loss", "reconstruction", "cosine"} <= set(late)
    assert max(len(metrics) for metrics in reports) <= MAX_METRICS
