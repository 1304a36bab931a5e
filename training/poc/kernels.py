"""Row hashing, the Merkle root and Freivalds' products: AVX-512 where it runs, else hashlib/numpy.

The verifier's cost is O(n²), and most of it is SHA-256 over C's rows. ``_simd.c`` hashes
sixteen rows at once in the AVX-512 registers, folds the range check and C·r into the same
pass while the rows are in cache, and computes V·r for the generator's bytes without
materialising V. ``pip install -e .`` (``make install``) builds it; where it is missing,
the CPU lacks AVX-512, or ``PROOFWORK_POC_SIMD=0`` is set, every function here computes the
same result with hashlib and numpy (the tests run both on the same inputs).

Every function takes a block of rows and runs on the calling thread; callers spread blocks
over ``pool.parallel_map`` (the kernels release the GIL).

Exactness of the products: entries of C are int32, entries of V integers of magnitude at
most ``bound``, and columns hold integers; products are summed in float64, so they are
exact while every partial sum stays below 2^53 in magnitude (``verifier.freivalds_bits``
picks the columns' range for that).
"""

from __future__ import annotations

import hashlib
import importlib
import os
import struct
from typing import Any

import numpy as np
import numpy.typing as npt

from protocol import merkle
from training.poc.generate import Matrix, aes_key, entry_source
from training.poc.spec import PocSpec

_simd: Any
try:
    _simd = importlib.import_module("training.poc._simd")
except ImportError:  # not built: the portable path below
    _simd = None

Leaves = npt.NDArray[np.uint8]


def _enabled(check: str) -> bool:
    if os.environ.get("PROOFWORK_POC_SIMD", "1").strip() == "0":
        return False
    return _simd is not None and bool(getattr(_simd, check)())


# Whether the AVX-512 kernels run here, and whether the CPU also makes the aes256ctr
# keystream itself (VAES). Read once; tests switch them to compare the paths.
ENABLED = _enabled("available")
AES_ENABLED = ENABLED and _enabled("aes_available")


def _index(name: str, value: int, rows: int) -> None:
    # Leaf data holds both as u32le; the kernel would silently wrap a larger one.
    if value < 0 or value + rows > 2**32:
        raise ValueError(f"{name} must be a non-negative 32-bit index, got {value}")


def _rows(c: npt.NDArray[Any], dtype: str) -> npt.NDArray[Any]:
    if c.ndim != 2:
        raise ValueError(f"expected a 2-D block of rows, got shape {c.shape}")
    return np.ascontiguousarray(c, dtype=dtype)


def leaf_hashes(pair: int, c: npt.NDArray[np.integer[Any]], first_row: int = 0) -> Leaves:
    """RFC 6962 leaf hashes of the rows of ``c`` (rows × 32 bytes), row i being ``first_row + i``.

    Leaf data: u32le(pair) ‖ u32le(row) ‖ the row as little-endian int32 (``commit``).
    """
    values = _rows(c, "<i4")
    rows, n = values.shape
    _index("pair", pair, 1)
    _index("first_row", first_row, rows)
    out = np.empty((rows, 32), dtype=np.uint8)
    if rows == 0:
        return out
    if ENABLED:
        _simd.leaf_hashes(values, n, pair, first_row, out)
        return out
    for i in range(rows):
        h = hashlib.sha256(merkle.LEAF_PREFIX + struct.pack("<II", pair, first_row + i))
        h.update(values[i])  # no copy of the row's bytes
        out[i] = np.frombuffer(h.digest(), dtype=np.uint8)
    return out


def merkle_root(leaves: Leaves) -> bytes:
    """The RFC 6962 root over ``leaves`` (m × 32 bytes, in leaf order)."""
    if leaves.ndim != 2 or leaves.shape[1] != 32:
        raise ValueError(f"expected m × 32 leaf hashes, got shape {leaves.shape}")
    if leaves.shape[0] == 0:
        return merkle.EMPTY_ROOT
    if ENABLED:
        root: bytes = _simd.merkle_root(np.ascontiguousarray(leaves))
        return root
    return merkle.root_from_leaf_hashes([row.tobytes() for row in leaves])


def _columns(columns: npt.NDArray[np.float64], n: int) -> npt.NDArray[np.float64]:
    if columns.ndim != 2 or columns.shape[1] != n or not 1 <= columns.shape[0] <= 8:
        raise ValueError(f"expected 1 to 8 columns of length {n}, got shape {columns.shape}")
    return np.ascontiguousarray(columns, dtype=np.float64)


def scan_rows(
    pair: int, c: npt.NDArray[np.int32], first_row: int, columns: npt.NDArray[np.float64]
) -> tuple[Leaves, int, int, npt.NDArray[np.float64]]:
    """One pass over a block of C's rows: (leaf hashes, smallest entry, largest entry, C·R).

    ``columns`` holds R's k columns as rows (k × n). The products are exact only when the
    entries are in the range the caller allowed for (check the returned min and max first).
    """
    values = _rows(c, "<i4")
    rows, n = values.shape
    _index("pair", pair, 1)
    _index("first_row", first_row, rows)
    cols = _columns(columns, n)
    k = cols.shape[0]
    if rows == 0:
        return np.empty((0, 32), dtype=np.uint8), 0, 0, np.empty((0, k))
    if ENABLED:
        leaves = np.empty((rows, 32), dtype=np.uint8)
        products = np.empty((rows, k), dtype=np.float64)
        lo, hi = _simd.check_rows(values, n, pair, first_row, cols, k, leaves, products)
        return leaves, int(lo), int(hi), products
    leaves = leaf_hashes(pair, values, first_row)
    return leaves, int(values.min()), int(values.max()), _exact_products(values, cols)


def rows_dot(x: npt.NDArray[Any], m: int, bound: int, columns: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """V·R for a block of generator rows (``generate.entry_source``): rows × k.

    With m > 0, ``x`` is the keystream and V's entries are ``((x · m) >> 8) − bound``;
    with m = 0, ``x`` holds V's entries as int8.
    """
    raw = _rows(x, "u1" if m else "i1")
    rows, n = raw.shape
    cols = _columns(columns, n)
    if ENABLED:
        out = np.empty((rows, cols.shape[0]), dtype=np.float64)
        _simd.rows_dot(raw, n, m, bound, cols, cols.shape[0], out)
        return out
    if m:
        values = ((raw.astype(np.int32) * m) >> 8) - bound
        return _exact_products(values, cols)
    return _exact_products(raw, cols)


def source_dot(
    seed: bytes,
    matrix: Matrix,
    pair: int,
    params: PocSpec,
    start: int,
    stop: int,
    columns: npt.NDArray[np.float64],
) -> npt.NDArray[np.float64]:
    """V·R for rows ``start:stop`` of matrix ``matrix`` of pair ``pair``, regenerated from the seed.

    With VAES the kernel makes the aes256ctr keystream itself, a few rows at a time, and
    never stores it; otherwise ``generate.entry_source`` makes the rows and ``rows_dot``
    multiplies them.
    """
    n, bound = params.n, params.entry_bound
    cols = _columns(columns, n)
    if AES_ENABLED and params.generator == "aes256ctr":
        out = np.empty((stop - start, cols.shape[0]), dtype=np.float64)
        key = aes_key(seed, matrix, pair)
        _simd.aes_rows_dot(key, n, start, stop, 2 * bound + 1, bound, cols, cols.shape[0], out)
        return out
    x, m = entry_source(seed, matrix, pair, n, bound, start, stop, generator=params.generator)
    return rows_dot(x, m, bound, cols)


_BLOCK_ROWS = 256


def _exact_products(matrix: npt.NDArray[Any], columns: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """matrix · columnsᵀ in float64 BLAS, widened a block of rows at a time (bounded memory)."""
    out = np.empty((matrix.shape[0], columns.shape[0]), dtype=np.float64)
    right = columns.T
    for lo in range(0, matrix.shape[0], _BLOCK_ROWS):
        np.matmul(matrix[lo : lo + _BLOCK_ROWS].astype(np.float64), right, out=out[lo : lo + _BLOCK_ROWS])
    return out
