"""Cube training data: uploaded teacher embeddings, a synthetic generator, optional local text embedding.

A dataset directory may hold:

- ``embeddings.npy`` or ``embeddings.safetensors``: inputs ``[N, teacher_dim]``;
- ``targets.npy`` or ``targets.safetensors``: paired targets for dialogue mode, same shape;
  a single ``.safetensors`` file may instead carry both under the keys ``embeddings`` and
  ``targets``;
- ``texts.txt``: one sentence per line (``question<TAB>answer`` in dialogue mode), embedded by
  a sentence-transformers model already on this machine; never downloaded.

Arrays are checked for shape, dtype and finite values before training, with errors that
name the file and what is wrong.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

SYNTHETIC_CLUSTERS = 8
SYNTHETIC_RANK = 16
TEXT_MODEL_ENV = "PROOFWORK_SENTENCE_MODEL"
_FLOAT_KINDS = {np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)}


class CubeDataError(ValueError):
    """The dataset cannot be used; the message names the file and the problem."""


def validate_embeddings(array: Any, teacher_dim: int, name: str, min_rows: int = 2) -> np.ndarray:
    """``array`` as float32 ``[N, teacher_dim]`` with N ≥ ``min_rows``, or CubeDataError naming ``name``.

    Training needs two rows (a batch's similarity structure); inference embeds any one row."""
    if not isinstance(array, np.ndarray):
        raise CubeDataError(f"{name}: expected an array, got {type(array).__name__}.")
    if array.dtype not in _FLOAT_KINDS:
        raise CubeDataError(f"{name}: dtype {array.dtype} is not a float type (float16, float32 or float64).")
    if array.ndim != 2:
        raise CubeDataError(f"{name}: expected shape [N, {teacher_dim}], got {list(array.shape)}.")
    if array.shape[1] != teacher_dim:
        raise CubeDataError(
            f"{name}: rows have {array.shape[1]} dimensions but teacher_dim is {teacher_dim} (mismatched teacher_dim)."
        )
    if array.shape[0] < min_rows:
        raise CubeDataError(f"{name}: needs at least {min_rows} rows, got {array.shape[0]}.")
    finite = np.isfinite(array)
    if not finite.all():
        row = int(np.argwhere(~finite)[0][0])
        raise CubeDataError(f"{name}: contains NaN or infinite values (first at row {row}).")
    return np.ascontiguousarray(array, dtype=np.float32)


def first_non_finite_row(array: np.ndarray, block_bytes: int = 8 * 1024 * 1024) -> int | None:
    """The first row of a 2-D (memory-mapped) array holding a NaN or an infinity, or None."""
    rows = max(1, block_bytes // max(1, array.itemsize * int(np.prod(array.shape[1:]))))
    for start in range(0, array.shape[0], rows):
        finite = np.isfinite(np.asarray(array[start : start + rows])).all(axis=tuple(range(1, array.ndim)))
        if not finite.all():
            return start + int(np.argmin(finite))
    return None


def load_array(path: Path, key: str | None = None, strict: bool = False) -> np.ndarray:
    """Read one array from ``.npy`` (no pickles) or ``.safetensors`` (``key``, or its only tensor
    unless ``strict``)."""
    path = Path(path)
    try:
        if path.suffix == ".npy":
            return np.load(path, allow_pickle=False)
        if path.suffix == ".safetensors":
            from safetensors.numpy import load_file

            tensors = load_file(str(path))
            if key is not None and key in tensors:
                return tensors[key]
            if len(tensors) == 1 and not strict:
                return next(iter(tensors.values()))
            raise CubeDataError(f"{path.name}: holds {sorted(tensors)}; expected one tensor or a {key!r} key.")
    except CubeDataError:
        raise
    except Exception as exc:  # numpy and safetensors raise several types for a corrupt file
        raise CubeDataError(f"{path.name}: could not be read ({exc}).") from exc
    raise CubeDataError(f"{path.name}: unsupported file type; upload .npy or .safetensors.")


def _find(data_dir: Path, stem: str) -> Path | None:
    for suffix in (".npy", ".safetensors"):
        candidate = data_dir / f"{stem}{suffix}"
        if candidate.is_file():
            return candidate
    return None


def load_dataset(data_dir: Path, teacher_dim: int, mode: str) -> tuple[np.ndarray, np.ndarray | None] | None:
    """Inputs and (dialogue) targets from ``data_dir``, validated; None when it holds no dataset."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        return None
    inputs_path = _find(data_dir, "embeddings")
    if inputs_path is None and (data_dir / "texts.txt").is_file():
        return embed_texts(data_dir / "texts.txt", teacher_dim, mode)
    if inputs_path is None:
        return None
    inputs = validate_embeddings(load_array(inputs_path, "embeddings"), teacher_dim, inputs_path.name)
    if mode != "dialogue":
        return inputs, None
    targets_path = _find(data_dir, "targets")
    if targets_path is not None:
        raw = load_array(targets_path, "targets")
    elif inputs_path.suffix == ".safetensors":
        raw = load_array(inputs_path, "targets", strict=True)
    else:
        raise CubeDataError("Dialogue mode needs targets.npy or targets.safetensors next to the embeddings.")
    targets = validate_embeddings(raw, teacher_dim, targets_path.name if targets_path else inputs_path.name)
    if targets.shape[0] != inputs.shape[0]:
        raise CubeDataError(f"targets: {targets.shape[0]} rows but the embeddings have {inputs.shape[0]}.")
    return inputs, targets


def synthetic_embeddings(
    samples: int,
    teacher_dim: int,
    seed: int,
    mode: str = "autoencoder",
    stream: int = 0,
    *,
    samples_seed: bytes | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Structured, learnable embeddings: clusters in a low-rank subspace plus a little noise.

    ``seed`` fixes the structure (subspace, cluster centres, the dialogue map); ``stream``
    draws disjoint samples from it (the worker trains on ``stream=0``). ``samples_seed``,
    when given, draws the samples from a stream of its own instead, which no ``seed`` and
    ``stream`` reach: the platform's held-out samples come from its secret seed, so a worker
    that knows the spec knows the structure but cannot compute those rows. Values have
    roughly unit variance per dimension. In dialogue mode the target is a fixed nonlinear
    function of the input's latent code.
    """
    if samples < 2:
        raise CubeDataError(f"synthetic_samples must be at least 2 (got {samples}).")
    structure = np.random.default_rng([seed, 0x5EED])
    rank = min(SYNTHETIC_RANK, teacher_dim)
    basis = np.linalg.qr(structure.normal(size=(teacher_dim, rank)))[0].T  # [rank, dim], orthonormal rows
    centres = structure.normal(size=(SYNTHETIC_CLUSTERS, rank)) * 2.0
    mixing = structure.normal(size=(rank, rank)) / np.sqrt(rank)
    out_basis = np.linalg.qr(structure.normal(size=(teacher_dim, rank)))[0].T
    if samples_seed is None:
        draw = np.random.default_rng([seed, 0xDA7A, stream])
    else:  # entropy words that no spec's [seed, 0xDA7A, stream] can equal
        draw = np.random.default_rng([0xDA7A, 0x5EC2E7, int.from_bytes(samples_seed, "big")])
    labels = draw.integers(SYNTHETIC_CLUSTERS, size=samples)
    latent = centres[labels] + 0.5 * draw.normal(size=(samples, rank))
    scale = np.sqrt(teacher_dim / rank) / 2.0
    inputs = (latent @ basis) * scale + 0.05 * draw.normal(size=(samples, teacher_dim))
    targets = None
    if mode == "dialogue":
        targets = (np.tanh(latent @ mixing) * 2.0 @ out_basis) * scale
        targets = targets.astype(np.float32)
    return inputs.astype(np.float32), targets


def split_indices(rows: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A deterministic (train, validation) split of ``range(rows)``; validation gets at least one row."""
    order = np.random.default_rng([seed, 0x5B17]).permutation(rows)
    held = min(rows - 1, max(1, round(rows * fraction)))
    return np.sort(order[held:]), np.sort(order[:held])


def embed_texts(
    path: Path, teacher_dim: int, mode: str, model_dir: Path | None = None
) -> tuple[np.ndarray, np.ndarray | None]:
    """Embed a text file with a sentence-transformers model already on this machine.

    The model directory comes from ``model_dir`` or the ``PROOFWORK_SENTENCE_MODEL``
    environment variable; nothing is ever downloaded. Raises CubeDataError when the package
    or the model is missing, or when its width is not ``teacher_dim``.
    """
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise CubeDataError(
            "texts.txt needs the sentence-transformers package, which is not installed on this worker; "
            "upload embeddings as .npy or .safetensors instead."
        ) from exc
    location = model_dir or (Path(os.environ[TEXT_MODEL_ENV]) if os.environ.get(TEXT_MODEL_ENV) else None)
    if location is None or not Path(location).is_dir():
        raise CubeDataError(
            f"texts.txt needs a local sentence-transformers model: set {TEXT_MODEL_ENV} to its directory "
            "(models are never downloaded)."
        )
    lines = [line for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    if mode == "dialogue":
        pairs = [line.split("\t", 1) for line in lines]
        if any(len(p) != 2 for p in pairs):
            raise CubeDataError("texts.txt: dialogue mode needs one 'question<TAB>answer' pair per line.")
        questions, answers = [p[0] for p in pairs], [p[1] for p in pairs]
    else:
        questions, answers = lines, []
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = SentenceTransformer(str(location), device="cpu", local_files_only=True)
    inputs = validate_embeddings(np.asarray(model.encode(questions)), teacher_dim, "texts.txt")
    if mode != "dialogue":
        return inputs, None
    return inputs, validate_embeddings(np.asarray(model.encode(answers)), teacher_dim, "texts.txt (answers)")
