"""An ISLR dataset read once into a compact cache and memory-mapped afterwards.

The cache is one raw float32 file holding every frame of every sequence back to back,
only the points asked for (the model's, in its order: [total_frames, points, 3]), plus an
index (offsets, labels, participants, sequence ids, the points) and the label map. It is
keyed by a digest of the points, train.csv, the label map and every parquet file's stamp,
so a changed dataset is re-read and an unchanged one never is.

Building it streams: sequences are decoded by a bounded pool of threads and appended to
the file one by one (``building_cache``), so memory does not grow with the dataset, only
the cache on disk does (checked against the free space before and while it is written).
A node builds it the same way as its shards download (``training.asl.ingest``), and the
folder then keeps the cache in place of the shards, keyed on their sha256.
"""

from __future__ import annotations

import csv
import errno
import hashlib
import io
import json
import os
import shutil
import tempfile
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

import numpy as np

from training.asl.landmarks import N_LANDMARKS
from training.asl.parquet import DatasetError, read_sequence
from training.asl.source import (
    DEFAULT_MAX_MEMBER_BYTES,
    INDEX_FILE,
    SIGN_MAP_FILE,
    Source,
    default_cache_dir,
    safe_relative,
)
from training.plugin import DataUnreadable

CACHE_VERSION = "islr-cache-2"
ALL_POINTS = np.arange(N_LANDMARKS, dtype=np.int64)
# Parquet bytes a frame (543 rows) is taken to hold when the cache's size is estimated
# before it is built: the competition's files and the generator's hold about 15,000, so
# the estimate is generous; the build re-checks from what it has written.
PARQUET_BYTES_PER_FRAME = 8 * 1024
# Free space left on the cache's disk after the cache, and how often the build re-checks.
DISK_RESERVE_BYTES = 256 * 1024**2
DISK_CHECK_EVERY = 1024
# A sharded folder whose shards were read into its cache as they downloaded, and deleted
# (``training.asl.ingest``): it keeps train.csv, the sign map, this record of its shards
# and, under INGESTED_CACHE, the cache.
INGESTED_FILE = "ingested.json"
INGESTED_CACHE = ".islr_cache"
INDEX_COLUMNS = ("path", "participant_id", "sequence_id", "sign")
# train.csv is read whole, in the web process when a task is posted: its size is bounded
# (64 MiB holds about a million rows; the Kaggle ASL index is 5 MB for 94,477).
INDEX_MAX_BYTES = 64 * 1024 * 1024
# Below this many sequences a thread pool is not worth starting.
POOL_THRESHOLD = 64


@dataclass(frozen=True)
class Entry:
    """One row of train.csv, checked."""

    path: str
    participant_id: int
    sequence_id: int
    sign: str


class CacheSpaceError(OSError):
    """The cache does not fit on the node's disk; the message says how much it needs."""


@dataclass
class LandmarkDataset:
    """Every sequence of a dataset: ``sequence(i)`` is a [frames, P, 3] float32 view of the
    P landmarks ``points`` names (indices into the 543 of a frame, in column order).

    A dataset read from its index alone (``read_dataset_index``) holds no frames: its
    ``decode`` gives sequence ``i`` from its row of train.csv (``starts[i]``; its length,
    -1, is not known), or raises when the dataset's sequences are not to be read."""

    frames: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    labels: np.ndarray
    participants: np.ndarray
    sequence_ids: np.ndarray
    signs: list[str]
    points: np.ndarray = field(default_factory=lambda: ALL_POINTS)
    decode: Callable[[int], np.ndarray] | None = None

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def sequence(self, i: int) -> np.ndarray:
        """Landmarks of sequence ``i``, NaN where undetected."""
        start = int(self.starts[i])
        if self.decode is not None:
            return self.decode(start)
        return self.frames[start : start + int(self.lengths[i])]

    def landmarks(self, i: int) -> np.ndarray:
        """Sequence ``i`` as the competition's [frames, 543, 3], NaN at the points not held."""
        seq = self.sequence(i)
        out = np.full((seq.shape[0], N_LANDMARKS, 3), np.nan, dtype=np.float32)
        out[:, self.points] = seq
        return out

    def columns(self, points: Sequence[int]) -> np.ndarray | None:
        """Where each of ``points`` is in ``sequence(i)``'s second axis; None when they are all
        of it in order (no gather needed). ValueError when one is not held."""
        wanted = np.asarray(points, dtype=np.int64)
        if np.array_equal(wanted, self.points):
            return None
        position = {int(p): i for i, p in enumerate(self.points)}
        missing = [int(p) for p in wanted if int(p) not in position]
        if missing:
            raise ValueError(f"landmarks {missing[:5]} are not in this dataset's cache")
        return np.array([position[int(p)] for p in wanted], dtype=np.int64)

    def subset(self, rows: np.ndarray) -> LandmarkDataset:
        """The sequences at ``rows``, sharing the frames (no copy)."""
        return LandmarkDataset(
            frames=self.frames,
            starts=self.starts[rows],
            lengths=self.lengths[rows],
            labels=self.labels[rows],
            participants=self.participants[rows],
            sequence_ids=self.sequence_ids[rows],
            signs=self.signs,
            points=self.points,
            decode=self.decode,
        )


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def read_index(source: Source, *, check_files: bool = True) -> tuple[list[Entry], list[str]]:
    """Rows of train.csv and the label list (from the sign map when the dataset has one).
    With ``check_files`` a row naming a file the dataset lacks is a DatasetError; without,
    the caller finds the files (``training.asl.ingest``, as the shards arrive)."""
    name = INDEX_FILE
    if source.exists(INDEX_FILE) and (size := source.size(INDEX_FILE)) > INDEX_MAX_BYTES:
        raise DatasetError(name, f"is {size:,} bytes; at most {INDEX_MAX_BYTES:,} are read")
    try:
        text = source.read(INDEX_FILE).decode("utf-8-sig")
    except UnicodeDecodeError:
        raise DatasetError(name, "is not UTF-8 text") from None
    reader = csv.DictReader(io.StringIO(text))
    try:
        header = reader.fieldnames or []
    except csv.Error as exc:
        raise DatasetError(f"{name} line {reader.reader.line_num}", f"is not valid CSV ({exc})") from None
    missing = [c for c in INDEX_COLUMNS if c not in header]
    if missing:
        raise DatasetError(name, f"missing columns {', '.join(missing)} (expected {', '.join(INDEX_COLUMNS)})")
    entries: list[Entry] = []
    listed_on: dict[str, int] = {}
    for line, row in enumerate(_rows(reader, name), start=2):
        where = f"{name} line {line}"
        try:
            participant, sequence = int(row["participant_id"]), int(row["sequence_id"])
        except (TypeError, ValueError):
            raise DatasetError(where, "participant_id and sequence_id must be integers") from None
        if not (_INT64_MIN <= participant <= _INT64_MAX and _INT64_MIN <= sequence <= _INT64_MAX):
            # numpy holds them as int64 (the split, the predictions): a larger one would overflow.
            raise DatasetError(where, "participant_id and sequence_id must fit in 64 bits")
        sign = (row["sign"] or "").strip()
        if not sign:
            raise DatasetError(where, "empty sign")
        path = safe_relative(row["path"] or "", where)
        if path in (INDEX_FILE, SIGN_MAP_FILE):
            raise DatasetError(where, f"path {path!r} is the dataset's index, not a sequence file")
        if (first := listed_on.setdefault(path, line)) != line:
            # One row per file: a file listed many times would be copied and read as often.
            raise DatasetError(where, f"sequence file {path!r} is listed twice (first on line {first})")
        if check_files and not source.exists(path):
            raise DatasetError(where, f"sequence file {path!r} is missing from the dataset")
        entries.append(Entry(path, participant, sequence, sign))
    if not entries:
        raise DatasetError(name, "lists no sequences")
    return entries, _labels(source, entries)


def _rows(reader: csv.DictReader[str], name: str) -> Iterator[dict[str, str]]:
    """The rows of ``reader``; malformed CSV (a field over the csv module's 131,072-character
    limit) is a DatasetError naming the line."""
    try:
        yield from reader
    except csv.Error as exc:
        # The inner reader's count: DictReader updates its own only after a row is read.
        raise DatasetError(f"{name} line {reader.reader.line_num}", f"is not valid CSV ({exc})") from None


def _labels(source: Source, entries: list[Entry]) -> list[str]:
    if not source.exists(SIGN_MAP_FILE):
        return sorted({e.sign for e in entries})
    try:
        mapping = json.loads(source.read(SIGN_MAP_FILE))
    except (ValueError, UnicodeDecodeError):
        raise DatasetError(SIGN_MAP_FILE, "is not valid JSON") from None
    except RecursionError:  # ``[[[[…``: json raises this, not ValueError
        raise DatasetError(SIGN_MAP_FILE, "is nested too deeply") from None
    if (
        not isinstance(mapping, dict)
        or not mapping
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in mapping.values())
        or sorted(mapping.values()) != list(range(len(mapping)))
    ):
        raise DatasetError(SIGN_MAP_FILE, "must map each sign to a distinct index 0..N-1")
    for line, e in enumerate(entries, start=2):
        if e.sign not in mapping:
            raise DatasetError(f"{INDEX_FILE} line {line}", f"unknown sign {e.sign!r} (not in {SIGN_MAP_FILE})")
    return [sign for sign, _ in sorted(mapping.items(), key=lambda kv: kv[1])]


def iter_sequences(
    source: Source, paths: list[str], workers: int, points: np.ndarray | None = None
) -> Iterator[np.ndarray]:
    """Sequences in ``paths`` order (only ``points`` of each frame when given), decoded by
    ``workers`` threads when there are many.

    Threads, not processes: pyarrow decodes parquet without holding the GIL, and threads
    need neither pickling of the arrays nor a fresh interpreter per worker.
    """
    if workers <= 1 or len(paths) < POOL_THRESHOLD:
        for p in paths:
            yield _read_one(source, p, points)
        return
    with ThreadPoolExecutor(workers) as pool:
        # A bounded look-ahead keeps memory flat on large datasets.
        queue: deque[Future[np.ndarray]] = deque()
        ahead = iter(paths)
        for p in islice(ahead, workers * 8):
            queue.append(pool.submit(_read_one, source, p, points))
        while queue:
            future = queue.popleft()
            for p in islice(ahead, 1):
                queue.append(pool.submit(_read_one, source, p, points))
            yield future.result()


def _read_one(source: Source, path: str, points: np.ndarray | None) -> np.ndarray:
    return read_sequence(source.read(path), path, points)


def load_dataset(
    location: Path,
    cache_dir: Path | None = None,
    *,
    points: Sequence[int] | None = None,
    max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> LandmarkDataset:
    """Read (or reuse the cache of) the ISLR dataset at ``location``: a folder, a zip, or a
    folder of zip shards. The cache holds ``points`` of each frame (indices into the 543,
    in that order; all of them by default).

    A sharded folder whose shards were ingested as they downloaded (``INGESTED_FILE``,
    ``training.asl.ingest``) holds no shard any more, only its cache: that cache is opened
    (``cache_dir`` does not apply), and asking it for other points is a DatasetError.

    Raises DatasetError, naming the file, for anything malformed, and CacheSpaceError when
    the cache would not fit on its disk. The dataset's size is not limited here.
    """
    kept = _checked_points(points)
    if (Path(location) / INGESTED_FILE).is_file():
        return open_cache(_ingested_cache(Path(location), kept))
    with Source(location, max_member_bytes=max_member_bytes) as source:
        entries, signs = read_index(source)
        paths = [e.path for e in entries]
        key = source.fingerprint(paths, cache_version(kept))[:24]
        folder = Path(cache_dir or default_cache_dir(location)) / key
        if not (folder / "index.npz").is_file():
            parquet_bytes = sum(source.size(p) for p in paths)
            estimate = parquet_bytes // PARQUET_BYTES_PER_FRAME * frame_bytes(kept.size)
            _build_cache(
                source,
                entries,
                signs,
                folder,
                None if points is None else kept,
                estimate,
                workers or min(2, os.cpu_count() or 1),
                progress,
            )
    return open_cache(folder)


def _checked_points(points: Sequence[int] | None) -> np.ndarray:
    """``points`` (all 543 when None) as int64; ValueError unless they index a frame's landmarks."""
    kept = ALL_POINTS if points is None else np.asarray(points, dtype=np.int64)
    if kept.ndim != 1 or kept.size == 0 or kept.min() < 0 or kept.max() >= N_LANDMARKS:
        raise ValueError(f"points must be indices into the {N_LANDMARKS} landmarks of a frame")
    return kept


def index_arrays(entries: Sequence[Entry], signs: list[str]) -> dict[str, np.ndarray]:
    """Per row of train.csv, its label (the sign's position in ``signs``), participant and
    sequence id, int64: what a cache's index holds and ``read_dataset_index`` gives."""
    label_of = {s: i for i, s in enumerate(signs)}
    return {
        "labels": np.array([label_of[e.sign] for e in entries], dtype=np.int64),
        "participants": np.array([e.participant_id for e in entries], dtype=np.int64),
        "sequence_ids": np.array([e.sequence_id for e in entries], dtype=np.int64),
    }


def _not_read(row: int) -> np.ndarray:
    raise RuntimeError(f"sequence {row} of train.csv was not read: this dataset holds its index only")


def read_dataset_index(
    location: Path, *, points: Sequence[int] | None = None, max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES
) -> LandmarkDataset:
    """The dataset at ``location`` as ``load_dataset`` gives it (the same labels,
    participants, sequence ids, signs and points, row for row), read from train.csv and the
    sign map alone: no sequence file is decoded and no cache written, and its
    ``sequence(i)`` raises RuntimeError. An ingested sharded folder holds no sequence files:
    its cache is opened, memory-mapped, as ``load_dataset`` opens it.

    Raises what ``load_dataset`` raises for a malformed index or points (a sequence file
    train.csv names must exist, though it is not read)."""
    kept = _checked_points(points)
    if (Path(location) / INGESTED_FILE).is_file():
        return open_cache(_ingested_cache(Path(location), kept))
    with Source(location, max_member_bytes=max_member_bytes) as source:
        entries, signs = read_index(source)
    return _index_dataset(entries, signs, kept, _not_read)


def _index_dataset(
    entries: list[Entry], signs: list[str], points: np.ndarray, decode: Callable[[int], np.ndarray]
) -> LandmarkDataset:
    """``entries`` as a LandmarkDataset holding no frames: sequence ``i`` is ``decode(i)``."""
    return LandmarkDataset(
        frames=np.zeros((0, points.size, 3), np.float32),
        starts=np.arange(len(entries), dtype=np.int64),
        lengths=np.full(len(entries), -1, dtype=np.int64),
        signs=signs,
        points=points,
        decode=decode,
        **index_arrays(entries, signs),
    )


class SequenceUnreadable(DataUnreadable):
    """A sequence a dataset read on demand could not be decoded (the dataset's fault, not
    the caller's: never a ValueError, which a re-execution would count against a worker;
    the platform's verification takes it for its own fault, ``DataUnreadable``)."""


class OnDemand:
    """Decodes a dataset's sequences from its files when they are asked for, exactly as
    ``load_dataset``'s cache holds them (the same decoder, ``points``, float32), and keeps
    none: ``reads`` counts them. Each process opens the dataset on its first read (a
    DataLoader's worker processes share no open file with the parent)."""

    def __init__(self, location: Path, paths: list[str], points: np.ndarray, max_member_bytes: int) -> None:
        self.location, self.paths, self.points = Path(location), paths, points
        self.max_member_bytes = max_member_bytes
        self.reads = 0
        self._source: Source | None = None
        self._pid = 0
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_source": None, "_pid": 0, "_lock": None}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __call__(self, row: int) -> np.ndarray:
        path = self.paths[row]
        try:
            with self._lock:
                if self._source is None or self._pid != os.getpid():
                    self._source = Source(self.location, max_member_bytes=self.max_member_bytes)
                    self._pid = os.getpid()
                raw = self._source.read(path)
                self.reads += 1
            seq = read_sequence(raw, path, self.points)
        except Exception as exc:
            raise SequenceUnreadable(f"sequence {row} of train.csv ({path}) cannot be read: {exc}") from exc
        return np.ascontiguousarray(seq, dtype=np.float32)

    def close(self) -> None:
        """Close this process's handle on the dataset (a later read opens it again)."""
        with self._lock:
            if self._source is not None and self._pid == os.getpid():
                self._source.close()
            self._source = None


@contextmanager
def reading_on_demand(
    location: Path, *, points: Sequence[int] | None = None, max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES
) -> Iterator[LandmarkDataset]:
    """The dataset at ``location`` as ``read_dataset_index`` gives it, except that
    ``sequence(i)`` decodes sequence ``i`` from its file when asked (``OnDemand``, the
    dataset's ``decode``), for as long as the block lasts: what reads a few batches of a
    large dataset without building its cache. An ingested folder: its cache."""
    kept = _checked_points(points)
    if (Path(location) / INGESTED_FILE).is_file():
        yield open_cache(_ingested_cache(Path(location), kept))
        return
    with Source(location, max_member_bytes=max_member_bytes) as source:
        entries, signs = read_index(source)
    reader = OnDemand(location, [e.path for e in entries], kept, max_member_bytes)
    try:
        yield _index_dataset(entries, signs, kept, reader)
    finally:
        reader.close()


def cache_version(points: np.ndarray) -> str:
    """What a cache's key starts from: the cache format and the points it holds."""
    return f"{CACHE_VERSION}:{','.join(map(str, points.tolist()))}"


def ingested_cache(location: Path, shards: Sequence[tuple[str, str]], points: np.ndarray) -> Path:
    """Where the cache of ``points`` of the ingested sharded folder ``location`` lives: keyed
    like ``Source.fingerprint``, on the index files and, for each shard, its name and the
    sha256 it was checked against when it downloaded, not on files that are gone."""
    digest = hashlib.sha256(f"ingested:{cache_version(points)}".encode())
    for special in (INDEX_FILE, SIGN_MAP_FILE):
        if (location / special).is_file():
            digest.update((location / special).read_bytes())
    for name, sha256 in shards:
        digest.update(f"{name}\0{sha256}\n".encode())
    return location / INGESTED_CACHE / digest.hexdigest()[:24]


def record_ingested(location: Path, shards: Sequence[tuple[str, str]]) -> None:
    """Mark ``location`` as ingested (``INGESTED_FILE``: each shard's name and sha256),
    written whole or not at all; its cache must be in place first."""
    tmp = location / f".{INGESTED_FILE}.tmp"
    tmp.write_text(json.dumps({"shards": [{"name": n, "sha256": s} for n, s in shards]}))
    tmp.replace(location / INGESTED_FILE)


def _ingested_cache(location: Path, points: np.ndarray) -> Path:
    """The cache folder of an ingested sharded folder; DatasetError when it holds none of ``points``."""
    try:
        record = json.loads((location / INGESTED_FILE).read_text())
        shards = [(str(s["name"]), str(s["sha256"])) for s in record["shards"]]
    except (OSError, ValueError, KeyError, TypeError):
        raise DatasetError(INGESTED_FILE, "is not a record of ingested shards") from None
    folder = ingested_cache(location, shards, points)
    if not (folder / "index.npz").is_file():
        raise DatasetError(
            str(location),
            "holds no cache of these landmarks: its shards were read into the cache of its task's"
            " landmarks as they downloaded, and are gone",
        )
    return folder


def frame_bytes(points: int) -> int:
    """Bytes one frame takes in the cache."""
    return points * 3 * np.dtype(np.float32).itemsize


def check_free_space(folder: Path, needed: int) -> None:
    """CacheSpaceError unless ``folder``'s disk has ``needed`` bytes free beyond the reserve."""
    free = shutil.disk_usage(folder).free
    if free < needed + DISK_RESERVE_BYTES:
        raise CacheSpaceError(
            errno.ENOSPC,
            f"the dataset's cache needs about {needed:,} more bytes and {folder} has {free:,} free"
            f" (with {DISK_RESERVE_BYTES:,} kept spare); free some space or point PROOFWORK_ASL_CACHE"
            " at a larger disk",
        )


def _build_cache(
    source: Source,
    entries: list[Entry],
    signs: list[str],
    folder: Path,
    points: np.ndarray | None,
    estimate: int,
    workers: int,
    progress: Callable[[int, int], None] | None,
) -> None:
    """Write the cache of ``entries``, read from ``source``, to ``folder`` (``building_cache``)."""
    with building_cache(folder, entries, signs, points, estimate, progress) as cache:
        for seq in iter_sequences(source, [e.path for e in entries], workers, points):
            cache.append(seq)
        cache.finish()


class CacheBuilder:
    """A cache being written: ``append`` each sequence of its entries in order, then
    ``finish``. Made by ``building_cache``, which owns its temporary folder."""

    def __init__(
        self,
        tmp: Path,
        folder: Path,
        entries: list[Entry],
        signs: list[str],
        points: np.ndarray | None,
        progress: Callable[[int, int], None] | None,
    ) -> None:
        self.tmp, self.folder, self.entries, self.signs = tmp, folder, entries, signs
        self.points, self.progress = points, progress
        self.lengths = np.zeros(len(entries), dtype=np.int64)
        self.count = 0
        self.written = 0
        self.out = open(tmp / "frames.f32", "wb")  # noqa: SIM115 (closed by finish or building_cache)

    def append(self, seq: np.ndarray) -> None:
        """Append the next entry's sequence (its kept points)."""
        i, total = self.count, len(self.entries)
        if i >= total:
            raise ValueError(f"the cache holds {total} sequences; one more was appended")
        self.lengths[i] = seq.shape[0]
        data = np.ascontiguousarray(seq, dtype=np.float32)
        self.out.write(data.data)
        self.written += data.nbytes
        self.count = i + 1
        if self.count % DISK_CHECK_EVERY == 0:
            # The estimate is only an estimate: project from what the cache holds so far.
            self.out.flush()
            check_free_space(self.tmp, self.written * (total - self.count) // self.count)
        if self.progress is not None and (i % 256 == 0 or self.count == total):
            self.progress(self.count, total)

    def finish(self) -> None:
        """Write the index and rename the cache into place; ValueError unless every entry's
        sequence was appended."""
        if self.count != len(self.entries):
            raise ValueError(f"the cache holds {self.count} of its {len(self.entries)} sequences")
        self.out.close()
        arrays = index_arrays(self.entries, self.signs)
        np.savez(
            self.tmp / "index.npz",
            offsets=np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64),
            labels=arrays["labels"],
            participants=arrays["participants"],
            sequence_ids=arrays["sequence_ids"],
            points=ALL_POINTS if self.points is None else self.points,
        )
        (self.tmp / "signs.json").write_text(json.dumps(self.signs))
        try:
            self.tmp.rename(self.folder)
        except OSError:
            if not (self.folder / "index.npz").is_file():  # not merely a concurrent builder winning
                raise


@contextmanager
def building_cache(
    folder: Path,
    entries: list[Entry],
    signs: list[str],
    points: np.ndarray | None,
    estimate: int,
    progress: Callable[[int, int], None] | None = None,
) -> Iterator[CacheBuilder]:
    """A ``CacheBuilder`` of ``entries`` for ``folder``, written into a temporary folder
    beside it and renamed into place by ``finish``, so no reader ever sees half a cache:
    leaving the block without ``finish`` (an error, a stop) removes what was written.

    CacheSpaceError when ``estimate`` bytes do not fit beside ``folder`` at the start, when
    the projection from what is written says the rest will not, or when the disk fills up.
    """
    folder.parent.mkdir(parents=True, exist_ok=True)
    check_free_space(folder.parent, estimate)
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=folder.parent))
    cache: CacheBuilder | None = None
    try:
        cache = CacheBuilder(tmp, folder, entries, signs, points, progress)
        yield cache
    except OSError as exc:
        if exc.errno == errno.ENOSPC and not isinstance(exc, CacheSpaceError):
            raise CacheSpaceError(
                errno.ENOSPC, f"the disk of {folder.parent} filled up while the cache was written"
            ) from None
        raise
    finally:
        if cache is not None:
            cache.out.close()
        shutil.rmtree(tmp, ignore_errors=True)


def open_cache(folder: Path) -> LandmarkDataset:
    """Memory-map a cache folder written by ``load_dataset``."""
    with np.load(folder / "index.npz") as index:
        offsets = index["offsets"]
        points = index["points"]
        arrays = {k: index[k] for k in ("labels", "participants", "sequence_ids")}
    total = int(offsets[-1])
    shape = (total, points.size, 3)
    frames = (
        np.memmap(folder / "frames.f32", dtype=np.float32, mode="r", shape=shape)
        if total
        else np.zeros(shape, np.float32)
    )
    signs = json.loads((folder / "signs.json").read_text())
    return LandmarkDataset(
        frames=frames, starts=offsets[:-1], lengths=np.diff(offsets), signs=signs, points=points, **arrays
    )
