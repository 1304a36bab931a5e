"""Training the cube end to end through ``training.cube.run``: learning, artifacts, resume, verification."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

from training.cube.run import (
    DEFAULT_TRAINING_SPEC,
    heldout_synthetic,
    infer,
    run,
    verify,
    verify_inference,
)

# Small enough for two shared CPU cores: a 4³ lattice (T_min = 4 steps), 256 synthetic rows.
TINY = {
    "teacher_dim": 32,
    "lattice_edge": 4,
    "state_size": 8,
    "steps": 0,
    "epochs": 4,
    "batch_size": 16,
    "synthetic_samples": 256,
    "warmup_steps": 5,
    "learning_rate": 1e-2,
    "seed": 3,
}
# The platform's secret seed behind the held-out samples (workers.assignments.heldout).
SECRET_SEED = bytes(range(32))


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], list[dict[str, Any]]]:
    out = tmp_path_factory.mktemp("cube")
    events: list[dict[str, Any]] = []
    metrics = run(TINY, out / "no-dataset", out / "model", progress=events.append)
    return out / "model", metrics, events


def test_fixed_seed_run_halves_the_validation_loss(trained: tuple[Path, dict[str, Any], list[dict[str, Any]]]) -> None:
    _, metrics, _ = trained
    assert metrics["val_loss"] <= 0.5 * metrics["initial_val_loss"]
    assert metrics["cosine"] > 0.5
    for term in ("reconstruction", "similarity", "diversity", "balance"):
        assert f"val_{term}" in metrics
    # Each term's share of the weighted total is logged per epoch; with the soft gate the
    # balance term is zero and the others all count.
    for term in ("reconstruction", "similarity", "diversity"):
        assert all(epoch["val"][f"val_share_{term}"] > 0.01 for epoch in metrics["history"]), term
    assert metrics["val_share_balance"] == 0.0
    assert metrics["epochs_run"] == 4
    # Every expert keeps a share of the gate.
    assert all(metrics[f"val_gate_{e}"] > 0.05 for e in ("local", "functional", "distant"))
    assert metrics["train_rows"] + metrics["validation_rows"] == 256


def test_progress_reports_every_step_and_epoch(trained: tuple[Path, dict[str, Any], list[dict[str, Any]]]) -> None:
    _, metrics, events = trained
    steps = [e for e in events if e["event"] == "step"]
    epochs = [e for e in events if e["event"] == "epoch"]
    assert len(steps) == metrics["steps"] == 4 * 15  # 230 training rows in batches of 16
    assert [e["epoch"] for e in epochs] == [1, 2, 3, 4]
    assert {"reconstruction", "cosine"} <= set(steps[0]["metrics"])
    assert epochs[-1]["val"]["val_loss"] > 0


def test_artifacts_are_safetensors_json_and_a_model_card(
    trained: tuple[Path, dict[str, Any], list[dict[str, Any]]],
) -> None:
    model_dir, metrics, _ = trained
    config = json.loads((model_dir / "config.json").read_text())
    assert config["architecture"] == "CubeModel"
    assert config["lattice_edge"] == 4
    assert config["loss_weights"]["similarity"] == DEFAULT_TRAINING_SPEC["loss_similarity"]
    weights = load_file(str(model_dir / "model.safetensors"))
    assert "lattice.cell_gate" in weights
    assert weights["lattice.cell_gate"].shape == (64, 1, 3)
    saved = json.loads((model_dir / "metrics.json").read_text())
    assert saved["val_loss"] == metrics["val_loss"]
    card = (model_dir / "README.md").read_text()
    assert "# Cube model 4³ (autoencoder)" in card
    assert "val_loss" in card


def test_platform_verification_accepts_the_honest_figure_and_rejects_a_false_one(
    trained: tuple[Path, dict[str, Any], list[dict[str, Any]]],
) -> None:
    model_dir, metrics, _ = trained
    inputs, targets = heldout_synthetic(TINY, SECRET_SEED)
    honest = verify(model_dir, inputs, targets, metrics)
    assert honest["accepted"], honest
    assert honest["recomputed"]["val_loss"] == pytest.approx(metrics["val_loss"], rel=0.2)
    inflated = verify(model_dir, inputs, targets, {**metrics, "val_loss": metrics["val_loss"] / 5})
    assert inflated["accepted"] is False
    assert "differs from reported" in inflated["reason"]
    missing = verify(model_dir, inputs, targets, {})
    assert missing["accepted"] is False


def test_verification_rejects_weights_that_do_not_fit(
    trained: tuple[Path, dict[str, Any], list[dict[str, Any]]], tmp_path: Path
) -> None:
    model_dir, metrics, _ = trained
    forged = tmp_path / "forged"
    forged.mkdir()
    (forged / "config.json").write_text((model_dir / "config.json").read_text())
    weights = load_file(str(model_dir / "model.safetensors"))
    weights["lattice.cell_gate"] = np.zeros((8, 1, 3), dtype=np.float32)
    save_file(weights, str(forged / "model.safetensors"))
    result = verify(forged, *heldout_synthetic(TINY, SECRET_SEED), metrics)
    assert result["accepted"] is False
    assert "lattice.cell_gate" in result["reason"]
    (forged / "model.safetensors").write_bytes(b"not safetensors")
    assert "not a readable safetensors file" in verify(forged, *heldout_synthetic(TINY, SECRET_SEED), metrics)["reason"]


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/self/status")


def _padded_safetensors(path: Path, weights: dict[str, np.ndarray], ballast_bytes: int) -> None:
    """The model's tensors plus a "ballast" tensor of ``ballast_bytes`` of zeros, written as a
    sparse file: nothing is allocated until something reads it."""
    codes = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64", "int32": "I32", "bool": "BOOL"}
    entries: dict[str, Any] = {}
    blobs, offset = [], 0
    for name, value in weights.items():
        blob = np.ascontiguousarray(value).tobytes()
        entries[name] = {
            "dtype": codes[value.dtype.name],
            "shape": list(value.shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        blobs.append(blob)
        offset += len(blob)
    entries["ballast"] = {
        "dtype": "F32",
        "shape": [ballast_bytes // 4],
        "data_offsets": [offset, offset + ballast_bytes],
    }
    header = json.dumps(entries).encode()
    header += b" " * (-len(header) % 8)
    with path.open("wb") as handle:
        handle.write(len(header).to_bytes(8, "little") + header + b"".join(blobs))
        handle.truncate(8 + len(header) + offset + ballast_bytes)


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="peak RSS is reset through Linux's /proc")
def test_weights_padded_with_a_large_tensor_are_refused_before_it_is_read(
    trained: tuple[Path, dict[str, Any], list[dict[str, Any]]], tmp_path: Path
) -> None:
    model_dir, metrics, _ = trained
    padded = tmp_path / "padded"
    padded.mkdir()
    (padded / "config.json").write_text((model_dir / "config.json").read_text())
    _padded_safetensors(padded / "model.safetensors", load_file(str(model_dir / "model.safetensors")), 2**30)
    inputs, targets = heldout_synthetic(TINY, SECRET_SEED)
    Path("/proc/self/clear_refs").write_text("5")  # the peak RSS starts again from now
    before = _rss_kib("VmRSS")
    result = verify(padded, inputs, targets, metrics)
    grown = _rss_kib("VmHWM") - before
    assert result["accepted"] is False
    assert "unexpected ['ballast']" in result["reason"]
    assert grown < 256 * 1024, f"the verifier grew by {grown} KiB: the 1 GiB ballast was read"


def test_inference_and_its_spot_check(trained: tuple[Path, dict[str, Any], list[dict[str, Any]]]) -> None:
    model_dir, _, _ = trained
    inputs, _ = heldout_synthetic(TINY, SECRET_SEED, samples=40)
    outputs = infer(model_dir, inputs, batch_size=16)
    assert outputs.shape == (40, 32)
    assert outputs.dtype == np.float32
    assert verify_inference(model_dir, inputs, outputs, samples=8, seed=1)["accepted"]
    tampered = outputs.copy()
    tampered[:, 0] += 0.5
    result = verify_inference(model_dir, inputs, tampered, samples=8, seed=1)
    assert result["accepted"] is False
    assert len(result["rows"]) == 8
    assert verify_inference(model_dir, inputs, outputs[:10], samples=8, seed=1)["accepted"] is False


def test_resume_after_a_crash_gives_the_same_next_steps(tmp_path: Path) -> None:
    spec = {**TINY, "epochs": 2, "synthetic_samples": 96, "mixed_precision": False}
    reference: list[dict[str, Any]] = []
    run(spec, tmp_path / "none", tmp_path / "a", progress=reference.append)

    class Crash(Exception):
        pass

    def crash(event: dict[str, Any]) -> None:
        if event["event"] == "step" and event["epoch"] == 2:
            raise Crash

    with pytest.raises(Crash):
        run(spec, tmp_path / "none", tmp_path / "b", progress=crash)
    resumed: list[dict[str, Any]] = []
    run(spec, tmp_path / "none", tmp_path / "b", progress=resumed.append, resume=True)

    expected = [e for e in reference if e["epoch"] == 2]
    assert [e["step"] for e in resumed] == [e["step"] for e in expected]
    for got, want in zip(resumed, expected, strict=True):
        if got["event"] == "step":
            assert got["loss"] == want["loss"]
    a = load_file(str(tmp_path / "a" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "model.safetensors"))
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])


def test_dialogue_mode_learns_from_uploaded_pairs(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    questions = rng.normal(size=(160, 32)).astype(np.float32)
    answers = np.tanh(questions @ rng.normal(size=(32, 32)).astype(np.float32) / 6)
    np.save(data / "embeddings.npy", questions)
    np.save(data / "targets.npy", answers.astype(np.float32))
    spec = {**TINY, "mode": "dialogue", "epochs": 3, "synthetic_samples": 0}
    metrics = run(spec, data, tmp_path / "out")
    assert metrics["train_rows"] + metrics["validation_rows"] == 160
    assert metrics["val_loss"] < metrics["initial_val_loss"]
    with torch.no_grad():
        out = infer(tmp_path / "out", questions[:4])
    assert out.shape == (4, 32)


def test_spec_defaults_match_the_marketplace_serializer() -> None:
    from marketplace.kinds import KINDS

    fields = KINDS["cube_training"].spec_serializer().fields
    assert {name: f.default for name, f in fields.items()} == DEFAULT_TRAINING_SPEC


def test_unknown_spec_field_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="Unknown cube_training field"):
        run({"lattice_egde": 8}, tmp_path, tmp_path / "out")


def test_capacity_and_lattice_edge_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="exceeds the worker's capacity"):
        run({**TINY, "lattice_edge": 32}, tmp_path, tmp_path / "out", capacity_bytes=2**28)
    with pytest.raises(ValueError, match="lattice_edge must be between 2 and 64"):
        run({**TINY, "lattice_edge": 65}, tmp_path, tmp_path / "out")
