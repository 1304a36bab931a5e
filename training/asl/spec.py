"""The asl_training spec as the trainer reads it, and batch presets by GPU memory.

Field names and defaults mirror ``marketplace.specs.AslTrainingSpec`` (which the platform
validates before a task is posted); this copy exists because ``training`` never imports
Django. A spec arriving here has usually been validated already, but the trainer checks
again so that a direct caller (CLI, test, benchmark) gets a clear error naming the field.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class TrainSpec:
    """One asl_training task's settings."""

    dim: int = 192
    blocks: int = 2
    max_len: int = 384
    use_pose: bool = False
    epochs: int = 30
    batch_size: int = 12  # 0: preset from the worker's GPU memory
    grad_accumulation: int = 4
    optimizer: str = "adamw"
    schedule: str = "onecycle"
    learning_rate: float = 1e-3
    weight_decay: float = 0.05
    label_smoothing: float = 0.1
    dropout: float = 0.2
    drop_path: float = 0.2
    use_augmentations: bool = True
    p_temporal: float = 0.5
    p_spatial: float = 0.7
    p_noise: float = 0.3
    p_masking: float = 0.2
    validation_fraction: float = 0.2
    early_stopping_patience: int = 10
    min_accuracy: float = 0.0
    mixed_precision: bool = True
    compile: bool = False
    seed: int = 0

    @classmethod
    def from_dict(cls, spec: dict[str, Any]) -> TrainSpec:
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
        """Bounds and choices, as in marketplace.specs.AslTrainingSpec."""
        rules = {
            # The platform offers 192 and 384; smaller widths serve tests and benchmarks.
            "dim": 16 <= self.dim <= 1024 and self.dim % 4 == 0,
            "blocks": 1 <= self.blocks <= 8,
            "max_len": 16 <= self.max_len <= 1024,
            "epochs": 1 <= self.epochs <= 1000,
            "batch_size": 0 <= self.batch_size <= 1024,
            "grad_accumulation": 1 <= self.grad_accumulation <= 64,
            "optimizer": self.optimizer in ("adamw", "radam_lookahead"),
            "schedule": self.schedule in ("onecycle", "cosine"),
            "learning_rate": 1e-7 <= self.learning_rate <= 1.0,
            "weight_decay": 0.0 <= self.weight_decay <= 1.0,
            "label_smoothing": 0.0 <= self.label_smoothing <= 0.5,
            "dropout": 0.0 <= self.dropout <= 0.9,
            "drop_path": 0.0 <= self.drop_path <= 0.9,
            "validation_fraction": 0.05 <= self.validation_fraction <= 0.5,
            "early_stopping_patience": 0 <= self.early_stopping_patience <= 1000,
            "seed": 0 <= self.seed <= 2**31 - 1,
        }
        for name in ("p_temporal", "p_spatial", "p_noise", "p_masking", "min_accuracy"):
            rules[name] = 0.0 <= getattr(self, name) <= 1.0
        bad = [name for name, ok in rules.items() if not ok]
        if bad:
            raise ValueError(f"spec field(s) out of range: {', '.join(bad)}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready copy."""
        return asdict(self)


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


def preset_batch(spec: TrainSpec, capabilities: dict[str, Any] | None) -> tuple[int, int]:
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
