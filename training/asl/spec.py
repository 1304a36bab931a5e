"""The ASL kinds' specs (the single schema the platform and the trainer read), and batch
presets by GPU memory.

A spec arriving here has usually been validated by the platform already, but the trainer
checks again so that a direct caller (CLI, test, benchmark) gets a clear error naming the
field.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from training.specs import out_of_bounds, param

P = "Probability of "


@dataclass(frozen=True)
class AslTrainingSpec:
    """Isolated sign recognition on landmark sequences (ISLR format).

    Where a field's default differs from the 1st-place ISLR recipe, docs/asl-recipe.md has
    the ablation that chose it.
    """

    dim: int = param(192, "Model width (channels).", choices=(192, 384), common=True)
    blocks: int = param(2, "Stacks of [3 × Conv1D block + Transformer block].", lo=1, hi=8, common=True)
    max_len: int = param(384, "Frames kept per sequence.", lo=16, hi=1024)
    use_pose: bool = param(False, "Include the pose landmarks in the features.")
    normalisation: str = param(
        "per_axis",
        "Scale the centred landmarks by one standard deviation per axis (per_axis) or one for both (scalar).",
        choices=("per_axis", "scalar"),
    )
    random_crop: bool = param(False, "Train on a random window of max_len frames of a longer sequence, not its start.")
    mlp_expand: int = param(2, "Width of the Transformer blocks' MLP, in multiples of dim.", choices=(2, 4))
    epochs: int = param(30, "Training epochs.", lo=1, hi=1000, common=True)
    batch_size: int = param(12, "Samples per micro-batch (0 presets by GPU memory).", lo=0, hi=1024)
    grad_accumulation: int = param(4, "Micro-batches per optimiser step.", lo=1, hi=64)
    optimizer: str = param("adamw", "Optimiser.", choices=("adamw", "radam_lookahead"))
    schedule: str = param("onecycle", "Learning-rate schedule.", choices=("onecycle", "cosine"))
    learning_rate: float = param(1e-3, "Peak learning rate.", lo=1e-7, hi=1.0, common=True)
    weight_decay: float = param(0.05, "Weight decay.", lo=0.0, hi=1.0)
    label_smoothing: float = param(0.1, "Label smoothing.", lo=0.0, hi=0.5)
    dropout: float = param(0.2, "Late dropout before the classifier.", lo=0.0, hi=0.9)
    late_start: float = param(0.2, "Share of the epochs trained before late dropout and AWP switch on.", lo=0.0, hi=1.0)
    awp_lambda: float = param(
        0.0, "Adversarial weight perturbation (AWP) size from the late phase on; 0: off.", lo=0.0, hi=1.0
    )
    drop_path: float = param(0.2, "Stochastic depth rate.", lo=0.0, hi=0.9)
    use_augmentations: bool = param(True, "Master switch for every augmentation.")
    p_temporal: float = param(0.5, P + "temporal resampling (then a time mask, half the time).", lo=0.0, hi=1.0)
    resample_interpolation: str = param(
        "nearest",
        "How resampling makes new frames: the nearest frame, or per sequence nearest or linear (mixed).",
        choices=("mixed", "nearest"),
    )
    p_flip: float = param(0.35, P + "a horizontal mirror with left and right swapped.", lo=0.0, hi=1.0)
    p_spatial: float = param(0.7, P + "rotation, scale, shear and translation.", lo=0.0, hi=1.0)
    rotate_degrees: float = param(15.0, "Largest rotation in the image plane, in degrees.", lo=0.0, hi=90.0)
    p_spatial_mask: float = param(0.0, P + "hiding the points inside a random square of the image.", lo=0.0, hi=1.0)
    p_noise: float = param(0.3, P + "gaussian noise.", lo=0.0, hi=1.0)
    p_masking: float = param(0.2, P + "feature masking and landmark dropout.", lo=0.0, hi=1.0)
    validation_fraction: float = param(0.2, "Share of participants held out for validation.", lo=0.05, hi=0.5)
    early_stopping_patience: int = param(10, "Epochs without improvement before stopping (0: off).", lo=0, hi=1000)
    min_accuracy: float = param(0.0, "Held-out top-1 accuracy required for payment.", lo=0.0, hi=1.0, common=True)
    mixed_precision: bool = param(True, "bf16 autocast (fp32 on a GPU without native bf16).")
    compile: bool = param(False, "Use torch.compile where available.")
    seed: int = param(0, "Random seed for a deterministic run.", lo=0, hi=2**31 - 1)

    @classmethod
    def from_dict(cls, spec: dict[str, Any]) -> AslTrainingSpec:
        """Defaults filled in; ValueError naming the field for unknown keys or bad values."""
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(spec) - set(known))
        if unknown:
            raise ValueError(f"unknown spec field(s): {', '.join(unknown)}")
        values: dict[str, Any] = {}
        for name, value in spec.items():
            default = getattr(cls, name)
            if isinstance(default, bool):
                ok = isinstance(value, bool)
            elif isinstance(default, int):
                ok = isinstance(value, int) and not isinstance(value, bool)
            elif isinstance(default, float):
                ok = isinstance(value, int | float) and not isinstance(value, bool)
                value = float(value) if ok else value
            else:
                ok = isinstance(value, str)
            if not ok:
                raise ValueError(f"spec field {name}: expected {type(default).__name__}, got {value!r}")
            values[name] = value
        result = cls(**values)
        result.check()
        return result

    def check(self) -> None:
        """The fields' bounds and choices, but a wider ``dim``: the platform offers 192 and
        384, smaller widths serve tests and benchmarks."""
        bad = out_of_bounds(type(self), asdict(self), skip=("dim",))
        if not (16 <= self.dim <= 1024 and self.dim % 4 == 0):
            bad.insert(0, "dim")
        if bad:
            raise ValueError(f"spec field(s) out of range: {', '.join(bad)}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready copy."""
        return asdict(self)

    @property
    def late_epoch(self) -> int:
        """The first epoch of the late phase (late dropout and AWP on): after ``late_start``
        of the epochs (1st-place ISLR: epoch 15 of 300)."""
        return 1 + math.floor(self.late_start * self.epochs + 1e-9)

    @property
    def awp_epochs(self) -> int:
        """Epochs trained with AWP, each of whose steps costs two passes."""
        return max(0, self.epochs - self.late_epoch + 1) if self.awp_lambda > 0 else 0


# The trainer's name for it.
TrainSpec = AslTrainingSpec


@dataclass(frozen=True)
class AslInferenceSpec:
    """Predict signs for uploaded sequences with a trained ASL model."""

    source_task: str = param(help="A completed asl_training task whose model to use.", uuid=True)
    top_k: int = param(5, "Signs reported per sequence.", lo=1, hi=20, common=True)
    verify_samples: int = param(
        16, "Sequences the platform recomputes to verify the result.", lo=1, hi=1024, common=True
    )


GIB = 1024**3


def gpu_memory_bytes(capabilities: dict[str, Any] | None) -> int:
    """GPU memory a worker reported: ``gpu_memory_bytes``, or ``gpus[0].memory_bytes``; 0 if none."""
    if not capabilities:
        return 0
    value = capabilities.get("gpu_memory_bytes")
    if value is None and capabilities.get("gpus"):
        value = capabilities["gpus"][0].get("memory_bytes")
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError):
        return 0


def preset_batch(spec: AslTrainingSpec, capabilities: dict[str, Any] | None) -> tuple[int, int]:
    """(micro-batch, accumulation) for this worker.

    The reference point is a 12 GB card: 12 × 4 at dim 192 and max_len 384. Larger cards
    scale the micro-batch with memory; dim 384 or longer sequences shrink it. An explicit
    ``batch_size`` in the spec always wins.
    """
    if spec.batch_size:
        return spec.batch_size, spec.grad_accumulation
    memory = gpu_memory_bytes(capabilities)
    units = max(1, int(memory // (12 * 10**9))) if memory else 1
    per_unit = 12 * (192 / spec.dim) * (384 / max(spec.max_len, 64)) * (2 / spec.blocks)
    batch = int(max(1, min(1024, units * max(1.0, per_unit))))
    return batch, spec.grad_accumulation
