"""The held-out draw on the platform's side (``workers.assignments.heldout``): keyed on the
platform's secret and the dataset's content, so every task on one dataset holds out the same
rows or participants, none of them reaches a worker, and synthetic held-out rows are out of
reach of anything a worker can compute from its spec."""

from __future__ import annotations

import csv
import hashlib
import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from django.core.files.storage import default_storage

from ledger.units import UNITS_PER_CREDIT
from marketplace.models import Task
from tests.factories import TINY_ASL, TINY_CUBE, array_npy, make_dataset, post_task
from training.asl.synthetic import generate
from training.cube.data import synthetic_embeddings
from training.cube.split import load_heldout
from workers.assignments import heldout

pytestmark = pytest.mark.django_db

OTHER_SECRET = b"another platform's held-out secret, 32+ bytes"


def prepared_task(owner: Any, kind: str, spec: dict[str, Any], dataset: Any = None) -> Task:
    """A task posted and prepared as the scheduler prepares it, before any worker sees it."""
    task = post_task(owner, kind, spec, dataset=dataset.pk if dataset else None, budget=10 * UNITS_PER_CREDIT)
    assert heldout.ensure_prepared(task.pk)
    return task


def cube_sides(task: Task) -> tuple[np.ndarray, np.ndarray]:
    """(the rows the worker is served, the rows the platform keeps)."""
    files = heldout.prepared(task)
    assert files is not None
    assert files.worker is not None
    with default_storage.open(files.worker, "rb") as served:
        worker = np.load(io.BytesIO(served.read()), allow_pickle=False)
    return worker, load_heldout(files.heldout_path())[0]


def keys(rows: np.ndarray) -> set[bytes]:
    return {row.tobytes() for row in rows}


def test_every_cube_task_on_one_dataset_holds_out_the_same_rows(bob: Any, settings: Any) -> None:
    content = array_npy(synthetic_embeddings(200, 32, seed=7)[0])
    dataset = make_dataset(bob, content, "teacher.npy")
    first = cube_sides(prepared_task(bob, "cube_training", {**TINY_CUBE, "seed": 1}, dataset))
    for seed in (2, 3):
        worker, held = cube_sides(prepared_task(bob, "cube_training", {**TINY_CUBE, "seed": seed}, dataset))
        np.testing.assert_array_equal(held, first[1])
        np.testing.assert_array_equal(worker, first[0])
    # The same bytes uploaded again are the same dataset: the same rows stay back.
    again = make_dataset(bob, content, "copy.npy")
    np.testing.assert_array_equal(cube_sides(prepared_task(bob, "cube_training", TINY_CUBE, again))[1], first[1])
    # Another platform secret draws other rows.
    settings.HELDOUT_SECRET = OTHER_SECRET
    other = cube_sides(prepared_task(bob, "cube_training", TINY_CUBE, dataset))[1]
    assert len(other) == len(first[1]) == 20
    assert keys(other) != keys(first[1])


def test_a_repeated_row_is_never_both_served_and_held_out(bob: Any) -> None:
    distinct = synthetic_embeddings(40, 32, seed=7)[0]
    rows = np.concatenate([distinct, distinct[:20], distinct[:10]])  # 30 rows come twice or thrice
    dataset = make_dataset(bob, array_npy(rows), "repeated.npy")
    for seed in range(3):
        worker, held = cube_sides(prepared_task(bob, "cube_training", {**TINY_CUBE, "seed": seed}, dataset))
        assert keys(worker).isdisjoint(keys(held))
        assert len(keys(held)) == len(held) == 4  # a tenth of the 40 distinct rows, each once
        assert keys(worker) | keys(held) == keys(distinct)


def test_synthetic_held_out_rows_are_none_a_worker_can_generate(bob: Any, settings: Any) -> None:
    spec = {**TINY_CUBE, "synthetic_samples": 64}
    task = prepared_task(bob, "cube_training", spec)
    files = heldout.prepared(task)
    assert files is not None
    assert files.worker is None
    held, _ = load_heldout(files.heldout_path())
    for stream in range(8):  # whatever the worker draws from its spec's seed
        regenerated, _ = synthetic_embeddings(256, 32, seed=spec["seed"], stream=stream)
        assert np.abs(held[:, None, :] - regenerated[None, :, :]).max(axis=2).min() > 1e-3
    settings.HELDOUT_SECRET = OTHER_SECRET
    files = heldout.prepared(prepared_task(bob, "cube_training", spec))
    assert files is not None
    assert keys(load_heldout(files.heldout_path())[0]).isdisjoint(keys(held))


def held_people(task: Task) -> set[str]:
    files = heldout.prepared(task)
    assert files is not None
    with (files.heldout_path() / "train.csv").open(encoding="utf-8") as index:
        return {row["participant_id"] for row in csv.DictReader(index)}


def test_every_asl_task_on_one_archive_holds_out_the_same_participants(bob: Any, settings: Any, tmp_path: Path) -> None:
    archive = generate(
        tmp_path / "signs.zip", n_signs=2, n_participants=20, per_participant=1, max_frames=12, as_zip=True
    )
    dataset = make_dataset(bob, archive.read_bytes(), "signs.zip")
    held = [held_people(prepared_task(bob, "asl_training", {**TINY_ASL, "seed": seed}, dataset)) for seed in range(3)]
    assert len(held[0]) == 2
    assert held[1] == held[0]
    assert held[2] == held[0]
    settings.HELDOUT_SECRET = OTHER_SECRET
    assert held_people(prepared_task(bob, "asl_training", TINY_ASL, dataset)) != held[0]


def test_an_asl_split_is_stored_as_two_folders_the_manifest_lists(bob: Any, tmp_path: Path) -> None:
    archive = generate(
        tmp_path / "signs.zip", n_signs=2, n_participants=8, per_participant=1, max_frames=12, as_zip=True
    )
    task = prepared_task(bob, "asl_training", TINY_ASL, make_dataset(bob, archive.read_bytes(), "s.zip"))
    split = heldout.prepared(task)
    assert split is not None
    assert split.worker is not None
    for folder, listed in ((split.worker, split.worker_files), (split.heldout, split.heldout_files)):
        stored = sorted(default_storage.listdir(folder)[1])
        # A shard is stored as its recipe; the manifest lists the shard it serves.
        assert stored == sorted(f["name"] + (".recipe" if f["name"].startswith("shard-") else "") for f in listed)
        assert {"train.csv", "sign_to_prediction_index_map.json", "shard-00000.zip.recipe"} <= set(stored)
        for entry in listed:
            with heldout.open_file(task, folder, entry["name"]) as handle:
                body = handle.read()
            assert (len(body), hashlib.sha256(body).hexdigest()) == (entry["size_bytes"], entry["sha256"])
    assert split.worker_size == sum(f["size_bytes"] for f in split.worker_files)
    assert split.heldout_path().is_dir()
