"""The platform's held-out draws, pure: drawn by its secret seed alone, the same for every
task on one dataset, never split across duplicate rows, and for synthetic data out of
reach of anything a worker can compute from its spec."""

from __future__ import annotations

import csv
import io
import json
import struct
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from training.asl.parquet import DatasetError
from training.asl.split import heldout_participants
from training.asl.split import prepare as prepare_asl
from training.asl.synthetic import generate
from training.cube.data import CubeDataError, synthetic_embeddings
from training.cube.split import heldout_rows, load_heldout
from training.cube.split import prepare as prepare_cube
from training.virtualzip import RECIPE_SUFFIX, VirtualZip, attach, virtual_name

SECRET = bytes(range(32))
OTHER_SECRET = bytes(range(1, 33))
CUBE = {"teacher_dim": 32, "lattice_edge": 3, "state_size": 8, "steps": 2, "synthetic_samples": 0, "seed": 1}


def keys(rows: np.ndarray) -> set[bytes]:
    return {row.tobytes() for row in rows}


def split_upload(tmp_path: Path, upload: Path, secret: bytes, **spec: object) -> tuple[np.ndarray, np.ndarray]:
    """(the worker's rows, the held-out rows) the platform writes for ``upload``."""
    out = tmp_path / f"split-{len(list(tmp_path.iterdir()))}"
    worker, held = prepare_cube({**CUBE, **spec}, upload, out, secret)
    assert worker is not None
    return np.load(worker, allow_pickle=False), load_heldout(held)[0]


@pytest.fixture
def upload(tmp_path: Path) -> Path:
    path = tmp_path / "teacher.npy"
    np.save(path, synthetic_embeddings(200, 32, seed=7)[0])
    return path


# --- cube_training: uploaded rows ------------------------------------------------------


def test_every_task_on_one_dataset_holds_out_the_same_rows(tmp_path: Path, upload: Path) -> None:
    worker, held = split_upload(tmp_path, upload, SECRET, seed=1)
    for seed in (2, 3, 99):
        other_worker, other_held = split_upload(tmp_path, upload, SECRET, seed=seed)
        np.testing.assert_array_equal(other_held, held)
        np.testing.assert_array_equal(other_worker, worker)
    assert len(held) == 20
    assert keys(worker).isdisjoint(keys(held))


def test_the_held_out_rows_follow_the_platform_secret(tmp_path: Path, upload: Path) -> None:
    _, held = split_upload(tmp_path, upload, SECRET)
    _, other = split_upload(tmp_path, upload, OTHER_SECRET)
    assert len(other) == len(held)
    assert keys(other) != keys(held)
    inputs = np.load(upload)
    assert heldout_rows(inputs, None, SECRET)[1].tolist() != heldout_rows(inputs, None, OTHER_SECRET)[1].tolist()


def values(rows: np.ndarray) -> set[bytes]:
    """The rows by value: -0.0 and 0.0 are one."""
    return keys(rows + np.float32(0))


def copies(rows: np.ndarray, row: np.ndarray) -> int:
    return int(np.all(rows == row, axis=1).sum())


def test_no_held_out_row_reaches_the_worker_however_often_it_is_repeated(tmp_path: Path) -> None:
    distinct = synthetic_embeddings(30, 32, seed=7)[0]
    distinct[:, 0] = 0.0
    rows = np.repeat(distinct, np.random.default_rng(0).integers(1, 5, size=30), axis=0)  # one to four copies
    rows = rows[np.random.default_rng(1).permutation(len(rows))]
    rows[::2, 0] = -0.0  # equal values in other bytes are still one row
    np.save(tmp_path / "repeated.npy", rows)
    for secret in (SECRET, OTHER_SECRET, bytes(32)):
        worker, held = split_upload(tmp_path, tmp_path / "repeated.npy", secret)
        assert values(worker).isdisjoint(values(held))
        assert len(values(held)) == len(held) == 3  # a tenth of the 30 distinct rows, each once
        assert values(worker) | values(held) == values(rows)
        assert len(worker) + sum(copies(rows, row) for row in held) == len(rows)


def test_dialogue_rows_are_one_row_only_with_the_same_target(tmp_path: Path) -> None:
    inputs = np.repeat(synthetic_embeddings(20, 32, seed=7)[0], 2, axis=0)
    targets = -inputs
    targets[1::4] += 1.0  # half the inputs come twice with two targets: two distinct rows
    save_file({"embeddings": inputs, "targets": targets}, str(tmp_path / "pairs.safetensors"))
    worker, held = prepare_cube({**CUBE, "mode": "dialogue"}, tmp_path / "pairs.safetensors", tmp_path / "out", SECRET)
    assert worker is not None
    served = load_file(str(worker))
    held_inputs, held_targets = load_heldout(held)
    assert held_targets is not None
    pairs = np.concatenate([inputs, targets], axis=1)
    held_pairs = np.concatenate([held_inputs, held_targets], axis=1)
    served_pairs = np.concatenate([served["embeddings"], served["targets"]], axis=1)
    assert keys(held_pairs).isdisjoint(keys(served_pairs))
    assert len(held_pairs) == 3  # a tenth of the 30 distinct pairs
    assert len(served_pairs) + sum(copies(pairs, pair) for pair in held_pairs) == len(pairs)


def test_too_few_distinct_rows_are_refused_naming_the_count() -> None:
    rows = np.repeat(synthetic_embeddings(3, 32, seed=7)[0], 4, axis=0)
    with pytest.raises(CubeDataError, match="12 rows but only 3 distinct ones; at least 4 are needed"):
        heldout_rows(rows, None, SECRET)


# --- cube_training: synthetic data -----------------------------------------------------


def test_synthetic_held_out_rows_are_out_of_the_workers_reach(tmp_path: Path) -> None:
    spec = {**CUBE, "synthetic_samples": 64}
    worker, held_path = prepare_cube(spec, None, tmp_path / "a", SECRET)
    assert worker is None
    held, _ = load_heldout(held_path)
    assert held.shape == (256, 32)
    # Nothing the spec's seed reaches, in any stream or at any length, is a held-out row.
    for stream in range(8):
        regenerated, _ = synthetic_embeddings(256, 32, seed=1, stream=stream)
        gaps = np.abs(held[:, None, :] - regenerated[None, :, :]).max(axis=2)
        assert gaps.min() > 1e-3
    # The same structure, though: the worker's stream spans the held-out rows' subspace.
    train, _ = synthetic_embeddings(256, 32, seed=1)
    basis = np.linalg.svd(train - train.mean(0), full_matrices=False)[2][:16]
    centred = held - train.mean(0)
    assert np.linalg.norm(centred @ basis.T) ** 2 / np.linalg.norm(centred) ** 2 > 0.95
    # Another platform secret, other samples; the same secret, the same ones.
    other, _ = load_heldout(prepare_cube(spec, None, tmp_path / "b", OTHER_SECRET)[1])
    assert keys(other).isdisjoint(keys(held))
    again, _ = load_heldout(prepare_cube(spec, None, tmp_path / "c", SECRET)[1])
    np.testing.assert_array_equal(again, held)


# --- asl_training: participants --------------------------------------------------------


def held_people(path: Path) -> set[str]:
    with (path / "train.csv").open(encoding="utf-8") as index:
        return {row["participant_id"] for row in csv.DictReader(index)}


def test_every_task_on_one_archive_holds_out_the_same_participants(tmp_path: Path) -> None:
    archive = generate(
        tmp_path / "signs.zip", n_signs=2, n_participants=20, per_participant=1, max_frames=12, as_zip=True
    )
    spec = {"dim": 192, "blocks": 1, "max_len": 32}
    held = [
        held_people(prepare_asl({**spec, "seed": seed}, archive, tmp_path / f"s{seed}", SECRET)[1]) for seed in range(4)
    ]
    assert len(held[0]) == 2
    assert all(people == held[0] for people in held)
    other = held_people(prepare_asl({**spec, "seed": 0}, archive, tmp_path / "other", OTHER_SECRET)[1])
    assert other != held[0]


def test_the_held_out_participants_follow_the_platform_secret_alone() -> None:
    people = list(range(100, 140))
    chosen = heldout_participants(people, SECRET)
    assert chosen == heldout_participants(list(reversed(people)), SECRET)
    assert len(chosen) == 4
    assert heldout_participants(people, OTHER_SECRET) != chosen


# --- asl_training: the sharded shares --------------------------------------------------


def share_index(folder: Path) -> list[dict[str, str]]:
    with (folder / "train.csv").open(encoding="utf-8") as index:
        return list(csv.DictReader(index))


def shard_contents(folder: Path, upload: Path) -> dict[str, dict[str, tuple[zipfile.ZipInfo, bytes]]]:
    """A share's shards by name, each read as the zip it serves (assembled from ``upload``):
    its members' entries and bytes, every CRC checked."""
    shards = {}
    for recipe in sorted(folder.glob(f"shard-*.zip{RECIPE_SUFFIX}")):
        with VirtualZip.open(recipe, upload) as raw, zipfile.ZipFile(raw) as archive:
            shards[virtual_name(recipe) or ""] = {i.filename: (i, archive.read(i)) for i in archive.infolist()}
    return shards


def share_members(folder: Path, upload: Path, root: str = "") -> dict[str, str]:
    """Every sequence file in a share's shards, by path: the shard it is in."""
    members: dict[str, str] = {}
    with zipfile.ZipFile(upload) as original:
        methods = {i.filename: i.compress_type for i in original.infolist()}
    for name, contents in shard_contents(folder, upload).items():
        for path, (info, _) in contents.items():
            assert info.compress_type == methods[root + path]  # served as stored, never recompressed
            assert path not in members, f"{path} is in two shards"
            members[path] = name
    return members


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def repack(upload: Path, target: Path, prefix: str = "") -> Path:
    """``upload``'s members deflated under ``prefix``, written as a stream writes a zip (each
    member's sizes in a data descriptor after its data), so its local headers differ from
    its central directory's: what a member's data offset must be read from."""

    class Stream(io.RawIOBase):
        def __init__(self, out: io.BufferedWriter) -> None:
            self.out = out

        def writable(self) -> bool:
            return True

        def write(self, data: Any) -> int:
            return self.out.write(data)

    with (
        zipfile.ZipFile(upload) as original,
        target.open("wb") as out,
        zipfile.ZipFile(Stream(out), "w", zipfile.ZIP_DEFLATED) as packed,
    ):
        for info in original.infolist():
            with original.open(info) as data, packed.open(prefix + info.filename, "w") as member:
                member.write(data.read())
    return target


@pytest.mark.parametrize("packing", ["stored", "deflated"])
def test_the_split_writes_each_share_as_bounded_shards_and_loses_nothing(tmp_path: Path, packing: str) -> None:
    archive = generate(
        tmp_path / "signs.zip", n_signs=3, n_participants=12, per_participant=2, max_frames=16, as_zip=True
    )
    if packing == "deflated":
        archive = repack(archive, tmp_path / "deflated.zip", prefix="asl-signs/")
    with zipfile.ZipFile(archive) as original:
        if packing == "deflated":
            assert {i.compress_type for i in original.infolist()} == {zipfile.ZIP_DEFLATED}
            assert all(i.flag_bits & 0x8 for i in original.infolist())  # sizes after the data
        root = "asl-signs/" if packing == "deflated" else ""
        sizes = {
            i.filename[len(root) :]: i.compress_size for i in original.infolist() if i.filename.endswith(".parquet")
        }
        sign_map = original.read(root + "sign_to_prediction_index_map.json")
    shard_bytes = 4 * max(sizes.values())
    worker, held = prepare_asl(
        {"dim": 192, "blocks": 1, "max_len": 32}, archive, tmp_path / "out", SECRET, shard_bytes=shard_bytes
    )
    assert worker is not None
    assert worker.is_dir()
    assert held.is_dir()

    worker_rows, held_rows = share_index(worker), share_index(held)
    worker_members, held_members = share_members(worker, archive, root), share_members(held, archive, root)
    # Several shards, named in order from 00000, each a recipe within the bound (one member may overrun it).
    recipes = len(list(worker.glob("shard-*")))
    assert recipes >= 3
    assert sorted(p.name for p in worker.iterdir()) == [
        *(f"shard-{i:05d}.zip.recipe" for i in range(recipes)),
        "sign_to_prediction_index_map.json",
        "train.csv",
    ]
    for part in shard_contents(worker, archive).values():
        assert sum(info.compress_size for info, _ in part.values()) <= shard_bytes + max(sizes.values())
    # Each share's shards hold exactly the sequences its train.csv lists, and no train.csv.
    assert set(worker_members) == {row["path"] for row in worker_rows}
    assert set(held_members) == {row["path"] for row in held_rows}
    # Every sequence of the upload lands in exactly one share, byte for byte.
    assert set(worker_members).isdisjoint(held_members)
    assert set(worker_members) | set(held_members) == set(sizes)
    served = {**shard_contents(worker, archive), **{f"held {k}": v for k, v in shard_contents(held, archive).items()}}
    with zipfile.ZipFile(archive) as original:
        for path, shard in {**worker_members, **held_members}.items():
            key = shard if path in worker_members else f"held {shard}"
            assert served[key][path][1] == original.read(root + path)
    # No held-out participant's sequence is in a worker shard.
    held_people = {row["participant_id"] for row in held_rows}
    assert held_people
    assert held_people.isdisjoint({row["participant_id"] for row in worker_rows})
    # Both carry the whole sign map.
    assert json.loads((worker / "sign_to_prediction_index_map.json").read_text()) == json.loads(sign_map)
    assert (held / "sign_to_prediction_index_map.json").read_bytes() == (
        worker / "sign_to_prediction_index_map.json"
    ).read_bytes()


def test_a_split_costs_a_small_fraction_of_the_upload_on_disk(tmp_path: Path) -> None:
    archive = generate(
        tmp_path / "signs.zip", n_signs=4, n_participants=10, per_participant=3, max_frames=40, as_zip=True
    )
    prepare_asl({"dim": 192, "blocks": 1, "max_len": 32}, archive, tmp_path / "out", SECRET, shard_bytes=1 << 20)
    written = folder_bytes(tmp_path / "out")
    assert 0 < written < 0.02 * archive.stat().st_size, (written, archive.stat().st_size)


def test_an_oversized_sequence_file_is_refused_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import training.asl.split as split

    archive = generate(
        tmp_path / "signs.zip", n_signs=2, n_participants=4, per_participant=1, max_frames=12, as_zip=True
    )
    monkeypatch.setattr(split, "SEQUENCE_MAX_BYTES", 100)
    with pytest.raises(
        DatasetError, match=r"train.csv line 2: sequence file '.+\.parquet' is [\d,]+ bytes; at most 100"
    ):
        prepare_asl({"dim": 192, "blocks": 1, "max_len": 32}, archive, tmp_path / "out", SECRET)


def overlapping(upload: Path, target: Path) -> Path:
    """``upload`` (deflated) with every member's compressed size in its central directory
    stretched to the directory's start: each deflate stream still ends where it did, so
    every member reads back whole with its CRC, but each one's bytes now take in every
    member after it, held-out ones included."""
    data = bytearray(upload.read_bytes())
    with zipfile.ZipFile(upload) as archive:
        start = archive.start_dir
    at = start
    while data[at : at + 4] == b"PK\x01\x02":
        name, extra, comment = struct.unpack_from("<HHH", data, at + 28)
        (header,) = struct.unpack_from("<I", data, at + 42)
        local_name, local_extra = struct.unpack_from("<HH", data, header + 26)
        struct.pack_into("<I", data, at + 20, start - (header + 30 + local_name + local_extra))
        at += 46 + name + extra + comment
    target.write_bytes(bytes(data))
    return target


def test_members_whose_bytes_overlap_are_refused_not_served_over_and_over(tmp_path: Path) -> None:
    archive = generate(
        tmp_path / "signs.zip", n_signs=2, n_participants=4, per_participant=2, max_frames=12, as_zip=True
    )
    forged = overlapping(repack(archive, tmp_path / "deflated.zip"), tmp_path / "forged.zip")
    with zipfile.ZipFile(forged) as check:
        assert check.testzip() is None  # every member reads back whole, its CRC right
    # Served as recipes, the worker's share would be the upload's bytes once a member, the
    # held-out participants' among them: a small upload served and digested as many times over.
    with pytest.raises(
        DatasetError, match=r"\.parquet: cannot be served .+ its bytes in the archive overlap the next member's"
    ):
        prepare_asl({"dim": 192, "blocks": 1, "max_len": 32}, forged, tmp_path / "out", SECRET)


def test_the_sharded_worker_share_loads_as_the_sequences_it_lists(tmp_path: Path) -> None:
    from training.asl.dataset import load_dataset

    archive = generate(
        tmp_path / "signs.zip", n_signs=3, n_participants=6, per_participant=2, max_frames=16, as_zip=True
    )
    worker, held = prepare_asl(
        {"dim": 192, "blocks": 1, "max_len": 32}, archive, tmp_path / "out", SECRET, shard_bytes=1
    )
    assert worker is not None
    for share in (worker, held):
        with attach(share, archive) as readable:
            loaded = load_dataset(readable, tmp_path / "cache")
        assert len(loaded) == len(share_index(share))
    # Without its upload a virtual share does not read: it names what is missing.
    with pytest.raises(DatasetError, match=r"shard-00000.zip: is virtual and its upload \(.upload.zip\) is missing"):
        load_dataset(worker, tmp_path / "cache")
