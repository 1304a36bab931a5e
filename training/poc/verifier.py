"""The platform's side: check a worker's product without recomputing it.

Order of checks, each failing with its own ``code``: the spec and seed material; the
claimed hash's form; the artifact's layout (``unreadable``, ``tensors``, ``dtype``,
``shape``); the Merkle root over C's rows against the claimed result_hash
(``root_mismatch``); every entry within the honest range (``out_of_range``); then
Freivalds' check against A and B regenerated from the seed (``product_mismatch``).

Freivalds' check. For C ≠ A·B, D = C − A·B has a row d with some d_j ≠ 0. With r drawn
uniformly from {0, …, m−1}^n, fix every r_k but r_j: d·r = 0 holds for at most one value
of r_j, so one round accepts with probability ≤ 1/m. Rounds use independent r, so
``rounds`` rounds accept a wrong C with probability ≤ m^−rounds. We take m = 2^bits with
bits as large as exact float64 arithmetic allows (see ``freivalds_bits``) and
rounds = ⌈60 / bits⌉, so the false-acceptance probability is ≤ 2^−60. r comes from
os.urandom after the artifact is fixed, so the worker cannot predict it. Each round
costs three n×n matrix-vector products, O(n²), against the O(n³) of recomputing C; the
rounds run together as the columns of one BLAS product, a block of rows at a time.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from training.device import keep_freed_memory
from training.poc.commit import ArtifactProblem, iter_products, result_hash, row_leaf_hashes
from training.poc.generate import generate_matrix, generate_rows
from training.poc.pool import parallel_map
from training.poc.spec import PocError, PocSpec, parse_seed_material, parse_spec

SECURITY_BITS = 60
# Every partial sum is an integer of magnitude < 2^53, so float64 BLAS is exact.
_FLOAT64_EXACT_BITS = 53
_BLOCK_ROWS = 256


@dataclass(frozen=True)
class VerificationResult:
    """The verdict on one artifact: ``ok``, a sentence for people, a stable ``code``."""

    ok: bool
    reason: str
    seconds: float
    code: str = "ok"
    timings: Mapping[str, float] = field(default_factory=dict)


def freivalds_bits(spec: PocSpec) -> int:
    """log2 of m, the size of the set each entry of r is drawn from.

    Overflow bound: after the range check |C_ij| ≤ n·b² and |A_ij|, |B_ij| ≤ b, so with
    0 ≤ r_j < m every partial sum of
      B·r      is at most n·b·m,
      A·(B·r)  is at most n·b·(n·b·m) = n²b²·m,
      C·r      is at most n·(n·b²)·m = n²b²·m
    in magnitude, in whatever order the sum is taken. With m = 2^bits and
    bits = 53 − bitlen(n²b²) this stays below 2^53, so every partial sum is an integer
    float64 represents exactly, whatever order BLAS adds in. For n = 2048, b = 8 that
    gives bits = 24 and 3 rounds; for the largest spec (n = 2^14, n²b² = 2^34) bits = 18
    and 4 rounds.
    """
    bits = _FLOAT64_EXACT_BITS - (spec.n**2 * spec.entry_bound**2).bit_length()
    return max(1, min(bits, SECURITY_BITS))


def rounds_for(spec: PocSpec) -> int:
    """Rounds for a false-acceptance probability ≤ 2^−60."""
    return math.ceil(SECURITY_BITS / freivalds_bits(spec))


def random_vectors(n: int, rounds: int, bits: int) -> npt.NDArray[np.int64]:
    """``rounds`` vectors (as rows) of n entries uniform in [0, 2^bits), from os.urandom."""
    raw = np.frombuffer(os.urandom(8 * n * rounds), dtype="<u8").reshape(rounds, n)
    return (raw & np.uint64((1 << bits) - 1)).astype(np.int64)


def matvecs(matrix: npt.NDArray[Any], vectors: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """matrix · v for every row v of ``vectors``, exactly in int64.

    The matrix is widened to int64 a block of rows at a time, so the widened copy stays in
    cache and memory stays bounded however large n is.
    """
    out = np.empty((vectors.shape[0], matrix.shape[0]), dtype=np.int64)

    def block(lo: int) -> None:
        widened = matrix[lo : lo + _BLOCK_ROWS].astype(np.int64)
        for k in range(vectors.shape[0]):
            out[k, lo : lo + _BLOCK_ROWS] = widened @ vectors[k]

    parallel_map(block, range(0, matrix.shape[0], _BLOCK_ROWS))
    return out


def _exact_products(matrix: npt.NDArray[Any], columns: torch.Tensor) -> torch.Tensor:
    """matrix · columns in float64 BLAS, exact under the bounds of ``freivalds_bits``.

    The integer matrix is widened a block of rows at a time, so the widened copy stays in
    cache and memory stays bounded however large n is.
    """
    source = torch.from_numpy(np.ascontiguousarray(matrix))
    out = torch.empty((matrix.shape[0], columns.shape[1]), dtype=torch.float64)
    for lo in range(0, matrix.shape[0], _BLOCK_ROWS):
        torch.matmul(source[lo : lo + _BLOCK_ROWS].to(torch.float64), columns, out=out[lo : lo + _BLOCK_ROWS])
    return out


def freivalds(
    a: npt.NDArray[np.int8], b: npt.NDArray[np.int8], c: npt.NDArray[np.int32], vectors: npt.NDArray[np.int64]
) -> bool:
    """True when A·(B·r) = C·r for every r in ``vectors`` (bounds: ``freivalds_bits``).

    Requires |C_ij| ≤ n·b² (the range check runs first) and r in [0, 2^freivalds_bits).
    """
    columns = torch.from_numpy(np.ascontiguousarray(vectors.T, dtype=np.float64))
    left = _exact_products(a, _exact_products(b, columns))
    right = _exact_products(c, columns)
    return bool(torch.equal(left, right))


def _check_product(
    pair: int,
    c: npt.NDArray[np.int32],
    seed: bytes,
    params: PocSpec,
    rounds: int,
    bits: int,
    timings: dict[str, float],
) -> str | None:
    """Freivalds' check of one in-range product; None when it passes, else the reason."""
    tick = time.perf_counter()
    a = generate_matrix(seed, "A", pair, params.n, params.entry_bound, generator=params.generator)
    b = generate_matrix(seed, "B", pair, params.n, params.entry_bound, generator=params.generator)
    mid = time.perf_counter()
    passed = freivalds(a, b, c, random_vectors(params.n, rounds, bits))  # exact: the range check passed
    timings["generate"] += mid - tick
    timings["freivalds"] += time.perf_counter() - mid
    return None if passed else f"Product c{pair} is not A·B for this task's seed (Freivalds' check failed)."


def _fail(code: str, reason: str, started: float, timings: Mapping[str, float] | None = None) -> VerificationResult:
    return VerificationResult(False, reason, time.perf_counter() - started, code, dict(timings or {}))


def verify(
    spec: Mapping[str, Any],
    seed_material: Mapping[str, Any],
    artifact_path: Path,
    claimed_result_hash: str,
    rounds: int | None = None,
) -> VerificationResult:
    """Decide whether ``artifact_path`` holds the product the task asked for.

    Never raises on a bad artifact or claim: every failure is a VerificationResult with
    ``ok=False``, a ``code`` and a reason naming what was wrong. ``rounds`` overrides the
    number of Freivalds rounds (fewer than ``rounds_for(spec)`` weakens the 2^−60 bound).
    ``timings`` splits the seconds into hash, generate and freivalds.
    """
    started = time.perf_counter()
    timings: dict[str, float] = {"hash": 0.0, "generate": 0.0, "freivalds": 0.0}
    try:
        params = parse_spec(spec)
        seed = parse_seed_material(seed_material).seed
    except PocError as exc:
        return _fail(
            "spec" if exc.field in ("spec", "n", "count", "entry_bound", "generator") else "seed", str(exc), started
        )
    if rounds is not None and (type(rounds) is not int or rounds < 1):
        raise ValueError("rounds must be a positive integer")
    claimed = claimed_result_hash.lower() if isinstance(claimed_result_hash, str) else ""
    if len(claimed) != 64 or any(ch not in "0123456789abcdef" for ch in claimed):
        return _fail("result_hash", "result_hash: must be 64 hexadecimal digits.", started)
    n, count, limit = params.n, params.count, params.max_abs_entry

    needed = rounds_for(params)
    vectors_per_pair = needed if rounds is None else rounds
    bits = freivalds_bits(params)
    leaves: list[bytes] = []
    out_of_range: str | None = None
    mismatch: str | None = None
    # One pass per product, reading it once: SHA-256 of C's rows and the range check, then
    # Freivalds' check against A and B regenerated from the seed. (Hashing on a thread of
    # its own beside the product check measured no faster on two cores: both already use
    # every core, and each row's digest re-takes the GIL.)
    keep_freed_memory()
    try:
        for pair, c in enumerate(iter_products(Path(artifact_path), n, count)):
            tick = time.perf_counter()
            leaves.extend(row_leaf_hashes(pair, c))
            in_range = bool(int(c.max()) <= limit and int(c.min()) >= -limit)
            timings["hash"] += time.perf_counter() - tick
            if count == 1 and result_hash(leaves) != claimed:
                break  # one product: the root is known now, and it decides (below)
            if out_of_range is None and not in_range:
                out_of_range = f"product c{pair} has an entry beyond ±{limit}, which no product of these matrices has."
            if out_of_range is None and mismatch is None:
                # Once a product fails, the verdict no longer depends on a product check.
                mismatch = _check_product(pair, c, seed, params, vectors_per_pair, bits, timings)
    except ArtifactProblem as exc:
        return _fail(exc.code, str(exc), started, timings)
    if result_hash(leaves) != claimed:
        return _fail(
            "root_mismatch",
            "The Merkle root over the artifact's rows differs from the claimed result_hash.",
            started,
            timings,
        )
    if out_of_range is not None:
        return _fail("out_of_range", out_of_range, started, timings)
    if mismatch is not None:
        return _fail("product_mismatch", mismatch, started, timings)
    return VerificationResult(
        True,
        f"Verified {count} product(s) of {n}×{n}: Merkle root matches, Freivalds' check passed "
        f"({vectors_per_pair} round(s) of 2^{bits}).",
        time.perf_counter() - started,
        "ok",
        timings,
    )


def expected_row(spec: Mapping[str, Any], seed_material: Mapping[str, Any], pair: int, row: int) -> list[int]:
    """Row ``row`` of the honest product ``pair``, recomputed exactly in O(n²).

    Lets anyone holding a row proof (``prove_row``) check that the committed row is also
    the right one, without the artifact. Raises PocError for a bad spec or seed and
    IndexError for a row outside the task.
    """
    params = parse_spec(spec)
    seed = parse_seed_material(seed_material).seed
    if not (0 <= pair < params.count and 0 <= row < params.n):
        raise IndexError(f"row {row} of product {pair} is outside {params.count} product(s) of {params.n}×{params.n}")
    a_row = generate_rows(seed, "A", pair, params.n, params.entry_bound, row, row + 1, generator=params.generator)[
        0
    ].astype(np.int64)
    b = generate_matrix(seed, "B", pair, params.n, params.entry_bound, generator=params.generator)
    # |Σ_k a_k·B_kj| ≤ n·b² < 2^24: no overflow in int64.
    return [int(v) for v in matvecs(b.T, a_row[None, :])[0]]
