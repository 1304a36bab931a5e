"""The platform's held-out split for ``cube_training``: rows it keeps and never sends.

``prepare`` runs on the platform once per task, before any worker sees it. From an
uploaded ``.npy`` / ``.safetensors`` file it writes two files: the worker-facing file (the
same format, without the held-out rows) and ``heldout.safetensors`` (``embeddings`` and,
in dialogue mode, ``targets``). Which rows are held out follows from the platform's secret
seed for the dataset alone, never from the spec: every task on one dataset holds out the
same rows, so repeated tasks show a worker none of them. Identical rows fall on one side
together. Without an upload the worker generates synthetic stream 0 itself and the
held-out rows are samples of the same structure drawn from the secret seed
(``heldout_synthetic``). Arrays are read without pickles and checked (shape, dtype,
finite, ``teacher_dim``) before anything is written.
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


def heldout_rows(inputs: np.ndarray, targets: np.ndarray | None, secret_seed: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(worker rows, held-out rows): indices into ``inputs``, drawn by ``secret_seed`` alone.

    Identical rows (the same values, and in dialogue mode the same target) are one distinct
    row and land on one side together, so no held-out row also reaches the worker. A tenth
    of the distinct rows is held out (at least HELDOUT_MIN_ROWS, at most HELDOUT_MAX_ROWS,
    leaving the worker HELDOUT_MIN_ROWS), each once; the worker gets every copy of the rest.
    """
    rows = int(inputs.shape[0])
    first, group = _distinct_rows(inputs, targets)
    distinct = int(first.size)
    if distinct < MIN_ROWS:
        found = f"{rows} rows" if distinct == rows else f"{rows} rows but only {distinct} distinct ones"
        raise CubeDataError(f"the dataset has {found}; at least {MIN_ROWS} are needed (some are held out).")
    held = min(HELDOUT_MAX_ROWS, max(HELDOUT_MIN_ROWS, round(distinct * HELDOUT_FRACTION)), distinct - HELDOUT_MIN_ROWS)
    chosen = np.random.default_rng([int.from_bytes(secret_seed, "big"), 0x4E1D]).permutation(distinct)[:held]
    held_group = np.zeros(distinct, dtype=bool)
    held_group[chosen] = True
    return np.flatnonzero(~held_group[group]), np.sort(first[chosen])


def _distinct_rows(inputs: np.ndarray, targets: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(the first index of each distinct row, the distinct row of each row), distinct rows in
    byte order. Rows compare by value: -0.0 and 0.0 are one (validated rows hold no NaN).
    """
    values = inputs.copy() if targets is None else np.concatenate([inputs, targets], axis=1)
    values += values.dtype.type(0)  # -0.0 + 0.0 is 0.0
    keys = values.view(np.dtype((np.void, values.dtype.itemsize * values.shape[1]))).ravel()
    _, first, group = np.unique(keys, return_index=True, return_inverse=True)
    return first, group.ravel()


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


def prepare(
    spec: Mapping[str, Any], source: Path | None, out_dir: Path, secret_seed: bytes
) -> tuple[Path | None, Path]:
    """Write the worker-facing file (None for synthetic data) and the held-out file into
    ``out_dir``, the held-out rows drawn by the platform's ``secret_seed``.

    Raises CubeDataError (naming the file and the problem) when the upload cannot be used.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    heldout = out_dir / HELDOUT_FILE
    if source is None:
        _save(heldout, *heldout_synthetic(spec, secret_seed))
        return None, heldout
    source = Path(source)
    inputs, targets = read_upload(spec, source)
    keep, held = heldout_rows(inputs, targets, secret_seed)
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
