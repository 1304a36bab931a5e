"""The platform's participant-disjoint held-out split for ``asl_training``.

``prepare`` runs on the platform once per task, before any worker sees it. It reads the
uploaded ISLR archive's ``train.csv``, holds out whole participants (drawn by the
platform's secret seed for the dataset, never by the spec, so every task on one dataset
holds out the same participants), and writes two zips
in the same format: ``worker.zip`` (every other participant's sequences: what the worker
downloads) and ``heldout.zip`` (the held-out participants': what ``run.verify`` scores).
Only sequence files listed in train.csv are copied, so nothing of a held-out participant
can ride along in the worker's archive. Both carry the full sign map, so the worker's
model has a class for every sign even when a sign's only examples are held out.
"""

from __future__ import annotations

import csv
import io
import json
import math
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from training.asl.dataset import Entry, load_dataset, read_index
from training.asl.parquet import DatasetError
from training.asl.source import INDEX_FILE, SIGN_MAP_FILE, Source
from training.asl.spec import TrainSpec

WORKER_FILE = "worker.zip"
HELDOUT_FILE = "heldout.zip"
HELDOUT_FRACTION = 0.1
# One participant held out here, and the worker needs two for its own disjoint split.
MIN_PARTICIPANTS = 3


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


def _write(target: Path, source: Source, entries: list[Entry], signs: list[str]) -> None:
    index = io.StringIO()
    writer = csv.writer(index, lineterminator="\n")
    writer.writerow(["path", "participant_id", "sequence_id", "sign"])
    writer.writerows([e.path, e.participant_id, e.sequence_id, e.sign] for e in entries)
    stamp = (2023, 1, 1, 0, 0, 0)
    with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr(zipfile.ZipInfo(INDEX_FILE, stamp), index.getvalue())
        archive.writestr(zipfile.ZipInfo(SIGN_MAP_FILE, stamp), json.dumps({s: i for i, s in enumerate(signs)}))
        for path in dict.fromkeys(e.path for e in entries):
            archive.writestr(zipfile.ZipInfo(path, stamp), source.read(path))


def prepare(
    spec: Mapping[str, Any], source: Path | None, out_dir: Path, secret_seed: bytes
) -> tuple[Path | None, Path]:
    """Write ``worker.zip`` and ``heldout.zip`` into ``out_dir``, the held-out participants
    drawn by the platform's ``secret_seed``; returns their paths.

    Raises DatasetError naming the file for a malformed archive, including a malformed
    held-out sequence (those are read here, since no worker ever checks them).
    """
    if source is None:
        raise DatasetError("dataset", "asl_training needs an uploaded ISLR zip")
    TrainSpec.from_dict(dict(spec))  # ValueError naming the field for a spec no worker could run
    source = Path(source)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with Source(source, max_bytes=max(1, source.stat().st_size)) as archive:
        entries, signs = read_index(archive)
        held = set(heldout_participants([e.participant_id for e in entries], secret_seed))
        _write(out_dir / WORKER_FILE, archive, [e for e in entries if e.participant_id not in held], signs)
        _write(out_dir / HELDOUT_FILE, archive, [e for e in entries if e.participant_id in held], signs)
    with tempfile.TemporaryDirectory(prefix="asl-heldout-") as cache:
        load_dataset(out_dir / HELDOUT_FILE, Path(cache))
    return out_dir / WORKER_FILE, out_dir / HELDOUT_FILE


def dataset_signs(heldout: Path) -> list[str]:
    """The label list of a prepared archive (the full dataset's, in its order)."""
    with Source(Path(heldout), max_bytes=max(1, Path(heldout).stat().st_size)) as archive:
        return read_index(archive)[1]
