"""A and B from the seed. Two generators, named by the spec's ``generator`` field.

``aes256ctr`` (new tasks; the marketplace writes it into their spec). Matrix ``M`` ("A"
or "B") of pair ``p`` is the keystream of AES-256 in counter mode under the key

    key = SHA-256(DOMAIN_AES ‖ seed ‖ M ‖ u32le(p))

with the 128-bit big-endian counter starting at zero. Byte ``i·n + j`` of the keystream,
x, gives entry (i, j) as ((x · m) >> 8) − entry_bound, with m = 2·entry_bound + 1: one
byte per entry, so row ``i`` starts at a known offset and any row can be regenerated in
O(n) by starting the counter at that offset's block. The map from bytes to values is
close to uniform, not exactly so (for m = 17 one value takes 16 of the 256 bytes and the
others 15); proof of compute needs matrices nobody can know before the seed is fixed,
and bias this small gives no shortcut through the product. AES runs on the CPU's AES
instructions through ``cryptography`` (OpenSSL), several GB/s on one core, so
generating A and B costs about a millisecond per 2048² matrix: next to the O(n²)
verification, not just the O(n³) product.

``shake128`` (tasks posted before ``aes256ctr`` existed, and any spec without the
field). Row ``i`` of matrix ``M`` of pair ``p`` is read from the stream

    SHAKE128(DOMAIN ‖ seed ‖ M ‖ u32le(p) ‖ u32le(i))

byte by byte: with m = 2·entry_bound + 1 values to draw from, a byte x is accepted when
x < 256 − (256 mod m) (a multiple of m, so x mod m is exactly uniform) and becomes
(x mod m) − entry_bound; rejected bytes are skipped. The row is the first n accepted
values. SHAKE128 runs at about 0.6 GB/s on one core, and the rejection step costs a few
more passes, which made generation the largest part of verifying a result.

Both are standard primitives (FIPS 197, FIPS 202) fed fixed-layout inputs, so the bytes
are the same on every platform and library version.
"""

from __future__ import annotations

import functools
import hashlib
import math
import struct
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from training import stop as stop_signal
from training.poc.pool import parallel_map
from training.poc.spec import GENERATORS, Generator

DOMAIN = b"proofwork/poc/v1/matrix"
DOMAIN_AES = b"proofwork/poc/v2/matrix-aes256ctr"
Matrix = Literal["A", "B"]
_AES_BLOCK = 16
# Rows per chunk are chosen so that one chunk of raw bytes stays around 1 MiB: small
# enough to spread over threads, large enough that per-chunk overhead is noise.
_CHUNK_BYTES = 1024 * 1024


def _margin(n: int, m: int) -> int:
    """Spare stream bytes per row: the expected rejections plus six standard deviations.

    A byte is rejected with probability q = (256 mod m)/256, so n accepted bytes need
    about n·q/(1−q) more; a row that still comes up short is simply read further (see
    ``_long_row``), so the margin only trades wasted SHAKE output against rare re-reads.
    """
    q = (256 % m) / 256
    expected = n * q / (1 - q)
    return math.ceil(expected + 6 * math.sqrt(expected)) + 16


def _stream_prefix(seed: bytes, matrix: Matrix, pair: int) -> Any:
    if matrix not in ("A", "B"):
        raise ValueError(f"matrix must be 'A' or 'B', got {matrix!r}")
    h = hashlib.shake_128(DOMAIN)
    h.update(seed)
    h.update(matrix.encode("ascii"))
    h.update(struct.pack("<I", pair))
    return h


def _row_bytes(prefix: Any, row: int, length: int) -> bytes:
    h = prefix.copy()
    h.update(struct.pack("<I", row))
    return bytes(h.digest(length))


@functools.cache
def _divider(m: int) -> tuple[int, int, type[np.unsignedinteger[Any]]]:
    """(c, s, dtype) with (x·c) >> s == x // m for every byte x, evaluated in ``dtype``.

    uint16 when c·255 fits in it (m = 17, the default bound's, among others): half the
    memory traffic of uint32, and numpy has no vectorised uint8 division to beat it.
    """
    xs = np.arange(256, dtype=np.uint32)
    for dtype, limit in ((np.uint16, 1 << 16), (np.uint32, 1 << 32)):
        for shift in range(8, 25):
            c = -(-(1 << shift) // m)
            if c * 255 < limit and np.array_equal((xs * c) >> shift, xs // m):
                return c, shift, dtype
    raise AssertionError(f"no multiply-shift divider for {m}")


def _accept(raw: npt.NDArray[np.uint8], n: int, bound: int) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.bool_]]:
    """Map a (rows, L) block of stream bytes to each row's first n accepted values.

    Returns the values and a mask of rows with fewer than n accepted bytes in L (their
    values are left unset; the caller reads those rows again with a longer stream).
    """
    rows = raw.shape[0]
    m = 2 * bound + 1
    accepted = raw < 256 - 256 % m
    # Compacting the accepted bytes of all rows at once, then slicing each row's first n,
    # costs two vectorised passes and one slice per row.
    flat = raw[accepted]
    counts = np.count_nonzero(accepted, axis=1)
    short = counts < n
    starts = (np.cumsum(counts) - counts).tolist()
    picked = np.zeros((rows, n), dtype=np.uint8)
    for i in np.flatnonzero(~short).tolist():
        picked[i] = flat[starts[i] : starts[i] + n]
    c, shift, wide = _divider(m)
    # x·c fits in ``wide`` for every byte x (checked by _divider), so it never wraps.
    quotient = picked.astype(wide)
    quotient *= wide(c)
    quotient >>= wide(shift)
    remainder = picked - quotient.astype(np.uint8) * np.uint8(m)
    values = remainder.view(np.int8)
    values -= np.int8(bound)
    return values, short


def generate_rows(
    seed: bytes,
    matrix: Matrix,
    pair: int,
    n: int,
    bound: int,
    start: int,
    stop: int,
    *,
    generator: Generator,
    margin: int | None = None,
) -> npt.NDArray[np.int8]:
    """Rows ``start:stop`` of matrix ``matrix`` of pair ``pair`` as int8 (see module docstring).

    ``margin`` (spare SHAKE bytes per row, ``shake128`` only) changes speed, never values.
    """
    if not 0 <= start <= stop <= n:
        raise ValueError(f"rows {start}:{stop} are outside an {n}×{n} matrix")
    if not 1 <= bound <= 127:
        raise ValueError("entry_bound must be between 1 and 127 to fit int8")
    if generator == "aes256ctr":
        return _aes_rows(seed, matrix, pair, n, bound, start, stop)
    if generator != "shake128":
        raise ValueError(f"generator must be one of {', '.join(GENERATORS)}, got {generator!r}")
    return _shake_rows(seed, matrix, pair, n, bound, start, stop, margin)


def aes_key(seed: bytes, matrix: Matrix, pair: int) -> bytes:
    """The AES-256 key of matrix ``matrix`` of pair ``pair`` (module docstring)."""
    if matrix not in ("A", "B"):
        raise ValueError(f"matrix must be 'A' or 'B', got {matrix!r}")
    return hashlib.sha256(DOMAIN_AES + seed + matrix.encode("ascii") + struct.pack("<I", pair)).digest()


def aes_stream(seed: bytes, matrix: Matrix, pair: int, n: int, start: int, stop: int) -> npt.NDArray[np.uint8]:
    """The keystream bytes behind rows ``start:stop`` of an ``aes256ctr`` matrix, one per entry.

    Entry (i, j) is ``((x · m) >> 8) − entry_bound`` of byte x = stream[i − start, j], with
    m = 2·entry_bound + 1. One call runs on the calling thread (``generate_rows`` spreads chunks over threads).
    """
    block, skip = divmod(start * n, _AES_BLOCK)
    encryptor = Cipher(
        algorithms.AES(aes_key(seed, matrix, pair)), modes.CTR(block.to_bytes(_AES_BLOCK, "big"))
    ).encryptor()
    stream = encryptor.update(bytes(skip + (stop - start) * n))
    return np.frombuffer(stream, dtype=np.uint8, offset=skip).reshape(stop - start, n)


def entry_source(
    seed: bytes, matrix: Matrix, pair: int, n: int, bound: int, start: int, stop: int, *, generator: Generator
) -> tuple[npt.NDArray[np.uint8] | npt.NDArray[np.int8], int]:
    """Rows ``start:stop`` as the verifier's kernels take them: (x, m).

    ``aes256ctr``: the raw keystream and m = 2·bound + 1, for the kernel to map each byte to
    ``((x · m) >> 8) − bound`` as it reads it. ``shake128``: the entries themselves as int8
    and m = 0.
    """
    if generator == "aes256ctr":
        return aes_stream(seed, matrix, pair, n, start, stop), 2 * bound + 1
    return _shake_rows(seed, matrix, pair, n, bound, start, stop, None), 0


def _aes_rows(
    seed: bytes, matrix: Matrix, pair: int, n: int, bound: int, start: int, stop: int
) -> npt.NDArray[np.int8]:
    m = 2 * bound + 1
    out = np.empty((stop - start, n), dtype=np.int8)
    chunk = max(1, _CHUNK_BYTES // n)

    def fill(lo: int) -> None:
        stop_signal.check()  # a job told to stop ends within one chunk
        hi = min(stop, lo + chunk)
        # (x·m) >> 8 < m ≤ 255 for every byte x, and x·m < 2^16, so uint16 never wraps.
        wide = aes_stream(seed, matrix, pair, n, lo, hi).astype(np.uint16)
        wide *= np.uint16(m)
        wide >>= np.uint16(8)
        values = wide.astype(np.uint8).view(np.int8)
        values -= np.int8(bound)
        out[lo - start : hi - start] = values

    # Chunks write disjoint rows, so the thread schedule cannot change the result.
    parallel_map(fill, range(start, stop, chunk))
    return out


def _shake_rows(
    seed: bytes,
    matrix: Matrix,
    pair: int,
    n: int,
    bound: int,
    start: int,
    stop: int,
    margin: int | None,
) -> npt.NDArray[np.int8]:
    prefix = _stream_prefix(seed, matrix, pair)
    extra = _margin(n, 2 * bound + 1) if margin is None else margin
    out = np.empty((stop - start, n), dtype=np.int8)
    chunk = max(1, _CHUNK_BYTES // (n + extra))

    def fill(lo: int) -> None:
        stop_signal.check()  # a job told to stop ends within one chunk
        hi = min(stop, lo + chunk)
        raw = np.frombuffer(b"".join(_row_bytes(prefix, i, n + extra) for i in range(lo, hi)), dtype=np.uint8)
        values, short = _accept(raw.reshape(hi - lo, n + extra), n, bound)
        out[lo - start : hi - start] = values
        for offset in np.flatnonzero(short).tolist():
            out[lo - start + offset] = _long_row(prefix, lo + offset, n, bound, 2 * (n + extra))

    # Chunks write disjoint rows, so the thread schedule cannot change the result.
    parallel_map(fill, range(start, stop, chunk))
    return out


def _long_row(prefix: Any, row: int, n: int, bound: int, length: int) -> npt.NDArray[np.int8]:
    # SHAKE output is prefix-consistent, so reading further yields the same leading bytes.
    while True:
        raw = np.frombuffer(_row_bytes(prefix, row, length), dtype=np.uint8).reshape(1, length)
        values, short = _accept(raw, n, bound)
        if not short[0]:
            return values[0]
        length *= 2


def generate_matrix(
    seed: bytes, matrix: Matrix, pair: int, n: int, bound: int, *, generator: Generator
) -> npt.NDArray[np.int8]:
    """The whole n×n matrix ``matrix`` of pair ``pair`` as int8."""
    return generate_rows(seed, matrix, pair, n, bound, 0, n, generator=generator)
