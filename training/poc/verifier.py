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
rounds run together as the columns of R.

The work, per product, spreads blocks of rows over the cores (``pool``) and runs on
``kernels`` (AVX-512 where the CPU has it): B·R from B regenerated a few rows at a time,
started before the product is read; one pass over C's rows for their leaf hashes, the
range check and C·R while each row is in cache; then A·(B·R), A regenerated the same way.
Once a product has failed, later ones are only hashed (the root still decides the code).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from training.device import keep_freed_memory
from training.poc import kernels, pool
from training.poc.commit import ArtifactProblem, iter_products, result_hash
from training.poc.generate import generate_matrix, generate_rows
from training.poc.pool import chunks, parallel_map, workers
from training.poc.spec import PocError, PocSpec, parse_seed_material, parse_spec

SECURITY_BITS = 60
# Every partial sum is an integer of magnitude < 2^53, so float64 arithmetic is exact.
_FLOAT64_EXACT_BITS = 53
# R's columns go through the kernels together; ``rounds_for`` never needs more.
MAX_ROUNDS = 8
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
    float64 represents exactly, whatever order the additions run in. For n = 2048, b = 8
    that gives bits = 24 and 3 rounds; for the largest spec (n = 2^14, n²b² = 2^34)
    bits = 18 and 4 rounds.
    """
    bits = _FLOAT64_EXACT_BITS - (spec.n**2 * spec.entry_bound**2).bit_length()
    return max(1, min(bits, SECURITY_BITS))


def rounds_for(spec: PocSpec) -> int:
    """Rounds for a false-acceptance probability ≤ 2^−60."""
    return math.ceil(SECURITY_BITS / freivalds_bits(spec))


def random_vectors(n: int, rounds: int, bits: int) -> npt.NDArray[np.int64]:
    """``rounds`` vectors (as rows) of n entries uniform in [0, 2^bits), from os.urandom."""
    wide = bits > 32  # four bytes an entry where they suffice: os.urandom is most of the cost
    raw = np.frombuffer(os.urandom((8 if wide else 4) * n * rounds), dtype="<u8" if wide else "<u4")
    return (raw.reshape(rounds, n) & ((1 << bits) - 1)).astype(np.int64)


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


# What a task of ``_ProductCheck.run`` hands back: its kind, its seconds, and for a block of
# C its smallest and largest entry.
_Done = tuple[str, float, tuple[int, int] | None]


class _ProductCheck:
    """Freivalds' check of one product, spread over the pool's threads.

    ``start`` queues B·R, a block of B's rows at a time (B regenerated from the seed): it
    needs nothing from the artifact, so it runs while the caller opens the product. ``run``
    then makes one parallel pass: the blocks of C's rows (leaf hashes, range check, C·R),
    then A·(B·R), A regenerated the same way; an A task first waits for B·R. ``mismatch``
    compares A·(B·R) with C·R. ``timings`` adds up each kind of task's thread-seconds
    divided by the number of threads, so the two sum to about the wall time: ``hash`` for
    the pass over C (C·R included: computed while the rows are in cache) and ``freivalds``
    for the rest (regenerating A and B included).
    """

    def __init__(
        self, pair: int, columns: npt.NDArray[np.float64], seed: bytes, params: PocSpec, *, products: bool = True
    ) -> None:
        # products=False: only the pass over C (hashes, range); A·(B·R) is not computed.
        self.pair, self.columns, self.seed, self.params, self.products = pair, columns, seed, params, products
        n, k = params.n, columns.shape[0]
        self.leaves = np.empty((n, 32), dtype=np.uint8)
        self.lo, self.hi = int(np.iinfo(np.int32).max), int(np.iinfo(np.int32).min)
        self.right = np.empty((n, k), dtype=np.float64)  # C·R
        self.br = np.empty((n, k), dtype=np.float64)  # B·R
        self.left = np.empty((n, k), dtype=np.float64)  # A·(B·R)
        self.timings = {"hash": 0.0, "freivalds": 0.0}
        self._threads = min(workers(), n)
        self._b: list[Future[float]] = []

    def _b_task(self, lo: int, hi: int) -> float:
        tick = time.perf_counter()
        self.br[lo:hi] = kernels.source_dot(self.seed, "B", self.pair, self.params, lo, hi, self.columns)
        return time.perf_counter() - tick

    def start(self) -> None:
        """Queue B·R on the pool."""
        if not self.products:
            return
        self._b = [pool.submit(self._b_task, lo, hi) for lo, hi in chunks(self.params.n, workers())]

    def wait(self) -> None:
        """Wait for B·R (``run`` does); raises what a block of it raised."""
        for future in self._b:
            self.timings["freivalds"] += future.result() / self._threads

    def _scan_task(self, c: npt.NDArray[np.int32], lo: int, hi: int) -> _Done:
        tick = time.perf_counter()
        leaves, low, high, products = kernels.scan_rows(self.pair, c[lo:hi], lo, self.columns)
        self.leaves[lo:hi], self.right[lo:hi] = leaves, products  # each task its own rows
        return "hash", time.perf_counter() - tick, (low, high)

    def _a_task(self, c: npt.NDArray[np.int32], lo: int, hi: int) -> _Done:
        for future in self._b:
            future.result()  # B·R first; its blocks were queued before anything of this pass
        tick = time.perf_counter()
        self.left[lo:hi] = kernels.source_dot(self.seed, "A", self.pair, self.params, lo, hi, self.br.T)
        return "freivalds", time.perf_counter() - tick, None

    def run(self, c: npt.NDArray[np.int32]) -> None:
        """After ``start``: the leaf hashes, the range (``lo``, ``hi``), C·R and A·(B·R)."""
        n = self.params.n
        # Twice as many blocks of C as threads: the threads finish together. The portable
        # hashing holds the GIL for each row's digest, so it takes a single block.
        scans = chunks(n, 2 * workers() if kernels.ENABLED else 1)
        tasks: list[tuple[Callable[[npt.NDArray[np.int32], int, int], _Done], tuple[int, int]]] = [
            *((self._scan_task, span) for span in scans),
            *((self._a_task, span) for span in chunks(n, workers()) if self.products),
        ]
        for kind, seconds, extremes in parallel_map(lambda task: task[0](c, *task[1]), tasks):
            self.timings[kind] += seconds / self._threads
            if extremes is not None:  # folded here, on one thread: none is lost to a race
                self.lo, self.hi = min(self.lo, extremes[0]), max(self.hi, extremes[1])
        self.wait()

    def mismatch(self) -> str | None:
        """For an in-range product (exact in float64: ``freivalds_bits``): None when A·(B·R) = C·R."""
        if np.array_equal(self.left, self.right):
            return None
        return f"Product c{self.pair} is not A·B for this task's seed (Freivalds' check failed)."


def _add(total: dict[str, float], part: Mapping[str, float]) -> None:
    for kind, seconds in part.items():
        total[kind] += seconds


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
    number of Freivalds rounds, 1 to 8 (fewer than ``rounds_for(spec)`` weakens the 2^−60
    bound). ``timings`` splits the seconds into hash (the pass over C: leaf hashes, range
    check and C·R) and freivalds (B·R and A·(B·R), regenerating A and B).
    """
    started = time.perf_counter()
    timings: dict[str, float] = {"hash": 0.0, "freivalds": 0.0}
    try:
        params = parse_spec(spec)
        seed = parse_seed_material(seed_material).seed
    except PocError as exc:
        return _fail(
            "spec" if exc.field in ("spec", "n", "count", "entry_bound", "generator") else "seed", str(exc), started
        )
    if rounds is not None and (type(rounds) is not int or not 1 <= rounds <= MAX_ROUNDS):
        raise ValueError(f"rounds must be an integer between 1 and {MAX_ROUNDS}")
    claimed = claimed_result_hash.lower() if isinstance(claimed_result_hash, str) else ""
    if len(claimed) != 64 or any(ch not in "0123456789abcdef" for ch in claimed):
        return _fail("result_hash", "result_hash: must be 64 hexadecimal digits.", started)
    n, count, limit = params.n, params.count, params.max_abs_entry

    needed = rounds_for(params)
    vectors_per_pair = needed if rounds is None else rounds
    bits = freivalds_bits(params)
    leaves: list[kernels.Leaves] = []
    root: str | None = None
    out_of_range: str | None = None
    mismatch: str | None = None
    keep_freed_memory()
    products = iter_products(Path(artifact_path), n, count)
    try:
        for pair in range(count):
            # Drawn before the product is read, which cannot change it any more: the worker
            # signed its result_hash. Exact as float64 (entries < 2^bits ≤ 2^53).
            columns = random_vectors(n, vectors_per_pair, bits).astype(np.float64)
            decided = out_of_range is not None or mismatch is not None
            check = _ProductCheck(pair, columns, seed, params, products=not decided)
            check.start()
            try:
                check.run(next(products))
            except BaseException:
                with contextlib.suppress(Exception):
                    check.wait()  # nothing of this verification may run on after it returns
                raise
            leaves.append(check.leaves)
            _add(timings, check.timings)
            if count == 1 and (root := result_hash(np.concatenate(leaves))) != claimed:
                break  # one product: the root is known now, and it decides (below)
            if out_of_range is None and not (-limit <= check.lo and check.hi <= limit):
                out_of_range = f"product c{pair} has an entry beyond ±{limit}, which no product of these matrices has."
            if not decided and out_of_range is None:
                mismatch = check.mismatch()
    except ArtifactProblem as exc:
        return _fail(exc.code, str(exc), started, timings)
    finally:
        products.close()
    if (root or result_hash(np.concatenate(leaves))) != claimed:
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
