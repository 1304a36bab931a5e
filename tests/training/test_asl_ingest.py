"""A worker share in shards read into its cache as it downloads (``training.asl.ingest``):
the cache is byte for byte the one ``load_dataset`` builds from the whole folder, the node's
folder ends with no shard in it, and a shard that is not what the manifest says, an ingest
cut short or a share out of train.csv's order never leaves a cache that could be used."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from training import stop
from training.asl import dataset as asl_dataset
from training.asl.dataset import INGESTED_CACHE, INGESTED_FILE, CacheSpaceError, load_dataset
from training.asl.ingest import ingest, ingest_shards
from training.asl.landmarks import selected_landmarks
from training.asl.parquet import DatasetError
from training.asl.split import prepare
from training.asl.synthetic import generate
from training.plugin import Listed
from training.virtualzip import materialise

SMALL: dict[str, Any] = {"n_signs": 4, "n_participants": 3, "per_participant": 3, "max_frames": 16, "seed": 3}
POINTS = selected_landmarks(False)
SPEC: dict[str, Any] = {"dim": 192, "blocks": 1, "max_len": 32, "epochs": 1, "batch_size": 8, "seed": 0}


class Platform:
    """Serves a sharded folder as the node's download sees it: the manifest's entries, and a
    fetch that copies a file and fails, naming it, when its bytes are not the listed sha256
    (what ``workers.agent.transfer`` checks). Records what the node's folder held at each
    fetch."""

    def __init__(self, share: Path, listed_from: Path | None = None) -> None:
        self.share = share
        source = listed_from or share
        self.listed = [
            Listed(p.name, p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(source.iterdir())
            if p.is_file()
        ]
        self.fetched: list[str] = []
        self.held_shards: list[int] = []
        self.interrupt_at: str | None = None

    def fetch(self, name: str, path: Path) -> None:
        if name == self.interrupt_at:
            raise stop.Stopped("the node is shutting down")
        self.held_shards.append(len(list(path.parent.glob("shard-*.zip"))))
        self.fetched.append(name)
        shutil.copyfile(self.share / name, path)
        listed = next(f for f in self.listed if f.name == name)
        got = hashlib.sha256(path.read_bytes()).hexdigest()
        if got != listed.sha256:
            raise RuntimeError(f"{name} has sha256 {got}, but the platform said {listed.sha256}")


def ingested(platform: Platform, folder: Path, **kwargs: Any) -> bool:
    return ingest_shards(folder, platform.listed, platform.fetch, points=POINTS, **kwargs)


def cache_files(cache: Path) -> dict[str, Any]:
    """Everything a cache folder holds: the frames' bytes, each index array, the signs."""
    with np.load(cache / "index.npz") as index:
        arrays = {k: index[k].tolist() for k in index.files}
    return {
        "frames": hashlib.sha256((cache / "frames.f32").read_bytes()).hexdigest(),
        "index": arrays,
        "signs": json.loads((cache / "signs.json").read_text()),
    }


def only_cache(root: Path) -> Path:
    (cache,) = [p for p in root.iterdir() if p.is_dir()]
    return cache


@pytest.fixture
def share(tmp_path: Path) -> Path:
    """The worker share the platform's own split writes, in several shards."""
    upload = generate(tmp_path / "upload.zip", as_zip=True, **SMALL)
    worker, _ = prepare(SPEC, upload, tmp_path / "split", bytes(32), shard_bytes=20_000)
    assert worker is not None
    # What the platform serves of its virtual shards: the node's download.
    served = materialise(worker, upload, tmp_path / "share")
    assert len(list(served.glob("shard-*.zip"))) >= 4
    return served


@pytest.mark.parametrize("made_by", ["split", "generator"])
def test_the_ingested_cache_is_the_one_the_whole_folder_gives(tmp_path: Path, share: Path, made_by: str) -> None:
    if made_by == "generator":
        share = generate(tmp_path / "generated", shards=5, **SMALL)
    platform = Platform(share)
    node = tmp_path / "node" / "dataset.shards"
    assert ingested(platform, node)

    whole = load_dataset(share, tmp_path / "whole-cache", points=POINTS)
    mine = load_dataset(node, tmp_path / "unused", points=POINTS)
    assert cache_files(only_cache(node / INGESTED_CACHE)) == cache_files(only_cache(tmp_path / "whole-cache"))
    assert not (tmp_path / "unused").exists()  # the folder's own cache, nothing built elsewhere
    for field in ("frames", "starts", "lengths", "labels", "participants", "sequence_ids", "points"):
        np.testing.assert_array_equal(getattr(mine, field), getattr(whole, field))
    assert mine.signs == whole.signs
    # The node keeps the index files, the record and the cache: not one shard.
    assert sorted(p.name for p in node.iterdir()) == sorted(
        [INGESTED_CACHE, INGESTED_FILE, "sign_to_prediction_index_map.json", "train.csv"]
    )
    # Each shard was fetched once, and the folder never held more than the one arriving.
    shards = sorted(p.name for p in share.glob("shard-*.zip"))
    assert [n for n in platform.fetched if n.startswith("shard-")] == shards
    assert max(platform.held_shards) == 0


def test_the_kind_ingests_the_points_its_spec_trains_on(tmp_path: Path, share: Path) -> None:
    platform = Platform(share)
    node = tmp_path / "dataset.shards"
    ingest({**SPEC, "use_pose": True}, node, platform.listed, platform.fetch)
    assert len(load_dataset(node, points=selected_landmarks(True)).points) == len(selected_landmarks(True))
    with pytest.raises(DatasetError, match="holds no cache of these landmarks"):
        load_dataset(node, points=POINTS)


def no_usable_cache(node: Path) -> None:
    """Nothing in ``node`` that load_dataset would open: no record, no cache, not half of one."""
    assert not (node / INGESTED_FILE).exists()
    caches = node / INGESTED_CACHE
    assert not caches.exists() or list(caches.iterdir()) == []
    with pytest.raises(DatasetError):
        load_dataset(node, node.parent / "fresh-cache", points=POINTS)


def test_a_shard_that_is_not_what_the_manifest_says_fails_and_leaves_no_cache(tmp_path: Path, share: Path) -> None:
    served = tmp_path / "served"
    shutil.copytree(share, served)
    tampered = served / "shard-00002.zip"
    body = bytearray(tampered.read_bytes())
    body[200] ^= 1
    tampered.write_bytes(bytes(body))
    platform = Platform(served, listed_from=share)
    node = tmp_path / "dataset.shards"
    with pytest.raises(RuntimeError, match=r"shard-00002\.zip has sha256 \w+, but the platform said"):
        ingested(platform, node)
    assert not (node / tampered.name).exists()  # not kept, and nothing of it read
    no_usable_cache(node)


def test_an_ingest_cut_short_leaves_nothing_usable(tmp_path: Path, share: Path) -> None:
    platform = Platform(share)
    platform.interrupt_at = "shard-00002.zip"
    node = tmp_path / "dataset.shards"
    with pytest.raises(stop.Stopped):
        ingested(platform, node)
    no_usable_cache(node)


def test_shards_out_of_train_csv_order_are_kept_whole_and_read_as_before(tmp_path: Path, share: Path) -> None:
    served = tmp_path / "served"
    shutil.copytree(share, served)
    # The same files, the last two shards' numbers swapped: a layout the split never writes.
    names = sorted(p.name for p in served.glob("shard-*.zip"))
    (served / names[-1]).rename(served / "last")
    (served / names[-2]).rename(served / names[-1])
    (served / "last").rename(served / names[-2])
    platform = Platform(served)
    node = tmp_path / "dataset.shards"
    assert not ingested(platform, node)
    assert not (node / INGESTED_FILE).exists()
    assert sorted(p.name for p in node.glob("shard-*.zip")) == names
    # The shards read (and deleted) before the one out of order were fetched again.
    assert [platform.fetched.count(name) for name in names] == [2] * (len(names) - 2) + [1, 1]
    mine = load_dataset(node, tmp_path / "c1", points=POINTS)
    theirs = load_dataset(served, tmp_path / "c2", points=POINTS)
    np.testing.assert_array_equal(mine.frames, theirs.frames)
    np.testing.assert_array_equal(mine.labels, theirs.labels)


def test_a_cache_that_would_not_fit_fails_before_a_shard_is_fetched(
    tmp_path: Path, share: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    free = shutil.disk_usage(tmp_path).free
    monkeypatch.setattr(asl_dataset, "DISK_RESERVE_BYTES", free)
    platform = Platform(share)
    node = tmp_path / "dataset.shards"
    with pytest.raises(CacheSpaceError, match="the dataset's cache needs about"):
        ingested(platform, node)
    assert not [n for n in platform.fetched if n.startswith("shard-")]
    no_usable_cache(node)
