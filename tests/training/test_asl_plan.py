"""The platform's plan of an asl_training run (``training_plan``, ``untrained_weights``) is
read from the worker share's index alone: it equals, field by field, the plan of the trainer
that decodes every sequence into a cache, on every form of dataset the platform or a node
holds, and it decodes no sequence and writes no cache."""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from training.artifacts import weights_sha256
from training.asl import dataset as asl_dataset
from training.asl import parquet as asl_parquet
from training.asl.dataset import INGESTED_FILE, load_dataset, read_dataset_index
from training.asl.ingest import ingest
from training.asl.landmarks import selected_landmarks
from training.asl.parquet import DatasetError
from training.asl.run import index_trainer, trainer, training_plan, untrained_weights
from training.asl.split import prepare
from training.asl.synthetic import generate
from training.plugin import Listed
from training.replay import plan_of
from training.virtualzip import attach

SHAPE: dict[str, Any] = {"n_signs": 5, "n_participants": 5, "per_participant": 3, "max_frames": 16, "seed": 2}
BASE: dict[str, Any] = {"dim": 192, "blocks": 1, "max_len": 32, "epochs": 2, "batch_size": 4, "grad_accumulation": 1}
SPECS: list[dict[str, Any]] = [
    BASE,
    # Another split and initial weights; two micro-batches a step.
    {**BASE, "seed": 7, "validation_fraction": 0.4, "grad_accumulation": 2, "epochs": 3},
    # Pose landmarks (other points, another model), a batch larger than the training rows
    # (drop_last off), early stopping.
    {**BASE, "use_pose": True, "batch_size": 64, "early_stopping_patience": 1, "epochs": 5},
    # A batch preset from the worker's memory (none given: the CPU preset).
    {**BASE, "batch_size": 0, "dim": 384, "epochs": 40},
]


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """One dataset in each form: a zip, a folder, a folder of shards, and the worker share
    the platform's split writes (virtual shards read from the upload: what
    ``workers.verification.base.worker_data`` hands the plan)."""
    root = tmp_path_factory.mktemp("plan")
    upload = generate(root / "upload.zip", as_zip=True, **SHAPE)
    share, _ = prepare(BASE, upload, root / "split", bytes(32), shard_bytes=20_000)
    assert share is not None
    assert list(share.glob("shard-*.zip.recipe"))
    with attach(share, upload) as view:  # what workers.assignments.heldout.readable does
        yield {
            "zip": upload,
            "folder": generate(root / "folder", **{**SHAPE, "n_participants": 4, "seed": 5}),
            "shards": generate(root / "shards", shards=3, **{**SHAPE, "n_signs": 3, "per_participant": 4}),
            "platform share": view,
        }


def cached_plan(spec: dict[str, Any], data: Path, cache: Path) -> Any:
    """The plan as the trainer that decodes every sequence into a cache gives it."""
    return plan_of(trainer(spec, data, "cpu", cache_dir=cache))


@pytest.mark.parametrize("form", ["zip", "folder", "shards", "platform share"])
@pytest.mark.parametrize("spec", SPECS, ids=["base", "seed-accumulation", "pose-big-batch", "preset"])
def test_the_index_plan_is_the_cached_trainers_plan(
    datasets: dict[str, Path], form: str, spec: dict[str, Any], tmp_path: Path
) -> None:
    data = datasets[form]
    expected = cached_plan(spec, data, tmp_path / "cache")
    got = training_plan(spec, data)
    for field in dataclasses.fields(expected):
        assert getattr(got, field.name) == getattr(expected, field.name), field.name
    assert got.total_steps == expected.total_steps
    assert got.least_steps == expected.least_steps
    assert untrained_weights(spec, data) == expected.untrained_sha256


def test_the_specs_and_datasets_give_different_plans(datasets: dict[str, Path]) -> None:
    """The equality above is not that of a constant: the plans differ where the runs do."""
    plans = {(i, form): training_plan(spec, data) for i, spec in enumerate(SPECS) for form, data in datasets.items()}
    assert len({p.untrained_sha256 for p in plans.values()}) >= 6
    assert len({(p.steps_per_epoch, p.epochs, p.every) for p in plans.values()}) >= 6


def test_the_index_trainer_splits_and_labels_as_the_cache_does(datasets: dict[str, Path], tmp_path: Path) -> None:
    data = datasets["platform share"]
    spec = SPECS[1]
    lean, whole = index_trainer(spec, data), trainer(spec, data, "cpu", cache_dir=tmp_path / "cache")
    for key in ("train_rows", "val_rows"):
        np.testing.assert_array_equal(lean.extras[key], whole.extras[key])
    assert lean.extras["held_out"] == whole.extras["held_out"]
    index, cache = lean.extras["data"], whole.extras["data"]
    for field in ("labels", "participants", "sequence_ids", "points"):
        np.testing.assert_array_equal(getattr(index, field), getattr(cache, field))
    assert index.signs == cache.signs
    assert len(lean.train_loader) == len(whole.train_loader)  # type: ignore[arg-type]
    assert len(lean.val_loader) == len(whole.val_loader)  # type: ignore[arg-type]
    assert weights_sha256(lean.model) == weights_sha256(whole.model)


def no_parquet(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("a sequence file was decoded")


@pytest.mark.parametrize("form", ["zip", "shards", "platform share"])
def test_the_plan_decodes_no_sequence_and_writes_no_cache(
    datasets: dict[str, Path], form: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    data = datasets[form]
    expected = cached_plan(SPECS[0], data, tmp_path / "cache")
    monkeypatch.setattr(asl_dataset, "read_sequence", no_parquet)
    monkeypatch.setattr(asl_parquet, "read_sequence", no_parquet)
    monkeypatch.setenv("PROOFWORK_ASL_CACHE", str(tmp_path / "default-cache"))
    monkeypatch.setattr(asl_dataset, "building_cache", no_parquet)
    before = sorted(p.name for p in data.parent.iterdir())
    assert training_plan(SPECS[0], data) == expected
    assert untrained_weights(SPECS[0], data) == expected.untrained_sha256
    assert sorted(p.name for p in data.parent.iterdir()) == before
    assert not (tmp_path / "default-cache").exists()


def test_a_batch_of_the_index_trainer_is_never_read_empty(datasets: dict[str, Path]) -> None:
    """What holds only the index refuses to hand out a sequence, rather than train on nothing."""
    built = index_trainer(SPECS[0], datasets["zip"])
    with pytest.raises(RuntimeError, match="was not read"):
        next(iter(built.train_loader))
    with pytest.raises(RuntimeError, match="was not read"):
        built.extras["data"].sequence(0)


def test_the_plan_refuses_what_the_cached_trainer_refuses(datasets: dict[str, Path], tmp_path: Path) -> None:
    """A train.csv row naming a file the share lacks fails both ways, with the same error."""
    broken = tmp_path / "broken"
    shutil.copytree(datasets["folder"], broken)
    first = next((broken / "train_landmark_files").rglob("*.parquet"))
    first.unlink()
    with pytest.raises(DatasetError) as cached:
        trainer(BASE, broken, "cpu", cache_dir=tmp_path / "cache")
    with pytest.raises(DatasetError) as lean:
        training_plan(BASE, broken)
    assert str(lean.value) == str(cached.value)
    with pytest.raises(DatasetError, match="needs an ISLR dataset"):
        training_plan(BASE, None)


def test_an_ingested_share_plans_as_its_shards_do(datasets: dict[str, Path], tmp_path: Path) -> None:
    """A node's share read into its cache as it downloaded (no shard left) plans as the
    folder of shards it came from."""
    share = datasets["shards"]
    listed = [
        Listed(p.name, p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(share.iterdir())
        if p.is_file()
    ]
    node = tmp_path / "dataset.shards"

    def fetch(name: str, path: Path) -> None:
        shutil.copyfile(share / name, path)

    ingest(BASE, node, listed, fetch)
    assert (node / INGESTED_FILE).is_file()
    assert not list(node.glob("shard-*.zip"))
    assert training_plan(BASE, node) == training_plan(BASE, share)
    index = read_dataset_index(node, points=selected_landmarks(False))
    cache = load_dataset(share, tmp_path / "cache", points=selected_landmarks(False))
    np.testing.assert_array_equal(index.sequence(3), cache.sequence(3))  # its cache, readable
