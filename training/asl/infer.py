"""Entry points for the asl_inference kind: predict the top signs, and spot-check a result.

Inputs are one ISLR parquet file, or a folder or zip of them (with or without train.csv;
when present its order and sequence ids are used). The result is a CSV with one row per
sequence: ``path, sequence_id, sign_1, score_1, ..., sign_k, score_k`` (softmax scores).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from training.asl import export
from training.asl.dataset import read_index
from training.asl.model import SignModel
from training.asl.parquet import DatasetError, read_sequence
from training.asl.preprocess import drop_empty_frames
from training.asl.source import DEFAULT_MAX_BYTES, INDEX_FILE, Source

PREDICTIONS_FILE = "predictions.csv"
SCORE_TOLERANCE = 1e-4


def _inputs(location: Path, max_bytes: int) -> list[tuple[str, int | None, np.ndarray]]:
    """(path, sequence id or None, landmarks) for every input sequence."""
    location = Path(location)
    if location.is_file() and location.suffix == ".parquet":
        if location.stat().st_size > max_bytes:
            raise DatasetError(location.name, f"file is over the {max_bytes}-byte limit")
        return [(location.name, None, read_sequence(location.read_bytes(), location.name))]
    with Source(location, max_bytes, require_index=False) as source:
        if source.exists(INDEX_FILE):
            entries, _ = read_index(source)
            listed: list[tuple[str, int | None]] = [(e.path, e.sequence_id) for e in entries]
        else:
            listed = [(p, None) for p in source.files(".parquet")]
        if not listed:
            raise DatasetError(location.name, "holds no .parquet sequence files")
        return [(p, sid, read_sequence(source.read(p), p)) for p, sid in listed]


@torch.no_grad()
def _scores(model: SignModel, landmarks: np.ndarray) -> np.ndarray:
    x = drop_empty_frames(np.asarray(landmarks[:, model.config.points], dtype=np.float32), model.config.max_len)
    batch = torch.from_numpy(x)[None]
    lengths = torch.tensor([x.shape[0]], dtype=torch.long)
    logits = model(batch, lengths)[0].float()
    return torch.softmax(logits, -1).numpy()


def _row(path: str, sequence_id: int | None, probs: np.ndarray, signs: list[str], top_k: int) -> list[str]:
    order = np.argsort(-probs, kind="stable")[:top_k]
    row = [path, "" if sequence_id is None else str(sequence_id)]
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
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> dict[str, Any]:
    """Write ``out_dir``/predictions.csv for every sequence in ``inputs``; returns a summary."""
    model, signs = export.load(model_dir)
    top_k = max(1, min(top_k, len(signs)))
    sequences = _inputs(inputs, max_bytes)
    header = ["path", "sequence_id"] + [f"{kind}_{i}" for i in range(1, top_k + 1) for kind in ("sign", "score")]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    for n, (path, sid, landmarks) in enumerate(sequences, start=1):
        writer.writerow(_row(path, sid, _scores(model, landmarks), signs, top_k))
        if progress is not None:
            progress({"event": "predict", "done": n, "total": len(sequences)})
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / PREDICTIONS_FILE).write_text(buffer.getvalue())
    return {"sequences": len(sequences), "top_k": top_k}


def verify_predictions(
    model_dir: Path, inputs: Path, predictions: Path, samples: int, seed: int, *, max_bytes: int = DEFAULT_MAX_BYTES
) -> dict[str, Any]:
    """Recompute ``samples`` random rows of a predictions CSV; ``ok`` when all of them match.

    A row matches when its signs are the same, in the same order, and every score is within
    1e-4 of ours (the worker may run another device or library build).
    """
    model, signs = export.load(model_dir)
    sequences = {path: (sid, landmarks) for path, sid, landmarks in _inputs(inputs, max_bytes)}
    rows = list(csv.reader(io.StringIO(Path(predictions).read_text())))
    if not rows or rows[0][:2] != ["path", "sequence_id"]:
        return {"ok": False, "checked": 0, "problem": "predictions.csv has no path,sequence_id header"}
    body = rows[1:]
    if sorted(r[0] for r in body if r) != sorted(sequences):
        return {"ok": False, "checked": 0, "problem": "predictions.csv does not cover exactly the input sequences"}
    top_k = (len(rows[0]) - 2) // 2
    rng = np.random.default_rng(seed)
    picked = rng.choice(len(body), size=min(samples, len(body)), replace=False)
    mismatched = []
    for i in sorted(int(j) for j in picked):
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
