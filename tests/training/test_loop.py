"""The shared training loop, through its public surface: fit, LoopConfig, lr_factor."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from training.artifacts import read_state_file
from training.device import autocast_dtype
from training.loop import FitResult, LoopConfig, NonFiniteLossError, fit, lr_factor


def _regression(n: int = 64, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    w = torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    return TensorDataset(x, x @ w + 0.01 * torch.randn(n, 1, generator=g))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def _step(model: nn.Module, batch: Any) -> tuple[torch.Tensor, dict[str, float]]:
    x, y = batch
    loss = nn.functional.mse_loss(model(x).float(), y)
    return loss, {"mse": float(loss.detach())}


def _eval(model: nn.Module, loader: Any) -> dict[str, float]:
    device = next(model.parameters()).device  # fit hands eval_fn the loader as it is
    with torch.no_grad():
        losses = [float(nn.functional.mse_loss(model(x.to(device)), y.to(device))) for x, y in loader]
    return {"val_loss": sum(losses) / len(losses)}


def _loaders(batch_size: int = 8) -> tuple[DataLoader, DataLoader]:
    return (
        DataLoader(_regression(64, 0), batch_size=batch_size, shuffle=True),
        DataLoader(_regression(32, 1), batch_size=16),
    )


def test_fit_learns_and_reports_every_step_and_epoch() -> None:
    model = _model()
    train, val = _loaders()
    events: list[dict[str, Any]] = []
    config = LoopConfig(epochs=6, lr=5e-2, warmup_steps=2)
    before = _eval(model, val)["val_loss"]
    result = fit(model, train, val, _step, _eval, config, progress=events.append)

    assert isinstance(result, FitResult)
    assert result.best_metrics["val_loss"] < before / 4
    steps = [e for e in events if e["event"] == "step"]
    epochs = [e for e in events if e["event"] == "epoch"]
    assert [e["step"] for e in steps] == list(range(1, 49))
    assert all(e["total_steps"] == 48 and "mse" in e["metrics"] for e in steps)
    assert [e["epoch"] for e in epochs] == [1, 2, 3, 4, 5, 6]
    assert "train_mse" in epochs[0]["train"]
    assert "val_loss" in epochs[0]["val"]
    # Warm-up: the learning rate rises over the first steps, then decays.
    lrs = [e["lr"] for e in steps]
    assert lrs[0] < lrs[2]
    assert lrs[-1] < lrs[2]
    json.dumps(result.to_dict())


@pytest.mark.parametrize("optimizer", ["adamw", "radam_lookahead"])
def test_resume_after_a_crash_reaches_the_same_weights(
    tmp_path: Path, optimizer: Literal["adamw", "radam_lookahead"]
) -> None:
    config = LoopConfig(epochs=3, lr=1e-2, optimizer=optimizer, grad_accumulation=3, warmup_steps=2, seed=7)
    reference = _model()
    fit(reference, *_loaders(), _step, _eval, config)

    class Crash(Exception):
        pass

    def crash_in_epoch_two(event: dict[str, Any]) -> None:
        if event["event"] == "step" and event["epoch"] == 2:
            raise Crash

    interrupted = _model()
    with pytest.raises(Crash):
        fit(interrupted, *_loaders(), _step, _eval, config, progress=crash_in_epoch_two, checkpoint_dir=tmp_path)
    assert (tmp_path / "checkpoint.safetensors").is_file()
    assert json.loads((tmp_path / "checkpoint.json").read_text())["loop"]["epoch"] == 1

    resumed = _model()
    events: list[dict[str, Any]] = []
    result = fit(
        resumed, *_loaders(), _step, _eval, config, progress=events.append, checkpoint_dir=tmp_path, resume=True
    )

    assert events[0]["event"] == "step"
    assert events[0]["epoch"] == 2
    assert result.epochs_run == 3
    assert [h["epoch"] for h in result.history] == [1, 2, 3]
    for a, b in zip(reference.parameters(), resumed.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_gradient_accumulation_matches_the_large_batch() -> None:
    data = _regression(64, 0)
    val = DataLoader(_regression(32, 1), batch_size=16)
    big, small = _model(), _model()
    fit(big, DataLoader(data, batch_size=8), val, _step, _eval, LoopConfig(epochs=2, lr=1e-2))
    fit(small, DataLoader(data, batch_size=4), val, _step, _eval, LoopConfig(epochs=2, lr=1e-2, grad_accumulation=2))
    for a, b in zip(big.parameters(), small.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_early_stopping_stops_and_restores_the_best_weights() -> None:
    model = _model()
    train, val = _loaders()
    scores = iter([1.0, 0.5, 0.9, 0.8, 0.7, 0.6])
    snapshots: list[torch.Tensor] = []

    def eval_fn(m: nn.Module, loader: Any) -> dict[str, float]:
        snapshots.append(next(m.parameters()).detach().clone())
        return {"val_loss": next(scores)}

    result = fit(model, train, val, _step, eval_fn, LoopConfig(epochs=6, early_stopping_patience=2))
    assert result.stopped_early
    assert result.epochs_run == 4
    assert result.best_epoch == 2
    torch.testing.assert_close(next(model.parameters()), snapshots[1])


def test_monitor_can_be_maximised() -> None:
    scores = iter([0.1, 0.3, 0.2])
    result = fit(
        _model(),
        *_loaders(),
        _step,
        lambda m, loader: {"val_accuracy": next(scores)},
        LoopConfig(epochs=3, monitor="val_accuracy", monitor_mode="max"),
    )
    assert result.best_epoch == 2
    assert result.best_metrics == {"val_accuracy": 0.3}


def test_non_finite_loss_is_a_clear_error() -> None:
    def nan_step(model: nn.Module, batch: Any) -> tuple[torch.Tensor, dict[str, float]]:
        return model(batch[0]).sum() * float("nan"), {}

    with pytest.raises(NonFiniteLossError, match="epoch 1, step 1"):
        fit(_model(), *_loaders(), nan_step, _eval, LoopConfig(epochs=1))


def test_missing_monitored_metric_is_named() -> None:
    with pytest.raises(KeyError, match="val_loss"):
        fit(_model(), *_loaders(), _step, lambda m, loader: {"loss": 1.0}, LoopConfig(epochs=1))


def test_mixed_precision_on_cpu_autocasts_to_bf16() -> None:
    seen: list[torch.dtype] = []

    def step(model: nn.Module, batch: Any) -> tuple[torch.Tensor, dict[str, float]]:
        out = model(batch[0])
        seen.append(out.dtype)
        return nn.functional.mse_loss(out.float(), batch[1]), {}

    fit(_model(), *_loaders(), step, _eval, LoopConfig(epochs=1, mixed_precision=True, device="cpu"))
    assert set(seen) == {torch.bfloat16}


@pytest.mark.parametrize(("native_bf16", "expected"), [(True, torch.bfloat16), (False, None)])
def test_mixed_precision_on_a_gpu_is_bf16_or_fp32_never_fp16(
    monkeypatch: pytest.MonkeyPatch, native_bf16: bool, expected: torch.dtype | None
) -> None:
    # No GPU here: what the GPU reports is patched. fp16 would need a GradScaler, whose skipped
    # steps the platform's CPU replay takes (training.device).
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: native_bf16)
    assert autocast_dtype(torch.device("cuda")) is expected
    assert autocast_dtype(torch.device("cpu")) is torch.bfloat16


def test_a_training_state_holds_no_loss_scaler(tmp_path: Path) -> None:
    config = LoopConfig(epochs=1, mixed_precision=True, trace_every=1)
    fit(_model(), *_loaders(), _step, _eval, config, trace_dir=tmp_path)
    [first, *_] = sorted(tmp_path.glob("ckpt-*.safetensors"))
    assert read_state_file(first, 1 << 30)["scaler"] == {}


def test_invalid_config_names_the_field() -> None:
    with pytest.raises(ValueError, match="grad_accumulation"):
        LoopConfig(grad_accumulation=0)


def test_schedules_have_their_shape() -> None:
    cosine = LoopConfig(schedule="cosine", warmup_steps=10)
    factors = [lr_factor(s, 100, cosine) for s in range(100)]
    assert factors[0] < factors[5] < factors[10] == pytest.approx(1.0)
    assert factors[99] < 0.01
    onecycle = LoopConfig(schedule="onecycle")
    factors = [lr_factor(s, 100, onecycle) for s in range(100)]
    assert factors[0] == pytest.approx(1 / 25)
    assert max(factors) == pytest.approx(1.0)
    assert factors.index(max(factors)) == 30
    assert factors[99] < 0.01


def test_state_round_trips_through_safetensors_and_json_without_pickle(tmp_path: Path) -> None:
    from training.artifacts import ArtifactError, load_state, save_state

    state = {
        "w": torch.arange(6.0).reshape(2, 3),
        "groups": [{"betas": (0.9, 0.99), "params": [0, 1]}],
        "by_id": {3: {"step": torch.tensor(5.0)}},
    }
    save_state(tmp_path / "s", state)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.json", "s.safetensors"]
    back = load_state(tmp_path / "s")
    torch.testing.assert_close(back["w"], state["w"])
    assert back["groups"] == [{"betas": (0.9, 0.99), "params": [0, 1]}]
    assert float(back["by_id"][3]["step"]) == 5.0
    with pytest.raises(ArtifactError, match="without pickling"):
        save_state(tmp_path / "bad", {"f": object()})
    (tmp_path / "s.safetensors").write_bytes(b"garbage")
    with pytest.raises(ArtifactError, match="not a readable safetensors file"):
        load_state(tmp_path / "s")


def test_cpu_training_keeps_freed_memory_for_reuse() -> None:
    # glibc on Linux (this machine, CI): the allocator setting takes effect, once per process.
    import platform

    from training.device import keep_freed_memory

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        pytest.skip("mallopt is glibc's")
    assert keep_freed_memory() is True
    assert keep_freed_memory() is True
