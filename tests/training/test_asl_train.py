"""Training end to end on a synthetic 10-sign dataset: accuracy, verify, resume, inference."""

from __future__ import annotations

import csv
from fractions import Fraction
from math import comb
from pathlib import Path
from typing import Any

import pytest
import torch

from training.artifacts import load_tensors, read_json
from training.asl.infer import predict, verify_predictions
from training.asl.run import accepts, run, verify
from training.asl.spec import TrainSpec, preset_batch
from training.asl.synthetic import generate

# Small enough for two shared cores; every other field keeps the platform's default.
SPEC: dict[str, Any] = {
    "dim": 64,
    "blocks": 1,
    "max_len": 32,
    "epochs": 8,
    "batch_size": 8,
    "grad_accumulation": 1,
    "learning_rate": 3e-3,
    "validation_fraction": 0.33,
    "seed": 0,
}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("asl")
    return generate(root / "signs.zip", n_signs=10, n_participants=6, per_participant=3, max_frames=32, as_zip=True)


@pytest.fixture(scope="module")
def held_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two more participants the trainer never sees (another seed: other people, same signs)."""
    root = tmp_path_factory.mktemp("held")
    return generate(
        root / "held.zip", n_signs=10, n_participants=2, per_participant=2, max_frames=32, seed=0, as_zip=True
    )


@pytest.fixture(scope="module")
def trained(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], list[dict]]:
    out = tmp_path_factory.mktemp("out")
    # Module fixtures run before conftest's per-test one-thread fixture: pin it here too.
    torch.set_num_threads(1)
    events: list[dict] = []
    metrics = run(SPEC, dataset, out, events.append, cache_dir=out.parent / "cache")
    return out, metrics, events


def test_reaches_90_percent_on_held_out_participants(trained: tuple[Path, dict[str, Any], list[dict]]) -> None:
    out, metrics, events = trained
    assert metrics["val_top1"] >= 0.9
    assert metrics["val_top5"] >= metrics["val_top1"]
    assert metrics["num_signs"] == 10
    assert len(metrics["val_participants"]) == 2
    assert metrics["train_sequences"] == 120
    assert metrics["val_sequences"] == 60
    assert metrics["epochs_run"] <= SPEC["epochs"]
    assert set(metrics["confusion"]) == {"pairs", "worst_signs"}
    kinds = {e["event"] for e in events}
    assert kinds == {"reading", "step", "epoch"}
    assert [e["epoch"] for e in events if e["event"] == "epoch"] == list(range(1, metrics["epochs_run"] + 1))
    assert {"model.safetensors", "config.json", "labels.json", "metrics.json"} <= {p.name for p in out.iterdir()}
    assert read_json(out / "metrics.json")["val_top1"] == metrics["val_top1"]
    assert read_json(out / "labels.json")["signs"][:3] == ["hello", "thanks", "yes"]


def test_verify_recomputes_the_reported_accuracy(
    trained: tuple[Path, dict[str, Any], list[dict]], dataset: Path, held_out: Path, tmp_path: Path
) -> None:
    out, metrics, _ = trained
    # On the worker's own validation participants the platform gets the very same figure...
    full = verify(out, dataset, cache_dir=tmp_path)
    assert full["count"] == 180
    # ...and on people it never sent, a figure the tolerance accepts.
    hidden = verify(out, held_out, cache_dir=tmp_path)
    assert hidden["count"] == 40
    assert hidden["top1"] >= 0.8
    assert verify(out, held_out, cache_dir=tmp_path)["top1"] == hidden["top1"]
    assert accepts(metrics["val_top1"], metrics["val_top1"], 40)
    assert not accepts(1.0, 0.5, 40)
    assert not accepts(0.95, 0.95, 40, min_accuracy=0.97)


def test_resume_after_an_interruption_reaches_the_same_weights(dataset: Path, tmp_path: Path) -> None:
    spec = {**SPEC, "epochs": 3, "use_augmentations": True}
    straight = run(spec, dataset, tmp_path / "a", cache_dir=tmp_path / "cache")

    class Crash(Exception):
        pass

    def crash_after_epoch_2(event: dict) -> None:
        if event["event"] == "epoch" and event["epoch"] == 2:
            raise Crash

    with pytest.raises(Crash):
        run(spec, dataset, tmp_path / "b", crash_after_epoch_2, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "b" / "model.safetensors").exists()
    epochs: list[int] = []
    resumed = run(
        spec,
        dataset,
        tmp_path / "b",
        lambda e: epochs.append(e["epoch"]) if e["event"] == "epoch" else None,
        cache_dir=tmp_path / "cache",
    )
    assert epochs == [3]
    a = load_tensors(tmp_path / "a" / "model.safetensors")
    b = load_tensors(tmp_path / "b" / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)
    assert resumed["val_top1"] == straight["val_top1"]


def test_inference_writes_top_k_and_spot_checks_catch_tampering(
    trained: tuple[Path, dict[str, Any], list[dict]], held_out: Path, tmp_path: Path
) -> None:
    out, _, _ = trained
    summary = predict(out, held_out, tmp_path, top_k=5)
    assert summary == {"sequences": 40, "top_k": 5}
    rows = list(csv.reader((tmp_path / "predictions.csv").open()))
    assert rows[0] == ["path", "sequence_id"] + [f"{k}_{i}" for i in range(1, 6) for k in ("sign", "score")]
    assert len(rows) == 41
    scores = [float(s) for s in rows[1][3::2]]
    assert scores == sorted(scores, reverse=True)
    assert 0 < sum(scores) <= 1.0001
    check = verify_predictions(out, held_out, tmp_path / "predictions.csv", samples=40, seed=1)
    assert check == {"ok": True, "checked": 40, "mismatched": []}
    rows[5][2], rows[5][4] = rows[5][4], rows[5][2]  # swap the top two signs of one row
    with (tmp_path / "tampered.csv").open("w", newline="") as fh:
        csv.writer(fh, lineterminator="\n").writerows(rows)
    tampered = verify_predictions(out, held_out, tmp_path / "tampered.csv", samples=40, seed=1)
    assert tampered["ok"] is False
    assert tampered["mismatched"] == [rows[5][0]]


def test_spec_errors_name_the_field_and_presets_follow_gpu_memory(dataset: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown spec field.*: epochz"):
        run({"epochz": 3}, dataset, tmp_path)
    with pytest.raises(ValueError, match="spec field learning_rate: expected float"):
        TrainSpec.from_dict({"learning_rate": "fast"})
    with pytest.raises(ValueError, match="out of range: p_noise"):
        TrainSpec.from_dict({"p_noise": 1.5})
    auto = TrainSpec.from_dict({"batch_size": 0})
    assert preset_batch(auto, {"gpu_memory_bytes": 12 * 10**9}) == (12, 4)
    assert preset_batch(auto, {"gpu_memory_bytes": 80 * 10**9}) == (72, 4)
    assert preset_batch(auto, None) == (12, 4)
    assert preset_batch(TrainSpec.from_dict({"batch_size": 0, "dim": 384}), {"gpu_memory_bytes": 24 * 10**9}) == (12, 4)
    assert preset_batch(TrainSpec.from_dict({"batch_size": 20}), {"gpu_memory_bytes": 80 * 10**9}) == (20, 4)


def guessing_reaches(classes: int, count: int, right: int) -> Fraction:
    """P(at least ``right`` of ``count`` right by guessing among ``classes``), exactly."""
    p = Fraction(1, classes)
    return sum((comb(count, k) * p**k * (1 - p) ** (count - k) for k in range(right, count + 1)), Fraction(0))


@pytest.mark.parametrize(("classes", "count"), [(5, 10), (2, 20), (10, 50), (250, 2_000), (3, 7)])
def test_the_chance_floor_is_the_fewest_right_answers_guessing_reaches_once_in_a_hundred(
    classes: int, count: int
) -> None:
    from training.asl.run import chance_floor

    floor = chance_floor(classes, count)
    right = round(floor * count)
    assert right / count == pytest.approx(floor)
    assert guessing_reaches(classes, count, right) <= Fraction(1, 100)
    assert guessing_reaches(classes, count, right - 1) > Fraction(1, 100)


def test_the_chance_floor_at_its_edges() -> None:
    from training.asl.run import chance_floor

    # 10 sequences of 5 signs: 5 right is reached by guessing 3.3 % of the time, 6 right 0.64 %.
    assert chance_floor(5, 10) == 0.6
    assert chance_floor(2, 3) == 1.0  # three sequences of two signs: only a perfect score shows learning
    assert chance_floor(2, 6) == 1.0  # even a perfect score is guessed 1.6 % of the time: required anyway
    assert chance_floor(1, 10) == 0.0
    assert chance_floor(5, 0) == 0.0
