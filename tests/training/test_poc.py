"""The synthetic proof-of-compute kind through its public surface: run, verify, row proofs.

Sizes stay tiny (n ≤ 256) because these run on shared CPU cores; the CUDA case runs only
where a GPU is present.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import struct
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from safetensors.numpy import load_file, save_file

from protocol import merkle
from training import poc
from training.poc import runner
from training.poc.commit import ArtifactWriter, row_leaf_hashes
from training.poc.generate import DOMAIN, DOMAIN_AES
from training.poc.verifier import random_vectors

ROOT = Path(__file__).resolve().parents[2]
SEED = {
    "block_hash": "5e" * 32,
    "worker_address": "cpc1qf0ewqq7ut3kq4n6cxw9j0w6d8pd8rz3k2s5jkm",
    "task_id": "3f2b8c1e-6a4d-4e0b-9c57-2d1f0a9b8e71",
}
SPEC = {"n": 64, "count": 2, "entry_bound": 8, "generator": "aes256ctr"}
# sha256 of A (pair 0, n = 64, bound 8) for SEED under each generator;
# test_generator_follows_its_documented_definition checks both against their definitions.
PINNED_A = "469d6c1d49f0ae353c30ce5e17ae3737422c86a85367e5d64649555301ef7ec5"
PINNED_A_AES = "725d2b4b091ca6081723e19d100522e0127a06529a5d5094e6462a21c16635fa"


@pytest.fixture(scope="module")
def honest(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out_dir = tmp_path_factory.mktemp("honest")
    events: list[dict[str, Any]] = []
    out = poc.run(SPEC, SEED, out_dir, device="cpu", progress=events.append)
    return {"out": out, "path": out_dir / out["artifact"], "events": events}


def _products(path: Path) -> list[np.ndarray]:
    tensors = load_file(str(path))
    return [tensors[f"c{p}"] for p in range(len(tensors))]


def _write(path: Path, products: list[np.ndarray]) -> str:
    """Write ``products`` as a well-formed artifact and return their honest root."""
    n = products[0].shape[0]
    leaves: list[bytes] = []
    with ArtifactWriter(path, n, len(products), {}) as writer:
        for p, c in enumerate(products):
            writer.write(c)
            leaves.extend(row_leaf_hashes(p, c))
    return merkle.root_from_leaf_hashes(leaves).hex()


def _seed(**change: str) -> dict[str, str]:
    return {**SEED, **change}


# --- the honest path ---------------------------------------------------------------


@pytest.mark.usefixtures("kernel_path")
def test_honest_result_passes(honest: dict[str, Any]) -> None:
    result = poc.verify(SPEC, SEED, honest["path"], honest["out"]["result_hash"])
    assert result.ok, result.reason
    assert result.code == "ok"
    assert "Freivalds' check passed" in result.reason
    assert result.seconds > 0


def test_run_reports_each_pair_and_its_figures(honest: dict[str, Any]) -> None:
    out = honest["out"]
    assert [(e["step"], e["total"]) for e in honest["events"]] == [(1, 2), (2, 2)]
    assert all(e["metrics"]["gflops"] > 0 for e in honest["events"])
    assert out["artifact"] == "product.safetensors"
    assert honest["path"].is_file()
    assert len(out["result_hash"]) == 64
    assert int(out["result_hash"], 16) >= 0
    assert out["gflops"] > 0
    assert 0 < out["matmul_seconds"] <= out["seconds"]
    assert (out["device"], out["n"], out["count"]) == ("cpu", 64, 2)


def test_product_is_exact_and_committed_row_by_row(tmp_path: Path) -> None:
    spec = {"n": 256, "count": 1, "entry_bound": 8, "generator": "aes256ctr"}
    out = poc.run(spec, SEED, tmp_path)
    (c,) = _products(tmp_path / out["artifact"])
    seed = poc.parse_seed_material(SEED).seed
    a = poc.generate_matrix(seed, "A", 0, 256, 8, generator="aes256ctr").astype(np.int64)
    b = poc.generate_matrix(seed, "B", 0, 256, 8, generator="aes256ctr").astype(np.int64)
    assert c.dtype == np.int32
    assert c.shape == (256, 256)
    np.testing.assert_array_equal(c, a @ b)
    # Leaf i = u32le(pair) ‖ u32le(row) ‖ row as int32le, RFC 6962 over all rows.
    leaves = [merkle.leaf_hash(struct.pack("<II", 0, i) + c[i].astype("<i4").tobytes()) for i in range(256)]
    assert out["result_hash"] == merkle.root_from_leaf_hashes(leaves).hex()


def test_same_seed_same_result_on_a_second_run(honest: dict[str, Any], tmp_path: Path) -> None:
    again = poc.run(SPEC, SEED, tmp_path)
    assert again["result_hash"] == honest["out"]["result_hash"]
    assert (tmp_path / again["artifact"]).read_bytes() == honest["path"].read_bytes()


def test_run_restores_a_reduced_matmul_precision(honest: dict[str, Any], tmp_path: Path) -> None:
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        out = poc.run(SPEC, SEED, tmp_path)
        assert torch.get_float32_matmul_precision() == "medium"
    finally:
        torch.set_float32_matmul_precision(before)
    assert out["result_hash"] == honest["out"]["result_hash"]


def test_an_inexact_device_is_caught_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A device that silently loses precision cannot be produced on demand: fake its product.
    real = torch.matmul

    def lossy(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        c = real(a, b)
        if c.shape[0] == SPEC["n"]:
            c[3, 5] += 1
        return c

    monkeypatch.setattr(runner.torch, "matmul", lossy)
    with pytest.raises(poc.InexactProductError, match="not exact"):
        poc.run(SPEC, SEED, tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_product_is_bit_identical_to_cpu(honest: dict[str, Any], tmp_path: Path) -> None:
    out = poc.run(SPEC, SEED, tmp_path, device="cuda")
    assert out["device"].startswith("cuda")
    assert out["result_hash"] == honest["out"]["result_hash"]
    assert (tmp_path / out["artifact"]).read_bytes() == honest["path"].read_bytes()


def test_asking_for_cuda_without_it_is_a_clear_error(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(ValueError, match="CUDA is not available"):
        poc.run(SPEC, SEED, tmp_path, device="cuda")


# --- soundness: every way to cheat fails with its own reason -----------------------


@pytest.mark.usefixtures("kernel_path")
def test_changed_entry_fails_the_root_or_freivalds(honest: dict[str, Any], tmp_path: Path) -> None:
    products = _products(honest["path"])
    products[1][10, 20] += 1
    root = _write(tmp_path / "p.safetensors", products)
    same_claim = poc.verify(SPEC, SEED, tmp_path / "p.safetensors", honest["out"]["result_hash"])
    assert (same_claim.ok, same_claim.code) == (False, "root_mismatch")
    consistent_claim = poc.verify(SPEC, SEED, tmp_path / "p.safetensors", root)
    assert (consistent_claim.ok, consistent_claim.code) == (False, "product_mismatch")
    assert "c1" in consistent_claim.reason


@pytest.mark.usefixtures("kernel_path")
def test_a_failed_first_product_decides_and_the_rest_still_count_for_the_root(
    honest: dict[str, Any], tmp_path: Path
) -> None:
    products = _products(honest["path"])
    products[0][5, 6] += 1
    root = _write(tmp_path / "p.safetensors", products)
    result = poc.verify(SPEC, SEED, tmp_path / "p.safetensors", root)
    assert (result.ok, result.code) == (False, "product_mismatch")
    assert "c0" in result.reason
    products[1][7, 8] += 1  # after the verdict: only hashed, and a claim without it fails
    _write(tmp_path / "q.safetensors", products)
    assert poc.verify(SPEC, SEED, tmp_path / "q.safetensors", root).code == "root_mismatch"


@pytest.mark.usefixtures("kernel_path")
def test_swapped_rows_fail(honest: dict[str, Any], tmp_path: Path) -> None:
    products = _products(honest["path"])
    products[0][[3, 4]] = products[0][[4, 3]]
    root = _write(tmp_path / "p.safetensors", products)
    assert poc.verify(SPEC, SEED, tmp_path / "p.safetensors", honest["out"]["result_hash"]).code == "root_mismatch"
    result = poc.verify(SPEC, SEED, tmp_path / "p.safetensors", root)
    assert (result.ok, result.code) == (False, "product_mismatch")


@pytest.mark.usefixtures("kernel_path")
def test_swapped_products_fail(honest: dict[str, Any], tmp_path: Path) -> None:
    c0, c1 = _products(honest["path"])
    root = _write(tmp_path / "p.safetensors", [c1, c0])
    assert poc.verify(SPEC, SEED, tmp_path / "p.safetensors", root).code == "product_mismatch"


@pytest.mark.usefixtures("kernel_path")
@pytest.mark.parametrize(
    "change",
    [
        {"block_hash": "5f" + "5e" * 31},
        {"worker_address": "cpc1qf0ewqq7ut3kq4n6cxw9j0w6d8pd8rz3k2s5jkn"},
        {"task_id": "3f2b8c1e-6a4d-4e0b-9c57-2d1f0a9b8e72"},
    ],
    ids=["block_hash", "worker_address", "task_id"],
)
def test_result_for_another_seed_fails(honest: dict[str, Any], change: dict[str, str]) -> None:
    result = poc.verify(SPEC, _seed(**change), honest["path"], honest["out"]["result_hash"])
    assert (result.ok, result.code) == (False, "product_mismatch")


@pytest.mark.usefixtures("kernel_path")
def test_forged_root_of_another_product_fails(honest: dict[str, Any], tmp_path: Path) -> None:
    other = poc.run(SPEC, _seed(task_id=str(uuid.UUID(int=7))), tmp_path)
    result = poc.verify(SPEC, SEED, honest["path"], other["result_hash"])
    assert (result.ok, result.code) == (False, "root_mismatch")
    assert "claimed result_hash" in result.reason


@pytest.mark.usefixtures("kernel_path")
def test_entries_beyond_the_honest_range_are_refused(honest: dict[str, Any], tmp_path: Path) -> None:
    products = _products(honest["path"])
    products[0][0, 0] = 2**31 - 1
    root = _write(tmp_path / "p.safetensors", products)
    result = poc.verify(SPEC, SEED, tmp_path / "p.safetensors", root)
    assert (result.ok, result.code) == (False, "out_of_range")
    assert "±4096" in result.reason


@pytest.mark.usefixtures("kernel_path")
@pytest.mark.parametrize(("pair", "row", "col", "value"), [(0, 63, 63, -4097), (1, 33, 0, 4097), (1, 17, 5, -(2**31))])
def test_an_entry_beyond_the_range_is_found_in_any_block_of_rows(
    honest: dict[str, Any], tmp_path: Path, pair: int, row: int, col: int, value: int
) -> None:
    # The pass over C runs in blocks of rows on several threads; each block's extremes count.
    products = _products(honest["path"])
    products[pair][row, col] = value
    root = _write(tmp_path / "p.safetensors", products)
    result = poc.verify(SPEC, SEED, tmp_path / "p.safetensors", root)
    assert (result.ok, result.code) == (False, "out_of_range")
    assert f"c{pair}" in result.reason


@pytest.mark.usefixtures("kernel_path")
def test_truncated_artifact_is_unreadable(honest: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "p.safetensors"
    path.write_bytes(honest["path"].read_bytes()[:-100])
    result = poc.verify(SPEC, SEED, path, honest["out"]["result_hash"])
    assert (result.ok, result.code) == (False, "unreadable")


@pytest.mark.parametrize("content", [b"", b"\x80\x04\x95 not safetensors", b"\xff" * 64])
def test_garbage_artifact_is_unreadable(honest: dict[str, Any], tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "p.safetensors"
    path.write_bytes(content)
    result = poc.verify(SPEC, SEED, path, honest["out"]["result_hash"])
    assert (result.ok, result.code) == (False, "unreadable")
    assert "not a valid safetensors file" in result.reason


def test_missing_artifact_is_unreadable(honest: dict[str, Any], tmp_path: Path) -> None:
    result = poc.verify(SPEC, SEED, tmp_path / "absent.safetensors", honest["out"]["result_hash"])
    assert (result.code, result.reason) == ("unreadable", "the artifact absent.safetensors is missing.")


@pytest.mark.parametrize(
    ("tensors", "code", "words"),
    [
        ({"c0": np.zeros((64, 64), np.int32)}, "tensors", "missing ['c1']"),
        (
            {"c0": np.zeros((64, 64), np.int32), "c1": np.zeros((64, 64), np.int32), "x": np.zeros(1, np.int32)},
            "tensors",
            "unexpected ['x']",
        ),
        ({"c0": np.zeros((64, 64), np.int64), "c1": np.zeros((64, 64), np.int32)}, "dtype", "c0 has dtype I64"),
        ({"c0": np.zeros((64, 64), np.int32), "c1": np.zeros((64, 64), np.float32)}, "dtype", "c1 has dtype F32"),
        ({"c0": np.zeros((63, 64), np.int32), "c1": np.zeros((64, 64), np.int32)}, "shape", "c0 has shape [63, 64]"),
        ({"c0": np.zeros((64, 64), np.int32), "c1": np.zeros(64 * 64, np.int32)}, "shape", "c1 has shape [4096]"),
    ],
    ids=["missing", "extra", "int64", "float32", "rows", "flat"],
)
def test_wrong_layout_is_named(
    honest: dict[str, Any], tmp_path: Path, tensors: dict[str, np.ndarray], code: str, words: str
) -> None:
    path = tmp_path / "p.safetensors"
    save_file(tensors, str(path))
    result = poc.verify(SPEC, SEED, path, honest["out"]["result_hash"])
    assert (result.ok, result.code) == (False, code)
    assert words in result.reason


@pytest.mark.parametrize(
    ("spec", "seed", "code", "field"),
    [
        ({**SPEC, "n": "64"}, SEED, "spec", "n: must be an integer"),
        ({**SPEC, "count": 0}, SEED, "spec", "count: must be between 1 and 64"),
        ({**SPEC, "entry_bound": True}, SEED, "spec", "entry_bound: must be an integer"),
        (SPEC, _seed(block_hash="zz" * 32), "seed", "block_hash: must be 64 hexadecimal digits"),
        (SPEC, _seed(worker_address="cpc1é"), "seed", "worker_address: must be a printable ASCII"),
        (SPEC, _seed(task_id="task-7"), "seed", "task_id: must be a UUID"),
    ],
)
def test_bad_spec_or_seed_is_a_verdict_not_a_crash(
    honest: dict[str, Any], spec: dict[str, Any], seed: dict[str, str], code: str, field: str
) -> None:
    result = poc.verify(spec, seed, honest["path"], honest["out"]["result_hash"])
    assert (result.ok, result.code) == (False, code)
    assert field in result.reason


@pytest.mark.parametrize("claim", ["", "ab" * 31, "g" * 64, None])
def test_malformed_claimed_hash(honest: dict[str, Any], claim: Any) -> None:
    result = poc.verify(SPEC, SEED, honest["path"], claim)
    assert (result.ok, result.code) == (False, "result_hash")


def test_claimed_hash_is_case_insensitive(honest: dict[str, Any]) -> None:
    assert poc.verify(SPEC, SEED, honest["path"], honest["out"]["result_hash"].upper()).ok


def test_run_rejects_a_bad_spec_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(poc.PocError, match="n: must be between 1 and 16384"):
        poc.run({"n": 20_000}, SEED, tmp_path)
    with pytest.raises(poc.PocError, match="task_id: must be a UUID"):
        poc.run(SPEC, _seed(task_id="7"), tmp_path)


def test_freivalds_vectors_are_fresh_and_in_range() -> None:
    first, second = random_vectors(64, 3, 20), random_vectors(64, 3, 20)
    assert first.shape == (3, 64)
    assert not np.array_equal(first, second)
    assert first.min() >= 0
    assert first.max() < 2**20


def test_rounds_reach_2_to_the_minus_60_within_exact_float64() -> None:
    for n in (1, 64, 1024, 2048, 16_384):
        for bound in range(1, 9):
            spec = poc.parse_spec({"n": n, "count": 1, "entry_bound": bound})
            bits, rounds = poc.freivalds_bits(spec), poc.rounds_for(spec)
            assert bits * rounds >= 60
            # Largest partial sum of A·(B·r) or C·r: n²b²·(2^bits − 1).
            assert n * n * bound * bound * (2**bits - 1) < 2**53
    assert poc.rounds_for(poc.parse_spec({"n": 2048})) == 3
    assert poc.rounds_for(poc.parse_spec({"n": 16_384})) == 4


# --- the generator -----------------------------------------------------------------

GENERATORS: tuple[poc.Generator, ...] = ("aes256ctr", "shake128")


def _reference_shake_rows(seed: bytes, matrix: str, pair: int, n: int, bound: int) -> np.ndarray:
    """The documented SHAKE128 stream, read one byte at a time (independent of the numpy code)."""
    m = 2 * bound + 1
    rows = []
    for i in range(n):
        stream = hashlib.shake_128(DOMAIN + seed + matrix.encode() + struct.pack("<II", pair, i)).digest(4 * n + 64)
        rows.append([x % m - bound for x in stream if x < 256 - 256 % m][:n])
    return np.array(rows, dtype=np.int8)


def _reference_aes_rows(seed: bytes, matrix: str, pair: int, n: int, bound: int) -> np.ndarray:
    """The documented AES-256-CTR keystream, built block by block with AES itself (no CTR mode)."""
    key = hashlib.sha256(DOMAIN_AES + seed + matrix.encode() + struct.pack("<I", pair)).digest()
    blocks = b"".join(i.to_bytes(16, "big") for i in range(-(-n * n // 16)))
    encryptor = Cipher(algorithms.AES(key), modes.ECB()).encryptor()  # noqa: S305 - raw AES blocks: the reference for CTR
    stream = np.frombuffer(encryptor.update(blocks) + encryptor.finalize(), dtype=np.uint8)[: n * n]
    m = 2 * bound + 1
    return (stream.astype(np.int64) * m // 256 - bound).astype(np.int8).reshape(n, n)


_REFERENCES = {"aes256ctr": _reference_aes_rows, "shake128": _reference_shake_rows}


@pytest.mark.parametrize("generator", GENERATORS)
@pytest.mark.parametrize("bound", [1, 3, 6, 8])
def test_generator_follows_its_documented_definition(generator: poc.Generator, bound: int) -> None:
    seed = poc.parse_seed_material(SEED).seed
    pairs: tuple[tuple[Literal["A", "B"], int], ...] = (("A", 0), ("B", 3))
    for matrix, pair in pairs:
        got = poc.generate_matrix(seed, matrix, pair, 48, bound, generator=generator)
        np.testing.assert_array_equal(got, _REFERENCES[generator](seed, matrix, pair, 48, bound))


def test_aes_rows_start_mid_block_and_span_chunks() -> None:
    # n = 1100: rows start at offsets that are not multiples of the 16-byte AES block, and
    # the matrix is generated in two chunks (about 1 MiB each) on separate threads.
    seed = poc.parse_seed_material(SEED).seed
    reference = _reference_aes_rows(seed, "B", 1, 1100, 8)
    np.testing.assert_array_equal(poc.generate_matrix(seed, "B", 1, 1100, 8, generator="aes256ctr"), reference)
    np.testing.assert_array_equal(
        poc.generate_rows(seed, "B", 1, 1100, 8, 951, 958, generator="aes256ctr"), reference[951:958]
    )


def test_seed_is_sha256_of_the_documented_bytes() -> None:
    raw = bytes.fromhex(SEED["block_hash"]) + SEED["worker_address"].encode("ascii") + uuid.UUID(SEED["task_id"]).bytes
    assert poc.parse_seed_material(SEED).seed == hashlib.sha256(raw).digest()
    upper = _seed(block_hash=SEED["block_hash"].upper(), task_id=SEED["task_id"].upper())
    assert poc.parse_seed_material(upper).seed == hashlib.sha256(raw).digest()


@pytest.mark.parametrize(("generator", "pinned"), [("aes256ctr", PINNED_A_AES), ("shake128", PINNED_A)])
def test_generator_is_pinned(generator: poc.Generator, pinned: str) -> None:
    # Pins the bytes of A: a change in hashlib, OpenSSL, numpy or this code that alters
    # them would make every verifier reject every honest worker, so it must fail loudly.
    a = poc.generate_matrix(poc.parse_seed_material(SEED).seed, "A", 0, 64, 8, generator=generator)
    assert hashlib.sha256(a.tobytes()).hexdigest() == pinned


@pytest.mark.parametrize("generator", GENERATORS)
def test_generation_is_deterministic_and_seed_dependent(generator: poc.Generator) -> None:
    seed = poc.parse_seed_material(SEED).seed
    a = poc.generate_matrix(seed, "A", 0, 128, 8, generator=generator)
    assert a.tobytes() == poc.generate_matrix(seed, "A", 0, 128, 8, generator=generator).tobytes()
    assert a.dtype == np.int8
    assert set(np.unique(a).tolist()) == set(range(-8, 9))
    others = [
        poc.generate_matrix(seed, "B", 0, 128, 8, generator=generator),
        poc.generate_matrix(seed, "A", 1, 128, 8, generator=generator),
        poc.generate_matrix(seed, "A", 0, 128, 8, generator=next(g for g in GENERATORS if g != generator)),
        *(
            poc.generate_matrix(poc.parse_seed_material(_seed(**change)).seed, "A", 0, 128, 8, generator=generator)
            for change in ({"block_hash": "00" * 32}, {"worker_address": "cpc1x"}, {"task_id": str(uuid.UUID(int=1))})
        ),
    ]
    for other in others:
        assert np.mean(other != a) > 0.9


@pytest.mark.parametrize("generator", GENERATORS)
def test_rows_regenerate_alone(generator: poc.Generator) -> None:
    seed = poc.parse_seed_material(SEED).seed
    whole = poc.generate_matrix(seed, "B", 2, 96, 6, generator=generator)
    np.testing.assert_array_equal(poc.generate_rows(seed, "B", 2, 96, 6, 40, 41, generator=generator), whole[40:41])
    np.testing.assert_array_equal(poc.generate_rows(seed, "B", 2, 96, 6, 90, 96, generator=generator), whole[90:])


def test_short_shake_streams_read_further() -> None:
    seed = poc.parse_seed_material(SEED).seed
    whole = poc.generate_matrix(seed, "B", 2, 96, 6, generator="shake128")
    # With no spare bytes nearly every row comes up short and is read again, further.
    np.testing.assert_array_equal(poc.generate_rows(seed, "B", 2, 96, 6, 0, 96, margin=0, generator="shake128"), whole)


def test_a_spec_without_a_generator_is_one_from_before_the_field() -> None:
    # Whichever side was upgraded first, a spec the old code wrote means SHAKE128.
    assert poc.parse_spec({"n": 64}).generator == "shake128"
    assert poc.parse_spec({"n": 64, "generator": "aes256ctr"}).generator == "aes256ctr"


@pytest.mark.usefixtures("kernel_path")
def test_a_task_is_verified_with_the_generator_its_spec_names(tmp_path: Path) -> None:
    # A task stored before the spec named a generator says shake128 (marketplace migration
    # 0003); its node's product passes under that spec and fails under aes256ctr.
    old = {**SPEC, "count": 1, "generator": "shake128"}
    out = poc.run(old, SEED, tmp_path, device="cpu")
    assert poc.verify(old, SEED, tmp_path / out["artifact"], out["result_hash"]).ok
    wrong = poc.verify({**old, "generator": "aes256ctr"}, SEED, tmp_path / out["artifact"], out["result_hash"])
    assert (wrong.ok, wrong.code) == (False, "product_mismatch")
    assert poc.expected_row(old, SEED, 0, 5) == load_file(str(tmp_path / out["artifact"]))["c0"][5].tolist()


def test_an_unknown_generator_stops_the_run_and_the_verifier(tmp_path: Path) -> None:
    spec = {**SPEC, "generator": "mt19937"}
    with pytest.raises(poc.PocError, match="generator: must be one of aes256ctr, shake128"):
        poc.run(spec, SEED, tmp_path, device="cpu")
    verdict = poc.verify(spec, SEED, tmp_path / "missing.safetensors", "ab" * 32)
    assert (verdict.ok, verdict.code) == (False, "spec")
    assert not list(tmp_path.iterdir())


# --- row proofs --------------------------------------------------------------------


@pytest.mark.usefixtures("kernel_path")
@pytest.mark.parametrize(("pair", "row"), [(0, 0), (0, 63), (1, 0), (1, 37)])
def test_row_proof_verifies_and_is_the_right_row(honest: dict[str, Any], pair: int, row: int) -> None:
    proof = poc.prove_row(honest["path"], pair, row)
    assert poc.check_row(proof, honest["out"]["result_hash"], n=64, count=2)
    assert proof.values == poc.expected_row(SPEC, SEED, pair, row)
    parsed = poc.RowProof.from_json(json.loads(json.dumps(proof.to_json())))
    assert poc.check_row(parsed, honest["out"]["result_hash"])


def test_tampered_row_proofs_fail(honest: dict[str, Any]) -> None:
    root = honest["out"]["result_hash"]
    proof = poc.prove_row(honest["path"], 1, 5)
    data = proof.to_json()
    bad_value = {**data, "values": [data["values"][0] + 1, *data["values"][1:]]}
    other_row = {**data, "row": 6}
    other_pair = {**data, "pair": 0}
    bad_path = {
        **data,
        "path": [data["path"][0][:-1] + ("0" if data["path"][0][-1] != "0" else "1"), *data["path"][1:]],
    }
    short_path = {**data, "path": data["path"][:-1]}
    for forged in (bad_value, other_row, other_pair, bad_path, short_path):
        assert not poc.check_row(poc.RowProof.from_json(forged), root)
    assert not poc.check_row(proof, "00" * 32)
    assert not poc.check_row(proof, "not hex")
    assert not poc.check_row(proof, root, n=32)
    assert not poc.check_row(proof, root, count=3)
    # Built directly (not from JSON), a value 2^32 away hashed the same once cast to int32,
    # and one beyond int64 raised: both are simply not the committed row.
    wrapped = dataclasses.replace(proof, values=[proof.values[0] + 2**32, *proof.values[1:]])
    huge = dataclasses.replace(proof, values=[2**70, *proof.values[1:]])
    assert not poc.check_row(wrapped, root)
    assert not poc.check_row(huge, root)


def test_row_proof_outside_the_artifact(honest: dict[str, Any]) -> None:
    with pytest.raises(IndexError, match="row 64 of product 0"):
        poc.prove_row(honest["path"], 0, 64)
    with pytest.raises(ValueError, match="values"):
        poc.RowProof.from_json({"pair": 0, "row": 0, "n": 1, "count": 1, "values": [2**40], "path": []})


# --- boundaries --------------------------------------------------------------------


def test_library_imports_without_django() -> None:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    code = (
        "import sys, training.poc, protocol.merkle; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'rest_framework')); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
