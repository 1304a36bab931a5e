"""The platform's participant-disjoint held-out split for ``asl_training``.

``prepare`` runs on the platform once per task, before any worker sees it. It reads the
uploaded ISLR archive's ``train.csv``, holds out whole participants (drawn by the
platform's secret seed for the dataset, never by the spec, so every task on one dataset
holds out the same participants), and writes two sharded folders:
``worker/`` (every other participant's sequences: what the worker downloads) and
``heldout/`` (the held-out participants': what ``run.verify`` scores).

A sharded folder (``training.asl.shards``; ``training.asl.source.Source`` reads one) holds
train.csv and the sign map at its root and the sequence files in shard zips of at most
about ``SHARD_BYTES``. The shards are virtual (``training.virtualzip``): each is a recipe
naming its members' raw bytes in the upload, which is the one copy of the dataset's bytes;
a share costs its index and recipes, a small fraction of the upload, however many tasks
use one dataset. The platform serves and reads a shard by assembling it from the upload,
a deflated member as it is (nothing is inflated and deflated again). Only sequence files
listed in train.csv are named, so nothing of a held-out participant can ride along in the
worker's share. Every member is read once here (its CRC checked, and each held-out sequence
decoded), one at a time, so the split's memory holds one sequence file and train.csv
whatever the dataset's size. Both carry the full sign map, so the worker's model has a
class for every sign even when a sign's only examples are held out.
"""

from __future__ import annotations

import bisect
import csv
import io
import json
import math
import zipfile
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from training.asl.dataset import Entry, read_index
from training.asl.parquet import DatasetError, read_sequence
from training.asl.shards import shard_name
from training.asl.source import INDEX_FILE, SIGN_MAP_FILE, Source, safe_relative
from training.asl.spec import TrainSpec
from training.virtualzip import RECIPE_SUFFIX, Member, Recipe, VirtualZipError, digest, locate

WORKER_DIR = "worker"
HELDOUT_DIR = "heldout"
HELDOUT_FRACTION = 0.1
# One participant held out here, and the worker needs two for its own disjoint split.
MIN_PARTICIPANTS = 3
# A shard closes once the next member's stored bytes would take it past this size (one larger
# member is a shard of its own): big enough that a full-scale set is a few hundred files, small enough
# that a download resumed or checked again costs little.
SHARD_BYTES = 256 * 1024**2
# One ISLR sequence is at most a few MB (a few hundred frames of 543 landmarks); the split
# holds one in memory at a time, so a member larger than this is refused, naming it.
SEQUENCE_MAX_BYTES = 64 * 1024**2
# The sequence files train.csv lists may total this many times the archive's size (and
# EXPANSION_FLOOR): parquet barely compresses, and what the split reads is bounded by
# the upload's size, not by what a deflated archive expands to.
EXPANSION = 4
EXPANSION_FLOOR = 8 * 1024**3


def open_upload(path: Path) -> Source:
    """The uploaded archive (whatever its size: the platform's upload limit bounds it);
    what the split would write of it is checked by ``check_sizes``."""
    return Source(Path(path), max_bytes=max(1, Path(path).stat().st_size))


def check_sizes(source: Source, entries: list[Entry]) -> None:
    """DatasetError naming the first listed sequence file over ``SEQUENCE_MAX_BYTES``, or
    the archive when its listed files total more than ``EXPANSION`` times its size."""
    total = 0
    for line, entry in enumerate(entries, start=2):
        if (size := source.size(entry.path)) > SEQUENCE_MAX_BYTES:
            raise DatasetError(
                f"{INDEX_FILE} line {line}",
                f"sequence file {entry.path!r} is {size:,} bytes; at most {SEQUENCE_MAX_BYTES:,} are read",
            )
        total += size
    archive = max(1, source.location.stat().st_size)
    if total > max(EXPANSION_FLOOR, EXPANSION * archive):
        raise DatasetError(
            source.location.name,
            f"expands to {total:,} bytes of sequence files, over {EXPANSION} times its {archive:,} bytes",
        )


def heldout_participants(participants: list[int], secret_seed: bytes) -> list[int]:
    """The participants the platform keeps: a tenth (at least one, leaving two), drawn by
    the platform's ``secret_seed``."""
    ids = np.unique(np.asarray(participants, dtype=np.int64))
    if ids.size < MIN_PARTICIPANTS:
        raise DatasetError(
            INDEX_FILE, f"has {ids.size} participant(s); at least {MIN_PARTICIPANTS} are needed (one is held out)"
        )
    count = min(ids.size - 2, max(1, math.ceil(HELDOUT_FRACTION * ids.size)))
    order = np.random.default_rng([int.from_bytes(secret_seed, "big"), 0x4E1D]).permutation(ids)
    return sorted(int(i) for i in order[:count])


def _write_share(
    target: Path, upload: Path, source: Source, entries: list[Entry], signs: list[str], shard_bytes: int, check: bool
) -> None:
    """One sharded folder of ``entries`` whose shards are recipes over ``upload``; each member
    is read once (its CRC checked; ``check`` also decodes it: the held-out share, which no
    worker ever reads and reports on), and each shard once more for its digest."""
    target.mkdir(parents=True)
    index = io.StringIO()
    writer = csv.writer(index, lineterminator="\n")
    writer.writerow(["path", "participant_id", "sequence_id", "sign"])
    writer.writerows([e.path, e.participant_id, e.sequence_id, e.sign] for e in entries)
    (target / INDEX_FILE).write_text(index.getvalue(), encoding="utf-8")
    (target / SIGN_MAP_FILE).write_text(json.dumps({s: i for i, s in enumerate(signs)}), encoding="utf-8")
    size = upload.stat().st_size
    with zipfile.ZipFile(upload) as archive, upload.open("rb") as raw:
        infos = {safe_relative(i.filename, upload.name): i for i in archive.infolist() if not i.is_dir()}
        # Where each member's data must end: the next local header, or the central directory.
        starts = sorted({i.header_offset for i in archive.infolist()} | {archive.start_dir, size})
        shards: list[list[Member]] = []
        filled = 0
        for entry in entries:
            data = source.read(entry.path)  # a DatasetError naming a damaged member
            if check:
                read_sequence(data, entry.path)
            info = infos[source.prefix + entry.path]
            try:
                end = starts[min(bisect.bisect_right(starts, info.header_offset), len(starts) - 1)]
                member = locate(raw, info, size, end=end)
            except VirtualZipError as exc:
                raise DatasetError(entry.path, f"cannot be served from the archive ({exc})") from None
            member = replace(member, name=entry.path)
            if not shards or (filled and filled + member.compress_size > shard_bytes):
                shards.append([])
                filled = 0
            shards[-1].append(member)
            filled += member.compress_size + 30 + len(entry.path.encode())  # the member's local header
    for number, members in enumerate(shards):
        recipe = digest(Recipe(tuple(members), size), upload)
        (target / (shard_name(number) + RECIPE_SUFFIX)).write_bytes(recipe.to_json())


def prepare(
    spec: Mapping[str, Any], source: Path | None, out_dir: Path, secret_seed: bytes, *, shard_bytes: int = SHARD_BYTES
) -> tuple[Path | None, Path]:
    """Write the sharded folders ``worker/`` and ``heldout/`` into ``out_dir``, the held-out
    participants drawn by the platform's ``secret_seed``; returns their paths.

    Raises DatasetError naming the file for a malformed archive, including a malformed
    held-out sequence (those are read here, since no worker ever checks them).
    """
    if source is None:
        raise DatasetError("dataset", "asl_training needs an uploaded ISLR zip")
    TrainSpec.from_dict(dict(spec))  # ValueError naming the field for a spec no worker could run
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with open_upload(Path(source)) as archive:
        entries, signs = read_index(archive)
        check_sizes(archive, entries)
        held = set(heldout_participants([e.participant_id for e in entries], secret_seed))
        worker = [e for e in entries if e.participant_id not in held]
        kept = [e for e in entries if e.participant_id in held]
        _write_share(out_dir / HELDOUT_DIR, Path(source), archive, kept, signs, shard_bytes, check=True)
        _write_share(out_dir / WORKER_DIR, Path(source), archive, worker, signs, shard_bytes, check=False)
    return out_dir / WORKER_DIR, out_dir / HELDOUT_DIR


def dataset_signs(heldout: Path) -> list[str]:
    """The label list of a prepared share (the full dataset's, in its order): a sharded
    folder's sign map, which the split wrote, or a prepared archive's."""
    heldout = Path(heldout)
    if heldout.is_dir():
        mapping = json.loads((heldout / SIGN_MAP_FILE).read_text(encoding="utf-8"))
        return [sign for sign, _ in sorted(mapping.items(), key=lambda kv: kv[1])]
    with Source(heldout, max_bytes=max(1, heldout.stat().st_size)) as archive:
        return read_index(archive)[1]
