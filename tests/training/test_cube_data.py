"""Cube datasets: uploaded arrays are validated with errors naming the file; the generator is deterministic."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from training.cube.data import (
    CubeDataError,
    load_dataset,
    split_indices,
    synthetic_embeddings,
    validate_embeddings,
)
from training.cube.run import run


def _write(tmp_path: Path, name: str, array: np.ndarray) -> Path:
    tmp_path.mkdir(exist_ok=True)
    if name.endswith(".npy"):
        np.save(tmp_path / name, array)
    else:
        save_file({"embeddings": array}, str(tmp_path / name))
    return tmp_path


@pytest.mark.parametrize(
    ("array", "message"),
    [
        (np.zeros((10, 31), np.float32), "rows have 31 dimensions but teacher_dim is 32"),
        (np.zeros((10,), np.float32), r"expected shape \[N, 32\], got \[10\]"),
        (np.zeros((10, 32), np.int32), "dtype int32 is not a float type"),
        (np.zeros((1, 32), np.float32), "needs at least 2 rows"),
        (np.array([[0.0] * 32, [np.nan] + [0.0] * 31], np.float32), "NaN or infinite values .first at row 1"),
        (np.full((3, 32), np.inf), "NaN or infinite"),
    ],
)
def test_bad_arrays_are_refused_with_the_file_named(tmp_path: Path, array: np.ndarray, message: str) -> None:
    for name in ("embeddings.npy", "embeddings.safetensors"):
        data = _write(tmp_path / name.split(".")[1], name, array)
        with pytest.raises(CubeDataError, match=f"{name}: .*{message}"):
            load_dataset(data, teacher_dim=32, mode="autoencoder")


def test_good_arrays_load_as_float32(tmp_path: Path) -> None:
    data = _write(tmp_path, "embeddings.npy", np.ones((5, 32), np.float64))
    inputs, targets = load_dataset(data, 32, "autoencoder") or (None, None)
    assert inputs is not None
    assert inputs.dtype == np.float32
    assert inputs.shape == (5, 32)
    assert targets is None
    assert load_dataset(tmp_path / "empty", 32, "autoencoder") is None


def test_pickled_npy_is_refused(tmp_path: Path) -> None:
    np.save(tmp_path / "embeddings.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(CubeDataError, match=r"embeddings\.npy: could not be read"):
        load_dataset(tmp_path, 32, "autoencoder")


def test_corrupt_safetensors_is_refused(tmp_path: Path) -> None:
    (tmp_path / "embeddings.safetensors").write_bytes(b"\x00" * 20)
    with pytest.raises(CubeDataError, match=r"embeddings\.safetensors: could not be read"):
        load_dataset(tmp_path, 32, "autoencoder")


def test_dialogue_needs_paired_targets(tmp_path: Path) -> None:
    _write(tmp_path, "embeddings.npy", np.ones((6, 32), np.float32))
    with pytest.raises(CubeDataError, match="Dialogue mode needs targets"):
        load_dataset(tmp_path, 32, "dialogue")
    np.save(tmp_path / "targets.npy", np.ones((5, 32), np.float32))
    with pytest.raises(CubeDataError, match="targets: 5 rows but the embeddings have 6"):
        load_dataset(tmp_path, 32, "dialogue")
    np.save(tmp_path / "targets.npy", np.ones((6, 16), np.float32))
    with pytest.raises(CubeDataError, match=r"targets\.npy: rows have 16 dimensions"):
        load_dataset(tmp_path, 32, "dialogue")


def test_one_safetensors_file_can_carry_both(tmp_path: Path) -> None:
    save_file({"embeddings": np.ones((4, 32), np.float32)}, str(tmp_path / "embeddings.safetensors"))
    with pytest.raises(CubeDataError, match="'targets'"):
        load_dataset(tmp_path, 32, "dialogue")
    pair = {"embeddings": np.ones((4, 32), np.float32), "targets": np.zeros((4, 32), np.float32)}
    save_file(pair, str(tmp_path / "embeddings.safetensors"))
    _, targets = load_dataset(tmp_path, 32, "dialogue") or (None, None)
    assert targets is not None
    assert float(targets.sum()) == 0.0


def test_mismatched_teacher_dim_stops_a_run(tmp_path: Path) -> None:
    data = _write(tmp_path / "data", "embeddings.npy", np.ones((20, 48), np.float32))
    with pytest.raises(CubeDataError, match="mismatched teacher_dim"):
        run({"teacher_dim": 32, "lattice_edge": 4}, data, tmp_path / "out")


def test_no_data_and_no_synthetic_samples_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(CubeDataError, match="synthetic_samples is 0"):
        run({"teacher_dim": 32, "lattice_edge": 4, "synthetic_samples": 0}, tmp_path, tmp_path / "out")


def test_synthetic_generator_is_deterministic_structured_and_streams_differ() -> None:
    a, _ = synthetic_embeddings(200, 64, seed=5)
    b, _ = synthetic_embeddings(200, 64, seed=5)
    c, _ = synthetic_embeddings(200, 64, seed=5, stream=1)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)
    assert a.dtype == np.float32
    assert 0.5 < float(a.std()) < 2.0
    # Low rank: 16 directions carry almost all of the variance.
    singular = np.linalg.svd(a - a.mean(0), compute_uv=False)
    assert (singular[:16] ** 2).sum() / (singular**2).sum() > 0.97
    x, y = synthetic_embeddings(50, 64, seed=5, mode="dialogue")
    assert y is not None
    assert y.shape == x.shape
    assert not np.allclose(x, y)


def test_split_is_deterministic_and_disjoint() -> None:
    train, val = split_indices(100, 0.1, seed=1)
    again = split_indices(100, 0.1, seed=1)
    np.testing.assert_array_equal(train, again[0])
    assert len(val) == 10
    assert set(train).isdisjoint(val)
    assert len(set(train) | set(val)) == 100
    assert len(split_indices(2, 0.1, seed=0)[1]) == 1


def test_texts_without_sentence_transformers_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "texts.txt").write_text("hello\nworld\n")
    # Simulate a worker without the package even where it happens to be installed.
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)
    with pytest.raises(CubeDataError, match="sentence-transformers package, which is not installed"):
        load_dataset(tmp_path, 32, "autoencoder")


def test_validate_rejects_non_arrays() -> None:
    with pytest.raises(CubeDataError, match="expected an array"):
        validate_embeddings([[1.0] * 32], 32, "x")
