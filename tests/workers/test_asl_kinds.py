"""The ASL kinds on the platform side, in-process: the participant-disjoint held-out split the
worker never gets, and the verifiers refusing wrong claims and tampered work."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from uuid import uuid4

import pytest
import torch
from django.core.files.storage import default_storage
from rest_framework.exceptions import ValidationError

from ledger import services as ledger
from ledger.units import UNITS_PER_CREDIT
from marketplace.models import Task, TaskStatus
from tests.factories import CAPS, TINY_ASL, assign, make_dataset, post_task
from tests.workers.test_cube_kinds import Provider, completed_training, submitted
from training.asl.infer import predict
from training.asl.run import run
from training.asl.split import prepare
from training.asl.synthetic import generate
from training.virtualzip import RECIPE_SUFFIX, UPLOAD_NAME, VirtualZipError, attach
from workers.agent import runners
from workers.assignments import heldout
from workers.verification.asl import verify_asl_inference, verify_asl_training
from workers.verification.base import quality_bar as quality_bar_of

# The held-out bar alone: the proof of training has its own tests (test_training_proof*.py).
quality_bar = quality_bar_of(verify_asl_training)

pytestmark = pytest.mark.django_db

ASL_CAPS = {**CAPS, "kinds": ["asl_training", "asl_inference"]}
SPEC: dict[str, Any] = dict(TINY_ASL)
MODEL_FILES = ("model.safetensors", "config.json", "labels.json", "metrics.json")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("asl-data")
    return generate(root / "signs.zip", n_signs=5, n_participants=5, per_participant=2, max_frames=20, as_zip=True)


@pytest.fixture(scope="module")
def trained(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model trained on exactly what the platform serves the worker for ``dataset``."""
    root = tmp_path_factory.mktemp("asl-model")
    worker_share, _ = prepare(SPEC, dataset, root / "split", heldout.dataset_seed(runners.sha256_file(dataset)))
    assert worker_share is not None
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with attach(worker_share, dataset) as readable:
            metrics = run(SPEC, readable, root / "model", cache_dir=root / "cache", resume=False)
    finally:
        torch.set_num_threads(threads)
    (root / "model" / "reported.json").write_text(json.dumps({"val_top1": metrics["val_top1"]}))
    return root / "model"


class AslProvider(Provider):
    def __init__(self, owner: Any, name: str, reputation: int = 50) -> None:
        super().__init__(owner, name, reputation)
        self.worker.capabilities = ASL_CAPS
        self.worker.save(update_fields=["capabilities"])


@pytest.fixture
def alpha(alice: Any) -> AslProvider:
    return AslProvider(alice, "alpha", reputation=90)


def training_task(owner: Any, archive: Path, **spec: Any) -> Task:
    upload = make_dataset(owner, archive.read_bytes(), "signs.zip")
    return post_task(owner, "asl_training", {**SPEC, **spec}, dataset=upload.pk, budget=10 * UNITS_PER_CREDIT)


def index(archive: zipfile.ZipFile) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(archive.read("train.csv").decode())))


# --- The held-out split ----------------------------------------------------------------


def streamed(response: Any) -> bytes:
    return b"".join(response.streaming_content)


def served_folder(provider: AslProvider, assignment: Any, target: Path) -> Path:
    """Download the assignment's dataset in shards as a node does: the manifest the job
    names, then every file it lists, each checked against the manifest."""
    job = provider.get(assignment).json()
    assert job["dataset"]["format"] == "shards"
    response = provider.get(assignment, "dataset/")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    manifest = response.content
    assert (len(manifest), hashlib.sha256(manifest).hexdigest()) == (
        job["dataset"]["size_bytes"],
        job["dataset"]["sha256"],
    )
    target.mkdir()
    for entry in json.loads(manifest)["files"]:
        got = provider.client.get(entry["url"])
        assert got.status_code == 200
        body = streamed(got)
        assert (len(body), hashlib.sha256(body).hexdigest()) == (entry["size_bytes"], entry["sha256"])
        (target / entry["name"]).write_bytes(body)
    return target


def members(folder: Path) -> set[str]:
    from training.asl.source import Source

    with Source(folder) as share:
        return set(share.files(".parquet"))


def folder_index(folder: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO((folder / "train.csv").read_text())))


def test_the_worker_never_receives_a_held_out_participant(
    bob: Any, alpha: AslProvider, dataset: Path, tmp_path: Path
) -> None:
    task = training_task(bob, dataset)
    assignment = assign(task)
    served = served_folder(alpha, assignment, tmp_path / "served")
    split = heldout.prepared(task)
    assert split is not None
    original = zipfile.ZipFile(dataset)
    with heldout.readable(task, split.heldout) as held:
        held_rows = folder_index(held)
        held_files = members(held)
    held_people = {row["participant_id"] for row in held_rows}
    served_people = {row["participant_id"] for row in folder_index(served)}
    assert len(held_people) == 1
    assert len(served_people) == 4
    assert served_people.isdisjoint(held_people)
    # Not one sequence file of a held-out participant rides along in the worker's shards.
    data_files = members(served)
    assert held_files
    assert data_files.isdisjoint(held_files)
    assert data_files == {row["path"] for row in folder_index(served)}
    assert len(folder_index(served)) + len(held_rows) == len(index(original))
    # Both carry the whole label map, so the worker's model has a class for every sign.
    sign_map = "sign_to_prediction_index_map.json"
    assert (served / sign_map).read_bytes() == (split.heldout_path() / sign_map).read_bytes()


def test_a_batch_the_spec_leaves_to_the_node_is_the_one_it_is_sent_and_checked_against(
    bob: Any, alpha: AslProvider, dataset: Path
) -> None:
    """batch_size 0: the node's registered GPU presets its micro-batch. An 80 GB card
    presets 72 where the platform's CPU presets 12, so a plan made on the platform's own
    preset would reject the honest GPU run for its step count; the node is sent its batch,
    and the platform plans (and re-executes) its run with the same spec."""
    from marketplace.kinds import KINDS
    from training.asl.run import training_plan
    from training.asl.spec import TrainSpec, preset_batch
    from workers.assignments.jobs import node_spec
    from workers.verification.base import worker_data

    gpu = {**ASL_CAPS, "gpu_memory_bytes": 80 * 10**9}
    alpha.worker.capabilities = gpu
    alpha.worker.save(update_fields=["capabilities"])
    task = training_task(bob, dataset, batch_size=0, max_len=384, blocks=2)
    assert task.spec["batch_size"] == 0
    on_gpu, _ = preset_batch(TrainSpec.from_dict(task.spec), gpu)
    on_cpu, _ = preset_batch(TrainSpec.from_dict(task.spec), None)
    assert (on_gpu, on_cpu) == (72, 12)
    assignment = assign(task)
    job = alpha.get(assignment).json()
    assert job["spec"]["batch_size"] == on_gpu
    assert node_spec(assignment) == job["spec"]
    with worker_data(task) as share:
        assert training_plan(node_spec(assignment), share) == training_plan({**task.spec, "batch_size": on_gpu}, share)
    # An explicit batch is the spec's, whatever the node.
    assert KINDS["asl_training"].node_spec({**task.spec, "batch_size": 5}, gpu)["batch_size"] == 5


def first_shard(provider: AslProvider, assignment: Any) -> dict[str, Any]:
    files = json.loads(provider.get(assignment, "dataset/").content)["files"]
    return next(f for f in files if f["name"].startswith("shard-"))


def test_a_shard_is_served_by_byte_ranges(bob: Any, alpha: AslProvider, dataset: Path) -> None:
    assignment = assign(training_task(bob, dataset))
    shard = first_shard(alpha, assignment)
    whole = alpha.client.get(shard["url"])
    assert whole["Accept-Ranges"] == "bytes"
    body = streamed(whole)
    size = len(body)
    for asked, start, end in [
        ("bytes=10-99", 10, 99),
        ("bytes=100-", 100, size - 1),
        ("bytes=-50", size - 50, size - 1),
    ]:
        part = alpha.client.get(shard["url"], HTTP_RANGE=asked)
        assert part.status_code == 206, asked
        assert part["Content-Range"] == f"bytes {start}-{end}/{size}"
        assert part["Content-Length"] == str(end - start + 1)
        assert streamed(part) == body[start : end + 1]
    # Past the end clipped to the end; a start past the end, backwards or several ranges: 416.
    assert alpha.client.get(shard["url"], HTTP_RANGE=f"bytes={size - 5}-{size + 100}")["Content-Range"] == (
        f"bytes {size - 5}-{size - 1}/{size}"
    )
    huge = "9" * 5000  # more digits than int() converts: a 416 or the whole file, never a 500
    for bad in (
        f"bytes={size}-",
        "bytes=20-10",
        "bytes=0-1,5-6",
        "bytes=-0",
        "bytes=x-",
        f"bytes={huge}-",
        "bytes=\u0663-",  # an Arabic-Indic 3: digits are ASCII
    ):
        refused = alpha.client.get(shard["url"], HTTP_RANGE=bad)
        assert refused.status_code == 416, bad[:20]
        assert refused["Content-Range"] == f"bytes */{size}"
    for asked in (f"bytes=0-{huge}", f"bytes=-{huge}", f"bytes={'0' * 5000}-"):
        whole_range = alpha.client.get(shard["url"], HTTP_RANGE=asked)
        assert whole_range.status_code == 206
        assert whole_range["Content-Range"] == f"bytes 0-{size - 1}/{size}"
        assert streamed(whole_range) == body
    # Another unit is ignored, as HTTP says: the whole file.
    assert alpha.client.get(shard["url"], HTTP_RANGE="items=0-1").status_code == 200


@pytest.mark.parametrize("packing", ["stored", "deflated"])
def test_a_node_downloads_virtual_shards_that_read_as_the_upload(
    bob: Any, alpha: AslProvider, dataset: Path, tmp_path: Path, packing: str
) -> None:
    from tests.training.test_heldout_split import repack
    from training.asl.source import Source

    upload = dataset if packing == "stored" else repack(dataset, tmp_path / "deflated.zip", prefix="asl-signs/")
    root = "asl-signs/" if packing == "deflated" else ""
    task = training_task(bob, upload)
    assignment = assign(task)
    # The task's prepared share costs its indexes and recipes on disk: the upload is the one copy.
    prepared = Path(default_storage.path(f"prepared/{task.pk}"))
    on_disk = sum(p.stat().st_size for p in prepared.rglob("*") if p.is_file())
    assert 0 < on_disk < 0.02 * upload.stat().st_size, (on_disk, upload.stat().st_size)
    # Each shard as served matches the manifest's size and sha256 (served_folder checks them),
    # and its members read as the upload's, a deflated member served deflated.
    served = served_folder(alpha, assignment, tmp_path / "served")
    with zipfile.ZipFile(upload) as original, Source(served) as share:
        sequences = share.files(".parquet")
        assert sequences
        for path in sequences:
            assert share.read(path) == original.read(root + path)
        for shard_file in served.glob("shard-*.zip"):
            with zipfile.ZipFile(shard_file) as part:
                for info in part.infolist():
                    assert info.compress_type == original.getinfo(root + info.filename).compress_type
    # A download broken off mid-shard resumes with a range; past the end is refused.
    shard = first_shard(alpha, assignment)
    size = shard["size_bytes"]
    half = size // 2
    start = alpha.client.get(shard["url"], HTTP_RANGE=f"bytes=0-{half - 1}")
    rest = alpha.client.get(shard["url"], HTTP_RANGE=f"bytes={half}-")
    assert (start.status_code, rest.status_code) == (206, 206)
    assert rest["Content-Range"] == f"bytes {half}-{size - 1}/{size}"
    assert hashlib.sha256(streamed(start) + streamed(rest)).hexdigest() == shard["sha256"]
    refused = alpha.client.get(shard["url"], HTTP_RANGE=f"bytes={size}-")
    assert refused.status_code == 416
    assert refused["Content-Range"] == f"bytes */{size}"


def test_the_platforms_re_execution_reads_the_share_the_node_downloaded(
    bob: Any, alpha: AslProvider, dataset: Path, tmp_path: Path
) -> None:
    from training.asl.run import training_plan
    from workers.verification.base import worker_data

    task = training_task(bob, dataset)
    served = served_folder(alpha, assign(task), tmp_path / "served")
    with worker_data(task) as share:
        assert share is not None
        assert training_plan(task.spec, share) == training_plan(task.spec, served)


def test_a_recipe_reaching_outside_the_upload_is_refused_not_served(
    bob: Any, alpha: AslProvider, dataset: Path
) -> None:
    from dataclasses import replace

    from training.virtualzip import Recipe

    task = training_task(bob, dataset)
    name = first_shard(alpha, assign(task))["name"]
    split = heldout.prepared(task)
    assert split is not None
    assert split.worker is not None
    path = Path(default_storage.path(f"{split.worker}/{name}{RECIPE_SUFFIX}"))
    recipe = Recipe.from_json(path.read_bytes())
    first, *rest = recipe.members
    path.write_bytes(replace(recipe, members=(replace(first, offset=recipe.upload_size - 1), *rest)).to_json())
    with pytest.raises(VirtualZipError, match="lies outside the upload's"):
        heldout.open_file(task, split.worker, name)


def test_a_node_gets_no_shard_but_its_own_assignments_listed_ones(
    bob: Any, alpha: AslProvider, dataset: Path, tmp_path: Path
) -> None:
    task = training_task(bob, dataset)
    assignment = assign(task)
    shard = first_shard(alpha, assignment)
    # Another node, with a valid token, asking for this assignment's shard: as if it did not exist.
    beta = AslProvider(bob, "beta")
    assert beta.client.get(shard["url"]).status_code == 404
    assert beta.get(assignment, "dataset/").status_code == 404
    # Its own assignment, but a file the worker's manifest does not list: the held-out
    # share's files and anything else in storage stay out of reach.
    split = heldout.prepared(task)
    assert split is not None
    assert split.worker is not None
    listed = {f["name"] for f in split.worker_files}
    unlisted = [f["name"] for f in split.heldout_files if f["name"] not in listed]
    # Nor the upload, nor a recipe: only the bytes of the shards the manifest lists.
    recipe = f"{split.worker_files[0]['name']}{RECIPE_SUFFIX}"
    for name in [*unlisted, "manifest.json", "..", "heldout", "shard-99999.zip", recipe, UPLOAD_NAME, "upload"]:
        assert alpha.get(assignment, f"dataset/{name}/").status_code == 404, name
    # A name both shares have is the worker share's file, never the held-out one.
    served_index = streamed(alpha.get(assignment, "dataset/train.csv/"))
    assert served_index == (Path(default_storage.path(split.worker)) / "train.csv").read_bytes()
    assert served_index != (split.heldout_path() / "train.csv").read_bytes()
    # Once the job is over, the dataset is closed.
    assignment.state = assignment.State.EXPIRED
    assignment.save(update_fields=["state"])
    assert alpha.client.get(shard["url"]).status_code == 409


def refused_at_posting(owner: Any, content: bytes) -> str:
    """Post an asl_training task on ``content``: the ValidationError's message; nothing is
    created and no money moves."""
    before = (ledger.balance(owner), Task.objects.count())
    upload = make_dataset(owner, content, "signs.zip")
    with pytest.raises(ValidationError) as refused:
        post_task(owner, "asl_training", SPEC, dataset=upload.pk, budget=10 * UNITS_PER_CREDIT)
    assert (ledger.balance(owner), Task.objects.count()) == before
    (message,) = refused.value.detail["dataset"]  # type: ignore[call-overload]
    return str(message)


def test_too_few_participants_are_refused_at_posting(bob: Any, tmp_path: Path) -> None:
    archive = generate(tmp_path / "two.zip", n_signs=3, n_participants=2, per_participant=1, max_frames=12, as_zip=True)
    assert "has 2 participant(s); at least 3 are needed" in refused_at_posting(bob, archive.read_bytes())


def test_an_oversized_sequence_file_is_refused_at_posting(
    bob: Any, dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The split holds one sequence file in memory at a time: one larger than it reads is
    refused from the archive's directory, before the task is funded."""
    import training.asl.split as split

    monkeypatch.setattr(split, "SEQUENCE_MAX_BYTES", 1000)
    assert "sequence file" in (words := refused_at_posting(bob, dataset.read_bytes()))
    assert "bytes; at most 1,000 are read" in words


def test_an_archive_expanding_far_past_its_size_is_refused_at_posting(
    bob: Any, dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the split may write is bounded by the upload's size: a zip bomb is refused
    from its directory."""
    import training.asl.split as split

    monkeypatch.setattr(split, "EXPANSION_FLOOR", 1)
    bomb = io.BytesIO()
    with zipfile.ZipFile(dataset) as source, zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as target:
        for info in source.infolist():
            body = source.read(info)
            # Zeros after a sequence's bytes: deflated to almost nothing, five times the data.
            target.writestr(info.filename, body + bytes(5 * len(body)) if info.filename.endswith(".parquet") else body)
    assert "bytes of sequence files, over 4 times its" in refused_at_posting(bob, bomb.getvalue())


def test_an_index_naming_a_missing_file_is_refused_at_posting(bob: Any) -> None:
    from tests.factories import zip_bytes

    bad = {"train.csv": b"path,participant_id,sequence_id,sign\nmissing.parquet,1,1,hello\n"}
    message = refused_at_posting(bob, zip_bytes(bad))
    assert message.startswith("signs.zip: train.csv line 2: ")
    assert "'missing.parquet' is missing" in message


def test_an_id_too_large_for_64_bits_is_refused_at_posting(bob: Any, dataset: Path) -> None:
    """numpy holds the ids as int64: a larger one was an OverflowError, a 500."""
    with zipfile.ZipFile(dataset) as source:
        rows = index(source)
        files = {info.filename: source.read(info) for info in source.infolist()}
    rows[-1]["participant_id"] = str(2**70)
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    files["train.csv"] = text.getvalue().encode()
    from tests.factories import zip_bytes

    message = refused_at_posting(bob, zip_bytes(files))
    assert message == f"signs.zip: train.csv line {len(rows) + 1}: participant_id and sequence_id must fit in 64 bits."


def with_index(archive: Path, extra_rows: Callable[[list[str]], list[str]]) -> bytes:
    """``archive`` with rows added to its train.csv (``extra_rows`` gets its data rows)."""
    from tests.factories import zip_bytes

    with zipfile.ZipFile(archive) as source:
        files = {name: source.read(name) for name in source.namelist()}
    lines = files["train.csv"].decode().splitlines()
    files["train.csv"] = "\n".join([*lines, *extra_rows(lines[1:])]).encode() + b"\n"
    return zip_bytes(files)


def test_a_sequence_listed_twice_is_refused_at_posting(bob: Any, dataset: Path) -> None:
    """Each listed row is copied and read at the split: a file listed a million times took
    minutes of the platform's time before this was refused."""
    message = refused_at_posting(bob, with_index(dataset, lambda rows: [rows[0]]))
    assert message.startswith("signs.zip: train.csv line ")
    assert "is listed twice (first on line 2)" in message


@pytest.mark.parametrize("listed", ["train.csv", "sign_to_prediction_index_map.json"])
def test_an_index_listing_itself_is_refused_at_posting(bob: Any, dataset: Path, listed: str) -> None:
    message = refused_at_posting(bob, with_index(dataset, lambda rows: [f"{listed},99,99,hello"]))
    assert f"path '{listed}' is the dataset's index, not a sequence file" in message


def test_a_damaged_sequence_fails_the_task_at_the_split_with_a_refund(
    bob: Any, alpha: AslProvider, dataset: Path, tmp_path: Path
) -> None:
    """Posting reads the archive's directory and index only; a sequence file that is not
    parquet shows when the platform reads the held-out ones: the task fails, naming the
    file, before any worker is offered it, and the budget comes back."""
    damaged = tmp_path / "damaged.zip"
    with zipfile.ZipFile(dataset) as source, zipfile.ZipFile(damaged, "w") as target:
        for info in source.infolist():
            target.writestr(info, b"not parquet" if info.filename.endswith(".parquet") else source.read(info))
    before = ledger.balance(bob)
    task = training_task(bob, damaged)
    assert ledger.balance(bob) < before  # posted: the budget is in escrow
    assert scheduler_offers_nothing(task)
    task.refresh_from_db()
    assert task.status == TaskStatus.FAILED
    assert ".parquet" in task.status_reason
    assert ledger.balance(bob) == before


def scheduler_offers_nothing(task: Task) -> bool:
    from workers.assignments import scheduler

    return scheduler.schedule(task.pk) == []


# --- The verifiers -----------------------------------------------------------------------


def copy_model(trained: Path, target: Path) -> Path:
    target.mkdir()
    for name in MODEL_FILES:
        shutil.copy(trained / name, target / name)
    return target


def artifacts_of(model: Path) -> dict[str, Path]:
    return {name: model / name for name in MODEL_FILES}


def claim(trained: Path, top1: float | None = None) -> dict[str, int]:
    value = json.loads((trained / "reported.json").read_text())["val_top1"] if top1 is None else top1
    return {"val_top1_micro": round(value * 1e6)}


def test_an_honest_model_is_accepted_on_the_held_out_participants(
    bob: Any, alpha: AslProvider, dataset: Path, trained: Path
) -> None:
    assignment = submitted(assign(training_task(bob, dataset)), trained / "model.safetensors", claim(trained))
    verdict = quality_bar(assignment, artifacts_of(trained))
    assert verdict.ok, verdict.reason
    assert verdict.metrics["heldout_sequences"] == 10
    assert verdict.metrics["heldout_top1"] >= 0.5


def test_a_wrong_reported_accuracy_is_rejected(bob: Any, alpha: AslProvider, dataset: Path, trained: Path) -> None:
    assignment = submitted(assign(training_task(bob, dataset)), trained / "model.safetensors", claim(trained, 0.05))
    verdict = quality_bar(assignment, artifacts_of(trained))
    assert not verdict.ok
    assert "differs from reported 0.0500" in verdict.reason
    assert verdict.penalise


def test_below_the_minimum_accuracy_is_not_paid(
    bob: Any, alpha: AslProvider, dataset: Path, trained: Path, tmp_path: Path
) -> None:
    from safetensors.numpy import load, save_file

    from training.asl.run import verify

    # A useless model (every weight zero: one constant guess), its accuracy reported honestly.
    model = copy_model(trained, tmp_path / "useless")
    tensors = load((model / "model.safetensors").read_bytes())
    save_file({k: v * 0 if v.dtype.kind == "f" else v for k, v in tensors.items()}, str(model / "model.safetensors"))
    task = training_task(bob, dataset, min_accuracy=0.5)
    assignment = assign(task)
    with heldout.readable(task, heldout.prepared(task).heldout) as held:  # type: ignore[union-attr]
        honest = verify(model, held, cache_dir=tmp_path / "cache")
    assert honest["top1"] < 0.5
    verdict = quality_bar(
        submitted(assignment, model / "model.safetensors", claim(trained, honest["top1"])), artifacts_of(model)
    )
    assert not verdict.ok
    assert "below the required 0.5000" in verdict.reason
    assert not verdict.penalise


def test_an_untrained_model_honestly_reported_is_not_paid_even_with_no_minimum(
    bob: Any, alpha: AslProvider, dataset: Path, trained: Path, tmp_path: Path
) -> None:
    from training.artifacts import model_tensors, save_tensors
    from training.asl.model import ModelConfig, SignModel
    from training.asl.run import chance_floor, verify

    # The spec's model at a fresh initialisation, with the dataset's signs: nothing learned.
    model = copy_model(trained, tmp_path / "untrained")
    torch.manual_seed(0)
    untrained = SignModel(ModelConfig(**json.loads((model / "config.json").read_text())))
    save_tensors(model / "model.safetensors", model_tensors(untrained))
    task = training_task(bob, dataset)  # min_accuracy 0: any accuracy "reaches" it
    assignment = assign(task)
    with heldout.readable(task, heldout.prepared(task).heldout) as held:  # type: ignore[union-attr]
        honest = verify(model, held, cache_dir=tmp_path / "cache")
    verdict = quality_bar(
        submitted(assignment, model / "model.safetensors", claim(trained, honest["top1"])), artifacts_of(model)
    )
    assert honest["top1"] < chance_floor(5, 10)
    assert not verdict.ok
    assert "no better than guessing among 5 signs on 10 sequences: at least 0.6000 is needed" in verdict.reason
    assert verdict.metrics["heldout_top1"] == round(honest["top1"], 6)
    assert not verdict.penalise


def test_a_tampered_model_is_rejected(
    bob: Any, alpha: AslProvider, dataset: Path, trained: Path, tmp_path: Path
) -> None:
    from safetensors.numpy import load, save_file

    model = copy_model(trained, tmp_path / "tampered")
    tensors = load((model / "model.safetensors").read_bytes())
    save_file({k: v * 0 if v.dtype.kind == "f" else v for k, v in tensors.items()}, str(model / "model.safetensors"))
    assignment = assign(training_task(bob, dataset))

    verdict = quality_bar(submitted(assignment, trained / "model.safetensors", claim(trained)), artifacts_of(model))
    assert not verdict.ok
    assert "result_hash" in verdict.reason

    verdict = quality_bar(submitted(assignment, model / "model.safetensors", claim(trained)), artifacts_of(model))
    assert not verdict.ok
    assert "differs from reported" in verdict.reason


@pytest.mark.parametrize(
    ("file", "change", "words"),
    [
        ("config.json", {"dim": 384}, "config.json does not match the spec: dim"),
        ("config.json", {"num_classes": 4}, "num_classes"),
        ("labels.json", None, "labels.json does not list the dataset's signs"),
    ],
)
def test_a_model_other_than_the_spec_is_rejected(
    bob: Any, alpha: AslProvider, dataset: Path, trained: Path, tmp_path: Path, file: str, change: Any, words: str
) -> None:
    model = copy_model(trained, tmp_path / "other")
    raw = json.loads((model / file).read_text())
    if change is None:
        raw["signs"] = list(reversed(raw["signs"]))
    else:
        raw.update(change)
    (model / file).write_text(json.dumps(raw))
    assignment = submitted(assign(training_task(bob, dataset)), model / "model.safetensors", claim(trained))
    verdict = quality_bar(assignment, artifacts_of(model))
    assert not verdict.ok
    assert words in verdict.reason


def inference_assignment(
    owner: Any, provider: AslProvider, dataset: Path, trained: Path, tmp_path: Path, verify_samples: int
) -> Any:
    """An asl_inference assignment (top 3) on five new sequences, offered to ``provider``,
    whose source is a completed training of ``trained``; the honest predictions are in
    ``tmp_path / "honest" / "predictions.csv"``."""
    source = completed_training(owner, provider, trained, training_task(owner, dataset))
    inputs = generate(
        tmp_path / "new.zip", n_signs=5, n_participants=1, per_participant=1, max_frames=16, seed=4, as_zip=True
    )
    upload = make_dataset(owner, inputs.read_bytes(), "new.zip")
    spec = {"source_task": str(source.pk), "top_k": 3, "verify_samples": verify_samples}
    assignment = assign(post_task(owner, "asl_inference", spec, dataset=upload.pk, budget=UNITS_PER_CREDIT))
    predict(trained, inputs, tmp_path / "honest", top_k=3)
    return assignment


def test_inference_predictions_are_spot_checked(
    bob: Any, alpha: AslProvider, dataset: Path, trained: Path, tmp_path: Path
) -> None:
    assignment = inference_assignment(bob, alpha, dataset, trained, tmp_path, verify_samples=5)
    honest_csv = (tmp_path / "honest" / "predictions.csv").read_text()

    def check(text: str) -> Any:
        path = tmp_path / "predictions.csv"
        path.write_text(text)
        return verify_asl_inference(submitted(assignment, path, {}), {"predictions.csv": path})

    verdict = check(honest_csv)
    assert verdict.ok, verdict.reason
    assert verdict.metrics["sequences_checked"] == 5

    rows = [line.split(",") for line in honest_csv.splitlines()]
    rows[3][3] = f"{float(rows[3][3]) - 0.01:.6f}"  # one score nudged
    verdict = check("\n".join(",".join(r) for r in rows) + "\n")
    assert not verdict.ok
    assert "recomputed sequences differ" in verdict.reason

    rows = [line.split(",") for line in honest_csv.splitlines()]
    verdict = check("\n".join(",".join(r[:4]) for r in rows) + "\n")  # top 1 instead of 3
    assert not verdict.ok
    assert "top 3 signs" in verdict.reason

    verdict = check("\n".join(honest_csv.splitlines()[:-1]) + "\n")  # a sequence left out
    assert not verdict.ok
    assert "exactly the input sequences" in verdict.reason


def test_inference_predictions_must_give_each_sequence_its_own_id(
    bob: Any, alpha: AslProvider, dataset: Path, trained: Path, tmp_path: Path
) -> None:
    # The requester joins the predictions back to their data by sequence_id: a wrong id is a
    # wrong result, checked on every row, not only on the recomputed ones.
    assignment = inference_assignment(bob, alpha, dataset, trained, tmp_path, verify_samples=1)
    rows = [line.split(",") for line in (tmp_path / "honest" / "predictions.csv").read_text().splitlines()]
    own = rows[2][1]
    rows[2][1] = rows[3][1]  # one sequence given its neighbour's id
    path = tmp_path / "predictions.csv"
    path.write_text("\n".join(",".join(r) for r in rows) + "\n")
    verdict = verify_asl_inference(submitted(assignment, path, {}), {"predictions.csv": path})
    assert not verdict.ok
    assert f"sequence_id {rows[3][1]!r}, not {own!r}" in verdict.reason

    rows[2][1] = own
    rows[4] = rows[4][:2]  # a sequence with no signs at all
    path.write_text("\n".join(",".join(r) for r in rows) + "\n")
    verdict = verify_asl_inference(submitted(assignment, path, {}), {"predictions.csv": path})
    assert not verdict.ok
    assert "row 4 has 2 fields, the header 8" in verdict.reason


def test_inference_on_one_parquet_file_accepts_the_agents_honest_predictions(
    bob: Any, alpha: AslProvider, dataset: Path, trained: Path, tmp_path: Path
) -> None:
    # A single .parquet sequence is a dataset format of the kind; the agent's own runner
    # computes the result and the verifier must accept it.
    source = completed_training(bob, alpha, trained, training_task(bob, dataset))
    folder = generate(tmp_path / "new", n_signs=5, n_participants=1, per_participant=1, max_frames=16, seed=4)
    clip = sorted(folder.rglob("*.parquet"))[0]
    upload = make_dataset(bob, clip.read_bytes(), "clip.parquet")
    spec = {"source_task": str(source.pk), "top_k": 3}
    task = post_task(bob, "asl_inference", spec, dataset=upload.pk, budget=UNITS_PER_CREDIT)
    assignment = assign(task)
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(clip, work / "dataset.parquet")

    def fetch(url: str, target: Path) -> None:
        shutil.copy(trained / url.rstrip("/").rsplit("/", 1)[1], target)

    job = {"id": str(assignment.pk), "kind": "asl_inference", "spec": task.spec, "dataset": {"format": "parquet"}}
    outcome = runners.run({**job, "fetch": fetch}, work, lambda *args: None)
    path = outcome.artifacts["predictions.csv"]
    verdict = verify_asl_inference(submitted(assignment, path, {}), {"predictions.csv": path})
    assert verdict.ok, verdict.reason
    assert verdict.metrics["sequences_checked"] == 1


def test_a_verifier_node_is_served_the_worker_share_in_shards_too(bob: Any, alpha: AslProvider, dataset: Path) -> None:
    """Delegated re-execution reads the worker's data: for a sharded share, the same
    manifest and listed files the worker got, under the verification job's URLs, and
    nothing of the held-out share."""
    from rest_framework.exceptions import NotFound

    from workers.assignments import delegation
    from workers.assignments.jobs import ServedFile

    task = training_task(bob, dataset)
    job: Any = SimpleNamespace(pk=uuid4(), assignment=assign(task))
    base = f"/api/v1/verifications/{job.pk}/dataset/"
    split = heldout.prepared(task)
    assert split is not None
    data = delegation.data_file(task)
    assert data is not None
    manifest = delegation.served_data(job, None)
    assert isinstance(manifest, bytes)
    entry = delegation.data_entry_of(task, data, base)
    assert entry["format"] == "shards"
    assert (entry["sha256"], entry["size_bytes"]) == (hashlib.sha256(manifest).hexdigest(), len(manifest))
    files = json.loads(manifest)["files"]
    assert [f["name"] for f in files] == [f["name"] for f in split.worker_files]
    assert all(f["url"] == f"{base}{f['name']}/" for f in files)
    for listed in files:
        served = delegation.served_data(job, listed["name"])
        assert isinstance(served, ServedFile)
        with served.open() as handle:
            assert hashlib.sha256(handle.read()).hexdigest() == listed["sha256"]
    for name in ("manifest.json", "..", "heldout", "shard-99999.zip"):
        with pytest.raises(NotFound):
            delegation.served_data(job, name)
