"""The verifier's kernels (training/poc/kernels.py and its AVX-512 extension) against references.

Every reference here is written from the definitions, independently of the code under
test: hashlib for the leaf hashes, protocol.merkle for the root, int64 numpy for the
products and cryptography's AES for the keystream. Each case runs on the AVX-512 kernels
(skipped on a CPU without them) and on the portable path (``kernel_path``).
"""

from __future__ import annotations

import hashlib
import shutil
import struct
import sysconfig
import threading
import time

import numpy as np
import pytest

from protocol import merkle
from training import poc
from training.poc import kernels, pool
from training.poc.generate import Matrix, aes_key, generate_rows

RNG = np.random.default_rng(20261127)
SEED = poc.parse_seed_material(
    {
        "block_hash": "4d" * 32,
        "worker_address": "cpc1qf0ewqq7ut3kq4n6cxw9j0w6d8pd8rz3k2s5jkm",
        "task_id": "8b0f3d7e-2c4a-4f6b-9e1d-5a7c3b2e1f09",
    }
).seed
# Sizes around the kernels' edges: one row, fewer rows than a 16-lane group, a row shorter
# than one SHA-256 block, rows not a multiple of 8 or 16 entries, and a few larger ones.
SIZES = [1, 2, 7, 13, 16, 17, 31, 33, 100, 257]


def _reference_leaf(pair: int, row: int, values: np.ndarray) -> bytes:
    return hashlib.sha256(b"\x00" + struct.pack("<II", pair, row) + values.astype("<i4").tobytes()).digest()


def _columns(n: int, k: int, bits: int = 24) -> np.ndarray:
    return RNG.integers(0, 2**bits, (k, n)).astype(np.float64)


def _exact(matrix: np.ndarray, columns: np.ndarray) -> np.ndarray:
    return (matrix.astype(np.int64) @ columns.T.astype(np.int64)).astype(np.float64)


def test_the_extension_is_built() -> None:
    # make install builds it; a build that failed silently would leave every verification
    # on the portable path, several times slower. The build is optional (no compiler: the
    # portable path), so this holds where there is a C compiler to build it with.
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}): the install skips the extension and the portable path runs")
    import training.poc._simd as simd

    assert isinstance(simd.available(), bool)
    assert isinstance(simd.aes_available(), bool)


@pytest.mark.usefixtures("kernel_path")
@pytest.mark.parametrize("n", SIZES)
def test_leaf_hashes_are_sha256_of_the_leaf_encoding(n: int) -> None:
    c = RNG.integers(-(2**31), 2**31, (n, n), dtype=np.int64).astype(np.int32)
    got = kernels.leaf_hashes(7, c, first_row=1000)
    assert [row.tobytes() for row in got] == [_reference_leaf(7, 1000 + i, c[i]) for i in range(n)]


@pytest.mark.usefixtures("kernel_path")
def test_leaf_hashes_of_a_block_of_rows_name_their_rows() -> None:
    c = RNG.integers(-100, 100, (40, 24), dtype=np.int32)
    whole = kernels.leaf_hashes(0, c)
    assert np.array_equal(kernels.leaf_hashes(0, c[17:33], first_row=17), whole[17:33])
    assert kernels.leaf_hashes(0, c[:0]).shape == (0, 32)


@pytest.mark.usefixtures("kernel_path")
@pytest.mark.parametrize("count", [*range(1, 36), 255, 256, 257, 1000, 1024, 1025, 4097])
def test_merkle_root_is_rfc_6962(count: int) -> None:
    leaves = [hashlib.sha256(count.to_bytes(4, "little") + i.to_bytes(4, "little")).digest() for i in range(count)]
    array = np.frombuffer(b"".join(leaves), dtype=np.uint8).reshape(count, 32)
    assert kernels.merkle_root(array) == merkle.root_from_leaf_hashes(leaves)


@pytest.mark.usefixtures("kernel_path")
def test_merkle_root_of_no_leaves_is_the_empty_tree() -> None:
    assert kernels.merkle_root(np.empty((0, 32), dtype=np.uint8)) == merkle.EMPTY_ROOT


@pytest.mark.usefixtures("kernel_path")
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("k", [1, 3, 4, 8])
def test_scan_rows_hashes_ranges_and_multiplies_exactly(n: int, k: int) -> None:
    # Entries up to 2^17 and columns up to 2^24: n·2^41 stays below 2^53 (exact in float64).
    c = RNG.integers(-(2**17), 2**17, (n, n), dtype=np.int32)
    columns = _columns(n, k)
    leaves, lo, hi, products = kernels.scan_rows(3, c, 5, columns)
    assert [row.tobytes() for row in leaves] == [_reference_leaf(3, 5 + i, c[i]) for i in range(n)]
    assert (lo, hi) == (int(c.min()), int(c.max()))
    assert np.array_equal(products, _exact(c, columns))


@pytest.mark.usefixtures("kernel_path")
def test_scan_rows_finds_the_extremes_of_int32() -> None:
    c = np.zeros((19, 21), dtype=np.int32)
    c[18, 20], c[3, 0] = -(2**31), 2**31 - 1  # the last entry of the last row, past any full vector
    _, lo, hi, _ = kernels.scan_rows(0, c, 0, _columns(21, 2))
    assert (lo, hi) == (-(2**31), 2**31 - 1)


@pytest.mark.usefixtures("kernel_path")
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize(("m", "bound"), [(17, 8), (3, 1), (11, 5), (0, 0)])
def test_rows_dot_maps_generator_bytes_and_multiplies_exactly(n: int, m: int, bound: int) -> None:
    raw = RNG.integers(0, 256, (n, n), dtype=np.uint8)
    columns = _columns(n, 3)
    values = ((raw.astype(np.int64) * m) >> 8) - bound if m else raw.view(np.int8)
    assert np.array_equal(kernels.rows_dot(raw if m else raw.view(np.int8), m, bound, columns), _exact(values, columns))


@pytest.mark.usefixtures("kernel_path")
@pytest.mark.parametrize("generator", ["aes256ctr", "shake128"])
@pytest.mark.parametrize(
    ("n", "start", "stop"),
    # Rows whose keystream starts mid AES block (n = 13, 100), blocks of 4 rows and less,
    # a last partial block, and an empty range.
    [(1, 0, 1), (13, 0, 13), (13, 5, 12), (16, 3, 16), (100, 1, 99), (257, 250, 257), (64, 9, 9)],
)
def test_source_dot_regenerates_the_matrix(generator: poc.Generator, n: int, start: int, stop: int) -> None:
    params = poc.parse_spec({"n": n, "entry_bound": 8, "generator": generator})
    columns = _columns(n, 3)
    pairs: tuple[tuple[Matrix, int], ...] = (("A", 0), ("B", 5))
    for matrix, pair in pairs:
        rows = generate_rows(SEED, matrix, pair, n, 8, start, stop, generator=generator)
        got = kernels.source_dot(SEED, matrix, pair, params, start, stop, columns)
        assert np.array_equal(got, _exact(rows, columns)), (matrix, pair)


def test_the_two_paths_agree_on_a_full_size_product(monkeypatch: pytest.MonkeyPatch) -> None:
    if not kernels.ENABLED:
        pytest.skip("this CPU has no AVX-512: nothing to compare the portable path with")
    n = 512
    params = poc.parse_spec({"n": n, "generator": "aes256ctr"})
    c = RNG.integers(-(2**17), 2**17, (n, n), dtype=np.int32)
    columns = _columns(n, 3)
    fast = kernels.scan_rows(1, c, 0, columns), kernels.source_dot(SEED, "A", 1, params, 0, n, columns)
    monkeypatch.setattr(kernels, "ENABLED", False)
    monkeypatch.setattr(kernels, "AES_ENABLED", False)
    slow = kernels.scan_rows(1, c, 0, columns), kernels.source_dot(SEED, "A", 1, params, 0, n, columns)
    assert np.array_equal(fast[0][0], slow[0][0])
    assert fast[0][1:3] == slow[0][1:3]
    assert np.array_equal(fast[0][3], slow[0][3])
    assert np.array_equal(fast[1], slow[1])


def test_the_extension_checks_its_buffers() -> None:
    if not kernels.ENABLED:
        pytest.skip("this CPU has no AVX-512")
    import training.poc._simd as simd

    c = np.zeros((4, 8), dtype=np.int32)
    with pytest.raises(ValueError, match="out holds 96 bytes, expected 128"):
        simd.leaf_hashes(c, 8, 0, 0, np.zeros((3, 32), dtype=np.uint8))
    with pytest.raises(ValueError, match="whole number of rows"):
        simd.leaf_hashes(c, 7, 0, 0, np.zeros((4, 32), dtype=np.uint8))
    with pytest.raises(ValueError, match="first_row must be a non-negative 32-bit index"):
        kernels.leaf_hashes(0, c, first_row=2**32 - 3)
    with pytest.raises(ValueError, match="pair must be"):
        kernels.scan_rows(-1, c, 0, np.zeros((1, 8)))
    with pytest.raises(ValueError, match=r"k in 0\.\.8"):
        simd.rows_dot(np.zeros((2, 8), np.uint8), 8, 17, 8, np.zeros((9, 8)), 9, np.zeros((2, 9)))
    with pytest.raises(ValueError, match="leaves must be one or more"):
        simd.merkle_root(b"")
    with pytest.raises(ValueError, match="columns of length 8"):
        kernels.scan_rows(0, c, 0, np.zeros((3, 9)))
    if kernels.AES_ENABLED:
        with pytest.raises(ValueError, match="key holds 31 bytes"):
            simd.aes_rows_dot(b"k" * 31, 8, 0, 8, 17, 8, np.zeros((1, 8)), 1, np.zeros((8, 1)))
        with pytest.raises(ValueError, match="start:stop"):
            simd.aes_rows_dot(aes_key(SEED, "A", 0), 8, 4, 9, 17, 8, np.zeros((1, 8)), 1, np.zeros((5, 1)))


# --- the thread pool the kernels run on ------------------------------------------


def test_parallel_map_keeps_the_order_and_uses_the_calling_thread() -> None:
    seen: set[str] = set()

    def work(i: int) -> int:
        seen.add(threading.current_thread().name)
        time.sleep(0.002)
        return i * i

    assert pool.parallel_map(work, list(range(20))) == [i * i for i in range(20)]
    if pool.workers() > 1:
        assert threading.current_thread().name in seen
        assert any(name.startswith("poc") for name in seen)


def test_parallel_map_raises_an_items_error_after_every_thread_stopped() -> None:
    started: list[int] = []
    running = threading.Lock()

    def work(i: int) -> int:
        with running:
            started.append(i)
        if i == 3:
            raise ZeroDivisionError("item 3")
        time.sleep(0.005)
        return i

    with pytest.raises(ZeroDivisionError, match="item 3"):
        pool.parallel_map(work, list(range(40)))
    count = len(started)
    time.sleep(0.05)
    assert len(started) == count < 40  # nothing still running, and the rest never started


def test_work_queued_from_a_pool_thread_runs_in_that_thread() -> None:
    # A pool thread waiting on tasks queued behind it would wait for ever: nested calls
    # made on a pool thread run inline (the calling thread may hand them out).
    def outer(i: int) -> tuple[str, list[str]]:
        time.sleep(0.002)
        inner = pool.parallel_map(lambda _: threading.current_thread().name, [0, 1, 2])
        done = pool.submit(lambda: threading.current_thread().name).result(timeout=5)
        return threading.current_thread().name, [*inner, done]

    results = pool.parallel_map(outer, list(range(8)))
    on_pool = [(name, names) for name, names in results if name.startswith("poc")]
    assert on_pool or pool.workers() == 1
    for name, names in on_pool:
        assert set(names) == {name}
