"""A node's download of an ``asl_training`` worker share in shards, read into the dataset's
cache as it arrives, so the node never holds the raw share whole (``Kind.ingest``).

The platform's split (``training.asl.split``) writes a share's sequence files into its
shards in train.csv's order. ``ingest_shards`` fetches train.csv and the sign map, then
each shard in turn; once the node's fetch has checked a shard against the manifest's size
and sha256, its sequences (the next rows of train.csv) are decoded into the cache being
built and the shard is deleted. The node's disk then holds the cache and one shard. The
finished cache is the one ``load_dataset`` builds from the whole folder (the same frames,
offsets, labels, participants and points): it is renamed into place only once complete,
and only then is the folder marked ingested (``dataset.INGESTED_FILE``), naming each shard
and its sha256, the cache's identity now that the shards are gone. ``load_dataset`` opens
such a folder's cache.

A share that is not laid out so is kept whole instead, and the trainer reads the folder as
any other, with its errors: shards not numbered from shard-00000 without gaps, a train.csv
naming a file of the folder itself, or shards whose members are not train.csv's rows in
order (a member in two shards, one listed later than the rows still missing, a row in no
shard). The cache built so far is then dropped and the shards already deleted are fetched
again: correctness over bytes, in a case the split never writes.

A shard whose bytes differ from the manifest fails the job with the fetch's reason before
anything of it is read; a malformed sequence fails it naming the file, as the trainer
would. Nothing half-built is ever opened: an ingest that stops or fails leaves neither
the record nor a cache (only a ``.building-`` folder while it runs, removed as it ends).
An agent that restarts does not resume a job: the platform reassigns what an earlier
process had running, and the new job downloads into a fresh folder.
"""

from __future__ import annotations

import logging
import os
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from training import stop
from training.asl.dataset import (
    PARQUET_BYTES_PER_FRAME,
    CacheBuilder,
    Entry,
    building_cache,
    frame_bytes,
    ingested_cache,
    iter_sequences,
    read_index,
    record_ingested,
)
from training.asl.landmarks import selected_landmarks
from training.asl.shards import shard_name
from training.asl.source import INDEX_FILE, SHARD_NAME, Source, safe_relative
from training.asl.spec import TrainSpec
from training.plugin import FetchListed, Listed, Spec

log = logging.getLogger(__name__)


def ingest(spec: Spec, folder: Path, listed: Sequence[Listed], fetch: FetchListed) -> None:
    """``Kind.ingest`` of asl_training: the cache of the landmarks ``spec``'s model reads,
    which its run (``training.asl.run``) and a re-execution of its segments then open."""
    points = selected_landmarks(TrainSpec.from_dict(dict(spec)).use_pose)
    ingest_shards(folder, listed, fetch, points=points)


def ingest_shards(
    folder: Path, listed: Sequence[Listed], fetch: FetchListed, *, points: Sequence[int], workers: int | None = None
) -> bool:
    """Fetch the files ``listed`` into ``folder``, reading each shard into the cache of
    ``points`` and deleting it; True when the folder was ingested, False when its files were
    kept whole (see the module docstring).

    Raises what ``fetch`` raises for a file that is not what the manifest says, DatasetError
    naming the file for a malformed train.csv or sequence, CacheSpaceError when the cache
    and a shard would not fit on the disk.
    """
    kept = np.asarray(points, dtype=np.int64)
    folder.mkdir(parents=True, exist_ok=True)
    shards = sorted((f for f in listed if SHARD_NAME.fullmatch(f.name)), key=lambda f: f.name)
    for f in listed:
        if not SHARD_NAME.fullmatch(f.name):
            fetch(f.name, folder / f.name)
    names = {f.name for f in listed}
    numbered = [f.name for f in shards] == [shard_name(i) for i in range(len(shards))]
    if not shards or INDEX_FILE not in names or not numbered:
        return _keep(folder, shards, fetch)
    with Source(folder) as index:
        entries, signs = read_index(index, check_files=False)
    if any(e.path in names for e in entries):
        # load_dataset reads such a row from the folder's own file, not from a shard.
        return _keep(folder, shards, fetch)
    identity = [(f.name, f.sha256) for f in shards]
    estimate = sum(f.size_bytes for f in shards) // PARQUET_BYTES_PER_FRAME * frame_bytes(kept.size)
    # The cache, and beside it the largest shard while it is read.
    needed = estimate + max(f.size_bytes for f in shards)
    with building_cache(ingested_cache(folder, identity, kept), entries, signs, kept, needed) as cache:
        in_order = _read_shards(folder, shards, fetch, entries, cache, kept, workers or min(2, os.cpu_count() or 1))
        if in_order:
            cache.finish()
    if not in_order:
        log.warning("the dataset's shards do not hold train.csv's rows in order; keeping its files whole")
        return _keep(folder, shards, fetch)
    record_ingested(folder, identity)
    return True


def _read_shards(
    folder: Path,
    shards: list[Listed],
    fetch: FetchListed,
    entries: list[Entry],
    cache: CacheBuilder,
    points: np.ndarray,
    workers: int,
) -> bool:
    """Fetch each shard, append its rows' sequences to ``cache`` and delete it; False, at the
    first shard out of train.csv's order, leaving that shard in ``folder``."""
    position = {e.path: i for i, e in enumerate(entries)}
    seen: set[str] = set()
    done = 0
    for number, f in enumerate(shards, start=1):
        stop.check()
        path = folder / f.name
        try:
            fetch(f.name, path)
            # The checks load_dataset's Source makes of a shard: member paths, sizes, ratios.
            with Source(path, require_index=False) as shard:
                start = done
                while done < len(entries) and shard.exists(entries[done].path):
                    done += 1
                members = _member_names(path)
                if not seen.isdisjoint(members) or any(position.get(m, -1) >= done for m in members):
                    return False
                seen.update(members)
                for seq in iter_sequences(shard, [e.path for e in entries[start:done]], workers, points):
                    stop.check()
                    cache.append(seq)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        path.unlink()
        log.info(
            "read %s (%d of %d) into the cache: %d of %d sequences", f.name, number, len(shards), done, len(entries)
        )
    return done == len(entries)


def _member_names(path: Path) -> set[str]:
    """The file paths a shard holds, as ``Source`` normalises them (it has checked them)."""
    with zipfile.ZipFile(path) as archive:
        return {safe_relative(i.filename, path.name) for i in archive.infolist() if not i.is_dir()}


def _keep(folder: Path, shards: list[Listed], fetch: FetchListed) -> bool:
    """Fetch every shard ``folder`` lacks, to be read whole by the trainer; False."""
    for f in shards:
        if not (folder / f.name).is_file():
            fetch(f.name, folder / f.name)
    return False
