"""A sharded ISLR dataset: train.csv and the sign map in a folder, the sequences in
``shard-NNNNN.zip`` beside them. It reads as the same dataset in one zip does, and a
shard cannot smuggle a file in twice, escape the folder or go missing unnoticed."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from training.asl.dataset import load_dataset
from training.asl.parquet import DatasetError
from training.asl.source import Source
from training.asl.synthetic import generate

SMALL: dict[str, Any] = {"n_signs": 3, "n_participants": 2, "per_participant": 2, "max_frames": 16, "seed": 5}


@pytest.fixture
def sharded(tmp_path: Path) -> Path:
    return generate(tmp_path / "sharded", shards=3, **SMALL)


def test_a_sharded_folder_reads_as_the_same_dataset_in_one_zip(tmp_path: Path, sharded: Path) -> None:
    assert sorted(p.name for p in sharded.iterdir()) == [
        "shard-00000.zip",
        "shard-00001.zip",
        "shard-00002.zip",
        "sign_to_prediction_index_map.json",
        "train.csv",
    ]
    whole = load_dataset(generate(tmp_path / "one.zip", as_zip=True, **SMALL), tmp_path / "c1")
    parts = load_dataset(sharded, tmp_path / "c2")
    assert len(parts) == len(whole) == 12
    assert parts.signs == whole.signs
    np.testing.assert_array_equal(parts.labels, whole.labels)
    np.testing.assert_array_equal(parts.participants, whole.participants)
    np.testing.assert_array_equal(parts.lengths, whole.lengths)
    np.testing.assert_array_equal(parts.frames, whole.frames)
    with Source(sharded) as source:
        assert source.shards == ["shard-00000.zip", "shard-00001.zip", "shard-00002.zip"]
        assert len(source.files(".parquet")) == 12


def test_a_plain_file_in_the_folder_is_read_before_a_shard_member(sharded: Path) -> None:
    with Source(sharded) as source:
        name = source.files(".parquet")[0]
        (sharded / name).parent.mkdir(parents=True)
        (sharded / name).write_bytes(b"the folder's own copy")
        assert source.read(name) == b"the folder's own copy"


def _add_member(shard: Path, name: str, data: bytes = b"x") -> None:
    with zipfile.ZipFile(shard, "a") as archive:
        archive.writestr(name, data)


def test_a_file_in_two_shards_is_refused_naming_both(sharded: Path) -> None:
    with Source(sharded) as source:
        name = source.files(".parquet")[0]  # in shard-00000.zip
    _add_member(sharded / "shard-00002.zip", name, b"another copy")
    with pytest.raises(DatasetError, match=rf"^{name}: is in both shard-00000\.zip and shard-00002\.zip"):
        load_dataset(sharded, sharded.parent / "cache")


def test_a_missing_shard_is_named(sharded: Path) -> None:
    (sharded / "shard-00001.zip").unlink()
    with pytest.raises(DatasetError, match=r"^shard-00001\.zip: missing: .*\(found shard-00002\.zip\)"):
        Source(sharded)


def test_a_shard_member_escaping_the_dataset_is_refused(sharded: Path) -> None:
    _add_member(sharded / "shard-00001.zip", "../../outside.parquet")
    with pytest.raises(DatasetError, match=r"shard-00001\.zip: member '\.\./\.\./outside\.parquet'.*escapes"):
        Source(sharded)


def test_a_shard_linked_from_outside_the_folder_is_refused(tmp_path: Path, sharded: Path) -> None:
    outside = tmp_path / "elsewhere.zip"
    (sharded / "shard-00002.zip").rename(outside)
    (sharded / "shard-00002.zip").symlink_to(outside)
    with pytest.raises(DatasetError, match=r"^shard-00002\.zip: path escapes the dataset folder"):
        Source(sharded)


def test_a_damaged_shard_is_named(sharded: Path) -> None:
    (sharded / "shard-00001.zip").write_bytes(b"PK\x05\x06 not a directory")
    with pytest.raises(DatasetError, match=r"^shard-00001\.zip: not a readable zip archive"):
        load_dataset(sharded, sharded.parent / "cache")


def test_a_shard_member_expanding_too_much_is_refused(sharded: Path) -> None:
    with zipfile.ZipFile(sharded / "shard-00000.zip", "a", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("bomb.parquet", bytes(32 * 1024**2))
    with pytest.raises(DatasetError, match=r"shard-00000\.zip: member 'bomb\.parquet': expands \d+-fold"):
        Source(sharded)
