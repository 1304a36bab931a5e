"""Entry points for the asl_inference kind: predict the top signs, and spot-check a result.

Inputs are one ISLR parquet file, or a folder or zip of them (with or without train.csv;
when present its order and sequence ids are used). The result is a CSV with one row per
sequence: ``path, sequence_id, sign_1, score_1, ..., sign_k, score_k`` (softmax scores).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Generator, Iterable
from contextlib import closing
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch

from training import stop
from training.asl import export
from training.asl.dataset import read_index
from training.asl.model import SignModel
from training.asl.parquet import DatasetError, read_sequence
from training.asl.preprocess import drop_empty_frames
from training.asl.source import INDEX_FILE, Source

PREDICTIONS_FILE = "predictions.csv"
SCORE_TOLERANCE = 1e-4
SCORE_CHARS = len("0.000000")  # a softmax score as _row writes it
SEQUENCE_ID_CHARS = 20  # an int64, sign included


class PredictionsError(ValueError):
    """A predictions CSV refused while it was being read; the message says why."""


def _inputs(location: Path, max_bytes: int | None) -> list[tuple[str, int | None, np.ndarray]]:
    """(path, sequence id or None, landmarks) for every input sequence; ``max_bytes`` caps
    the input's size when given (the platform limits uploads, the node does not)."""
    location = Path(location)
    if location.is_file() and location.suffix == ".parquet":
        if max_bytes is not None and location.stat().st_size > max_bytes:
            raise DatasetError(location.name, f"file is over the {max_bytes}-byte limit")
        return [(location.name, None, read_sequence(location.read_bytes(), location.name))]
    with Source(location, max_bytes, require_index=False) as source:
        return [(p, sid, read_sequence(source.read(p), p)) for p, sid in _listed(source, location.name)]


def _listed(source: Source, name: str) -> list[tuple[str, int | None]]:
    """(path, sequence id or None) of every sequence of an archive or folder, none read yet."""
    if source.exists(INDEX_FILE):
        entries, _ = read_index(source)
        # read_index refuses a file listed twice: one prediction row per file.
        listed: list[tuple[str, int | None]] = [(e.path, e.sequence_id) for e in entries]
    else:
        listed = [(p, None) for p in source.files(".parquet")]
    if not listed:
        raise DatasetError(name, "holds no .parquet sequence files")
    return listed


def count_inputs(archive: Path, *, max_bytes: int | None = None) -> int:
    """How many sequences a zip of inputs lists, or the DatasetError ``predict`` would raise
    before reading one (the archive, its train.csv and the files it names). Cheap: the
    sequences themselves are not read, so the platform can check a dataset when it is posted."""
    with Source(Path(archive), max_bytes, require_index=False) as source:
        return len(_listed(source, Path(archive).name))


@torch.no_grad()
def _scores(model: SignModel, landmarks: np.ndarray) -> np.ndarray:
    x = drop_empty_frames(np.asarray(landmarks[:, model.config.points], dtype=np.float32), model.config.max_len)
    batch = torch.from_numpy(x)[None]
    lengths = torch.tensor([x.shape[0]], dtype=torch.long)
    logits = model(batch, lengths)[0].float()
    return torch.softmax(logits, -1).numpy()


def header(top_k: int) -> list[str]:
    """The header row of a predictions CSV that reports the top ``top_k`` signs."""
    return ["path", "sequence_id"] + [f"{kind}_{i}" for i in range(1, top_k + 1) for kind in ("sign", "score")]


def most_chars(field_lengths: Iterable[int]) -> int:
    """The most characters a CSV row of fields this long can take as ``csv.writer`` writes
    it: every field quoted, every character a doubled quote, and a two-character line end."""
    return sum(2 * n + 3 for n in field_lengths) + 1


class _Lines:
    """The lines of a text file, for ``csv.reader``, refusing a row of more than ``limit``
    characters before reading further: ``next_row`` is called between rows. Lines are read
    with a size limit, so no line, however long, is held whole."""

    def __init__(self, handle: TextIO, limit: int) -> None:
        self.handle, self.limit, self.used, self.row = handle, limit, 0, 1

    def __iter__(self) -> _Lines:
        return self

    def __next__(self) -> str:
        line = self.handle.readline(self.limit - self.used + 1)
        if not line:
            raise StopIteration
        self.used += len(line)
        if self.used > self.limit:
            raise PredictionsError(f"predictions.csv: row {self.row} is longer than {self.limit} characters.")
        return line

    def next_row(self, limit: int) -> None:
        self.limit, self.used, self.row = limit, 0, self.row + 1


def read_rows(path: Path, header_limit: int, row_limit: Callable[[list[str]], int]) -> Generator[list[str], None, None]:
    """The rows of a predictions CSV, header first, streamed from the file (never read whole).

    The header may take ``header_limit`` characters and every later row ``row_limit(header)``.
    Raises PredictionsError on a longer row, on text that is not UTF-8 and on malformed CSV.
    """
    with Path(path).open(encoding="utf-8", newline="") as handle:
        lines = _Lines(handle, header_limit)
        try:
            reader = csv.reader(lines)
            first = next(reader, None)
            if first is None:
                return
            yield first
            lines.next_row(row_limit(first))
            for row in reader:
                yield row
                lines.next_row(lines.limit)
        except UnicodeDecodeError:
            raise PredictionsError("predictions.csv is not UTF-8 text.") from None
        except csv.Error as exc:
            raise PredictionsError(f"predictions.csv: row {lines.row} is not valid CSV ({exc}).") from None


def read_header(path: Path, max_top_k: int) -> list[str]:
    """The header row of a predictions CSV (nothing after it is read): [] for an empty file.
    A header longer than one reporting ``max_top_k`` signs can be raises PredictionsError."""
    rows = read_rows(path, most_chars(map(len, header(max_top_k))), lambda _: 0)
    try:
        return next(rows, [])
    finally:
        rows.close()


def _sequence_id(sequence_id: int | None) -> str:
    """The sequence_id column as predict writes it: empty when the inputs give no ids."""
    return "" if sequence_id is None else str(sequence_id)


def _row(path: str, sequence_id: int | None, probs: np.ndarray, signs: list[str], top_k: int) -> list[str]:
    order = np.argsort(-probs, kind="stable")[:top_k]
    row = [path, _sequence_id(sequence_id)]
    for i in order:
        row += [signs[int(i)], f"{float(probs[int(i)]):.6f}"]
    return row


def predict(
    model_dir: Path,
    inputs: Path,
    out_dir: Path,
    top_k: int = 5,
    progress: Callable[[dict[str, Any]], None] | None = None,
    *,
    max_bytes: int | None = None,
) -> dict[str, Any]:
    """Write ``out_dir``/predictions.csv for every sequence in ``inputs``; returns a summary."""
    model, signs = export.load(model_dir)
    top_k = max(1, min(top_k, len(signs)))
    sequences = _inputs(inputs, max_bytes)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header(top_k))
    for n, (path, sid, landmarks) in enumerate(sequences, start=1):
        stop.check()
        writer.writerow(_row(path, sid, _scores(model, landmarks), signs, top_k))
        if progress is not None:
            progress({"event": "predict", "done": n, "total": len(sequences)})
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / PREDICTIONS_FILE).write_text(buffer.getvalue(), encoding="utf-8")
    return {"sequences": len(sequences), "top_k": top_k}


def verify_predictions(
    model_dir: Path, inputs: Path, predictions: Path, samples: int, seed: int, *, max_bytes: int | None = None
) -> dict[str, Any]:
    """Recompute ``samples`` random rows of a predictions CSV; ``ok`` when all of them match.

    A row matches when its signs are the same, in the same order, and every score is within
    1e-4 of ours (the worker may run another device or library build).

    The file is the worker's, so it is streamed, twice, and never held: refused as soon as
    it has more rows than there are input sequences or a row is longer than an honest one
    can be (``most_chars`` of the longest path, id, sign and score). The first pass keeps
    one path a row, the second only the sampled rows.
    """
    model, signs = export.load(model_dir)
    sequences = {path: (sid, landmarks) for path, sid, landmarks in _inputs(inputs, max_bytes)}
    longest = [
        max(map(len, sequences)),
        max((len(str(sid)) for sid, _ in sequences.values() if sid is not None), default=0),
    ]
    per_sign = [max(map(len, signs), default=0), SCORE_CHARS]

    def rows() -> Generator[list[str], None, None]:
        return read_rows(
            predictions,
            most_chars(map(len, header(len(signs)))),
            lambda head: most_chars(longest + per_sign * min((len(head) - 2) // 2, len(signs))),
        )

    paths: list[str] = []  # of the rows that are not blank
    count = 0  # rows after the header, blank ones too
    try:
        with closing(rows()) as stream:
            head = next(stream, [])
            if head[:2] != ["path", "sequence_id"]:
                return {"ok": False, "checked": 0, "problem": "predictions.csv has no path,sequence_id header"}
            for row in stream:
                count += 1
                if count > len(sequences):
                    problem = f"predictions.csv has more rows than the {len(sequences)} input sequences"
                    return {"ok": False, "checked": 0, "problem": problem}
                if row:
                    paths.append(row[0])
                    # What is known without the model is checked on every row, not only on
                    # the sampled ones: its width, and its sequence id (the requester's key
                    # to join the row on).
                    if len(row) != len(head):
                        problem = f"predictions.csv row {count} has {len(row)} fields, the header {len(head)}"
                        return {"ok": False, "checked": 0, "problem": problem}
                    known = sequences.get(row[0])
                    if known is not None and row[1] != _sequence_id(known[0]):
                        problem = (
                            f"predictions.csv row {count} gives {row[0]} sequence_id {row[1]!r},"
                            f" not {_sequence_id(known[0])!r}"
                        )
                        return {"ok": False, "checked": 0, "problem": problem}
    except PredictionsError as exc:
        return {"ok": False, "checked": 0, "problem": str(exc)}
    if sorted(paths) != sorted(sequences):
        return {"ok": False, "checked": 0, "problem": "predictions.csv does not cover exactly the input sequences"}
    top_k = (len(head) - 2) // 2
    rng = np.random.default_rng(seed)
    picked = {int(j) for j in rng.choice(count, size=min(samples, count), replace=False)}
    body: dict[int, list[str]] = {}
    with closing(rows()) as stream:  # the same file again, already known to be within bounds
        next(stream)
        for i, row in enumerate(stream):
            if len(body) == len(picked):
                break
            if i in picked:
                body[i] = row
    mismatched = []
    for i in sorted(picked):
        claimed = body[i]
        sid, landmarks = sequences[claimed[0]]
        ours = _row(claimed[0], sid, _scores(model, landmarks), signs, top_k)
        same = len(claimed) == len(ours) and claimed[2::2] == ours[2::2]
        if same:
            try:
                same = all(
                    abs(float(a) - float(b)) <= SCORE_TOLERANCE for a, b in zip(claimed[3::2], ours[3::2], strict=True)
                )
            except ValueError:
                same = False
        if not same:
            mismatched.append(claimed[0])
    return {"ok": not mismatched, "checked": len(picked), "mismatched": mismatched}
