"""The platform's held-out split for ``cube_training``: rows it keeps and never sends.

``prepare`` runs on the platform once per task, before any worker sees it. From an
uploaded ``.npy`` / ``.safetensors`` file it writes two files: the worker-facing file (the
same format, without the held-out rows) and ``heldout.safetensors`` (``embeddings`` and,
in dialogue mode, ``targets``). Without an upload the worker generates synthetic stream 0
itself and the held-out rows are stream 1 of the same structure (``heldout_synthetic``).
Arrays are read without pickles and checked (shape, dtype, finite, ``teacher_dim``)
before anything is written.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from training.cube.data import CubeDataError, load_array, validate_embeddings
from training.cube.run import heldout_synthetic, training_spec

HELDOUT_FILE = "heldout.safetensors"
HELDOUT_FRACTION = 0.1
HELDOUT_MIN_ROWS = 2
# Verification re-evaluates every held-out row on the platform's CPU: bound its cost.
HELDOUT_MAX_ROWS = 2048
# validate_embeddings needs two rows on each side, and the worker splits its own part again.
MIN_ROWS = 2 * HELDOUT_MIN_ROWS


def _save(path: Path, inputs: np.ndarray, targets: np.ndarray | None) -> None:
    from safetensors.numpy import save_file

    tensors = {"embeddings": np.ascontiguousarray(inputs)}
    if targets is not None:
        tensors["targets"] = np.ascontiguousarray(targets)
    save_file(tensors, str(path))


def heldout_rows(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(worker rows, held-out rows) of ``range(rows)``, disjoint, deterministic in ``seed``."""
    if rows < MIN_ROWS:
        raise CubeDataError(f"the dataset has {rows} rows; at least {MIN_ROWS} are needed (some are held out).")
    held = min(HELDOUT_MAX_ROWS, max(HELDOUT_MIN_ROWS, round(rows * HELDOUT_FRACTION)), rows - HELDOUT_MIN_ROWS)
    order = np.random.default_rng([seed, 0x4E1D]).permutation(rows)
    return np.sort(order[held:]), np.sort(order[:held])


def read_upload(spec: Mapping[str, Any], source: Path) -> tuple[np.ndarray, np.ndarray | None]:
    """Inputs (and dialogue targets) of one uploaded file, validated against the spec."""
    full = training_spec(spec)
    dim, name = int(full["teacher_dim"]), source.name
    inputs = validate_embeddings(load_array(source, "embeddings"), dim, name)
    if full["mode"] != "dialogue":
        return inputs, None
    if source.suffix != ".safetensors":
        raise CubeDataError(
            f"{name}: dialogue mode needs paired targets; upload one .safetensors file with "
            "'embeddings' and 'targets' tensors."
        )
    targets = validate_embeddings(load_array(source, "targets", strict=True), dim, f"{name} (targets)")
    if targets.shape[0] != inputs.shape[0]:
        raise CubeDataError(f"{name}: {targets.shape[0]} target rows but {inputs.shape[0]} embedding rows.")
    return inputs, targets


def prepare(spec: Mapping[str, Any], source: Path | None, out_dir: Path) -> tuple[Path | None, Path]:
    """Write the worker-facing file (None for synthetic data) and the held-out file into ``out_dir``.

    Raises CubeDataError (naming the file and the problem) when the upload cannot be used.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    heldout = out_dir / HELDOUT_FILE
    if source is None:
        _save(heldout, *heldout_synthetic(spec))
        return None, heldout
    source = Path(source)
    inputs, targets = read_upload(spec, source)
    keep, held = heldout_rows(inputs.shape[0], int(training_spec(spec)["seed"]))
    worker = out_dir / f"worker{source.suffix}"
    if source.suffix == ".npy":
        np.save(worker, inputs[keep], allow_pickle=False)
    else:
        _save(worker, inputs[keep], targets[keep] if targets is not None else None)
    _save(heldout, inputs[held], targets[held] if targets is not None else None)
    return worker, heldout


def load_heldout(path: Path) -> tuple[np.ndarray, np.ndarray | None]:
    """The held-out inputs and (dialogue) targets ``prepare`` wrote."""
    from safetensors.numpy import load_file

    tensors = load_file(str(path))
    return tensors["embeddings"], tensors.get("targets")
