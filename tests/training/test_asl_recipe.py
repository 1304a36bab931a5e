"""The recipe's switches (docs/asl-recipe.md): late dropout and adversarial weight
perturbation (AWP) switch on at the late phase and not before, the spec's new fields refuse
bad values by name, and a run with every 1st-place choice on (AWP, random crop, mixed
resampling, spatial mask) still re-executes exactly, segment by segment, while a worker that
skips AWP to save half its compute is caught."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tests.factories import TINY_ASL
from training.artifacts import read_state_file
from training.asl.landmarks import selected_landmarks
from training.asl.run import augmenter, replay_segments, trainer
from training.asl.run import run as asl_run
from training.asl.spec import TrainSpec
from training.asl.synthetic import generate
from training.loop import LoopConfig, fit
from training.replay import segment_distance
from training.trace import Segment, checkpoint_name, read_trace

# Every 1st-place choice on; the late phase (AWP, late dropout) from epoch 2 of 3; sequences
# longer than max_len so the random crop cuts.
FIRST_PLACE = {
    **TINY_ASL,
    "dim": 32,
    "epochs": 3,
    "max_len": 16,
    "mixed_precision": False,
    "normalisation": "per_axis",
    "random_crop": True,
    "mlp_expand": 2,
    "p_temporal": 0.8,
    "resample_interpolation": "mixed",
    "p_flip": 0.5,
    "p_spatial": 0.75,
    "rotate_degrees": 30.0,
    "p_spatial_mask": 0.5,
    "dropout": 0.8,
    "late_start": 0.4,
    "awp_lambda": 0.2,
}


class Cube(nn.Module):
    """loss = Σ w³: the gradient at w is 3w², so where it was taken shows in its size."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor([1.0]))


def _cubic_step(model: nn.Module, batch: Any) -> tuple[torch.Tensor, dict[str, float]]:
    return (model.get_parameter("w") ** 3).sum(), {}


def test_awp_takes_the_gradient_at_the_perturbed_weights_only_from_its_epoch(tmp_path: Path) -> None:
    """Epoch 1 (before AWP): the gradient at w. Epoch 2: at w + λ (the normalised gradient of
    a one-element tensor is its sign), and the weights the optimizer steps from are w, not
    the perturbed ones."""
    config = LoopConfig(
        epochs=2,
        lr=0.1,
        weight_decay=0.0,
        schedule="constant",
        grad_clip=0.0,
        awp_lambda=0.5,
        awp_from_epoch=2,
        trace_every=1,
        device="cpu",
    )
    fit(Cube(), [0], [], _cubic_step, lambda m, loader: {"val_loss": 0.0}, config, trace_dir=tmp_path)
    states = [read_state_file(tmp_path / checkpoint_name(i), 1 << 20) for i in range(3)]
    moment = [float(s["optimizer"]["state"][0]["exp_avg"]) if i else 0.0 for i, s in enumerate(states)]
    w1 = float(states[1]["model"]["w"])
    assert moment[1] == pytest.approx(0.1 * 3.0)  # β₁ = 0.9: (1 − β₁)·g with g = 3·1²
    assert moment[2] == pytest.approx(0.9 * moment[1] + 0.1 * 3.0 * (w1 + 0.5) ** 2)
    # AdamW with bias correction moves w by about lr per step, from where it was, not w + λ.
    assert float(states[2]["model"]["w"]) == pytest.approx(w1 - 0.1, abs=0.02)


def _regression_step(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    return ((model(x) - 1.0) ** 2).mean(), {}


def test_awp_leaves_every_step_before_its_epoch_as_it_was() -> None:
    """The same run with and without AWP: identical weights up to its first epoch, then
    different."""
    ends: dict[float, list[torch.Tensor]] = {}
    for lam in (0.0, 0.3):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        data = [torch.randn(6, 4) for _ in range(3)]
        seen: list[torch.Tensor] = []

        def snapshot(epoch: int, model: nn.Module = model, seen: list[torch.Tensor] = seen) -> None:
            seen.append(torch.cat([p.detach().flatten().clone() for p in model.parameters()]))

        config = LoopConfig(epochs=3, awp_lambda=lam, awp_from_epoch=2, schedule="constant", device="cpu")
        fit(
            model,
            data,
            [],
            _regression_step,
            lambda m, loader: {"val_loss": 0.0},
            config,
            on_epoch=snapshot,
        )
        ends[lam] = [*seen, torch.cat([p.detach().flatten() for p in model.parameters()])]
    off, on = ends[0.0], ends[0.3]
    assert torch.equal(off[0], on[0])
    assert torch.equal(off[1], on[1])
    assert not torch.equal(off[2], on[2])  # after epoch 2, the first with AWP


def test_awp_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="awp_lambda"):
        LoopConfig(awp_lambda=-0.1)
    with pytest.raises(ValueError, match="awp_from_epoch"):
        LoopConfig(awp_from_epoch=0)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("normalisation", "l2"),
        ("random_crop", "yes"),
        ("mlp_expand", 3),
        ("resample_interpolation", "cubic"),
        ("p_flip", 1.5),
        ("rotate_degrees", 120.0),
        ("p_spatial_mask", -0.1),
        ("late_start", 2.0),
        ("awp_lambda", -1.0),
    ],
)
def test_the_recipe_fields_refuse_bad_values_by_name(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field):
        TrainSpec.from_dict({field: value})


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("asl-recipe")
    return generate(
        root / "signs.zip", n_signs=4, n_participants=4, per_participant=3, min_frames=20, max_frames=40, as_zip=True
    )


def test_late_dropout_is_off_before_the_late_phase_and_on_from_it(dataset: Path, tmp_path: Path) -> None:
    spec = {**FIRST_PLACE, "epochs": 10, "late_start": 0.5}
    assert TrainSpec.from_dict(spec).late_epoch == 6
    built = trainer(spec, dataset, "cpu", cache_dir=tmp_path)
    assert built.on_epoch is not None
    model: Any = built.model
    for epoch in range(1, 11):
        built.on_epoch(epoch)
        assert model.late_dropout.active is (epoch >= 6)
    assert built.config.awp_from_epoch == 6
    assert built.config.awp_lambda == 0.2
    # On, it drops: 0.8 of the pooled features are zeroed in training.
    model.train()
    pooled = torch.ones(4, 1000)
    assert 0.7 < float((model.late_dropout(pooled) == 0).float().mean()) < 0.9
    model.eval()
    assert torch.equal(model.late_dropout(pooled), pooled)


def test_the_spec_sets_the_augmenter() -> None:
    points = selected_landmarks(use_pose=False)
    policy = augmenter(TrainSpec.from_dict(FIRST_PLACE), points)
    assert policy is not None
    assert (policy.crop, policy.interpolation, policy.p_flip, policy.rotate_degrees, policy.p_spatial_mask) == (
        16,
        "mixed",
        0.5,
        30.0,
        0.5,
    )
    default = augmenter(TrainSpec.from_dict({}), points)
    assert default is not None
    assert default.crop == 0
    assert augmenter(TrainSpec.from_dict({"use_augmentations": False}), points) is None


@pytest.fixture(scope="module")
def traced(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("asl-recipe-run")
    metrics = asl_run(FIRST_PLACE, dataset, root / "model", cache_dir=root / "cache", resume=False, trace_dir=root)
    assert metrics["trace"]["leaves"] >= 4
    return root


def _segments(folder: Path) -> list[Segment]:
    trace = read_trace(folder / "trace.json")
    return [
        Segment(folder / checkpoint_name(a.index), a, folder / checkpoint_name(b.index), b)
        for a, b in zip(trace.leaves, trace.leaves[1:], strict=False)
    ]


def test_a_first_place_run_with_awp_re_executes_exactly(dataset: Path, traced: Path, tmp_path: Path) -> None:
    """Segments before and inside the AWP epochs land at distance 0 in fp32 on this CPU: the
    crop, the new augmentations and AWP's two passes draw only from the seeded streams."""
    segments = _segments(traced)
    late = [s for s in segments if s.end_leaf.epoch >= 2]
    early = [s for s in segments if s.end_leaf.epoch == 1]
    assert late
    assert early
    for segment in (early[0], late[0], late[-1]):
        built = trainer(FIRST_PLACE, dataset, "cpu", cache_dir=tmp_path)
        assert segment_distance(built, segment) == 0.0
    assert replay_segments(FIRST_PLACE, dataset, [late[0], late[-1]]) == ["", ""]


def test_a_worker_that_skips_awp_is_caught(dataset: Path, tmp_path: Path) -> None:
    """AWP doubles a step's compute; a worker that trains the AWP epochs without it commits
    segments that do not re-execute under the spec."""
    root = tmp_path / "cheat"
    asl_run(
        {**FIRST_PLACE, "awp_lambda": 0.0},
        dataset,
        root / "model",
        cache_dir=root / "cache",
        resume=False,
        trace_dir=root,
    )
    late = [s for s in _segments(root) if s.end_leaf.epoch >= 2]
    assert late
    verdicts = replay_segments(FIRST_PLACE, dataset, late[:2])
    assert all("does not re-execute" in v for v in verdicts), verdicts


def test_awp_epochs_are_priced_as_the_two_passes_they_take() -> None:
    """AWP doubles a late epoch's work: the estimate the price follows grows with it, so a
    requester cannot have twice the compute for the price of one pass."""
    from training.kinds import get

    kind = get("asl_training")
    spec = {**TrainSpec.from_dict({"epochs": 20}).to_dict()}
    plain = kind.flops(spec)
    late = kind.flops({**spec, "awp_lambda": 0.2, "late_start": 0.25})  # AWP in epochs 6..20
    assert late == pytest.approx(plain * (20 + 15) / 20)
