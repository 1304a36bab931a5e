"""The cube model's configuration, built from a ``cube_training`` spec, and its memory estimate.

Field names follow ``training.cube.spec.CubeTrainingSpec``; the few fields that spec does not
carry (``max_neighbours``, ``euler_steps``, ``validation_fraction``) keep their defaults here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

from training.cube.neighbours import DEFAULT_MAX_NEIGHBOURS, reach_steps

MIN_EDGE, MAX_EDGE = 2, 64


class CubeConfigError(ValueError):
    """A spec value the cube trainer cannot use; the message names the field."""


@dataclass(frozen=True)
class CubeConfig:
    """Constructor arguments of ``CubeModel`` (written as config.json next to the weights)."""

    teacher_dim: int = 768
    lattice_edge: int = 8
    state_size: int = 32
    # 0: T_min(S), the fewest steps in which the input face reaches the output face
    # (``training.cube.neighbours.reach_steps``); the built config holds the resolved number.
    steps: int = 0
    gate: Literal["soft", "topk"] = "soft"
    top_k: int = 2
    early_exit_tolerance: float = 0.0
    mode: Literal["autoencoder", "dialogue"] = "autoencoder"
    max_neighbours: int = DEFAULT_MAX_NEIGHBOURS
    euler_steps: int = 3
    # None: recompute each lattice step in backward when the activations would be large.
    activation_checkpointing: bool | None = None

    def __post_init__(self) -> None:
        if not MIN_EDGE <= self.lattice_edge <= MAX_EDGE:
            raise CubeConfigError(f"lattice_edge must be between {MIN_EDGE} and {MAX_EDGE} (got {self.lattice_edge}).")
        for name, lo in (("teacher_dim", 1), ("state_size", 1), ("steps", 0), ("euler_steps", 1)):
            if getattr(self, name) < lo:
                raise CubeConfigError(f"{name} must be at least {lo} (got {getattr(self, name)}).")
        if self.gate not in ("soft", "topk"):
            raise CubeConfigError(f"gate must be 'soft' or 'topk' (got {self.gate!r}).")
        if not 1 <= self.top_k <= 3:
            raise CubeConfigError(f"top_k must be 1, 2 or 3 (got {self.top_k}).")
        if self.mode not in ("autoencoder", "dialogue"):
            raise CubeConfigError(f"mode must be 'autoencoder' or 'dialogue' (got {self.mode!r}).")
        if self.max_neighbours < 6:
            raise CubeConfigError(f"max_neighbours must be at least 6 (got {self.max_neighbours}).")
        if self.steps == 0:
            object.__setattr__(self, "steps", self.reach)

    @property
    def reach(self) -> int:
        """T_min(S): the fewest lattice steps after which every output-face cell can see every
        input-face cell."""
        return reach_steps(self.lattice_edge, self.max_neighbours)

    @property
    def cells(self) -> int:
        """Cells in the lattice."""
        return self.lattice_edge**3

    @property
    def surface_hidden(self) -> int:
        """Hidden width of the surface MLPs: twice the surface, within [128, 1024]."""
        return min(max(2 * self.lattice_edge**2, 128), 1024)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CubeConfig:
        """Build from a spec or a config.json, ignoring keys that are not model fields."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def estimate_training_bytes(config: CubeConfig, batch_size: int) -> int:
    """A deliberately generous estimate of peak memory for one training step, in bytes.

    Activations dominate: per lattice step about 40 float32 tensors of [cells, batch, state]
    (experts, gate, residual) plus the local attention's gathered keys and values; with
    activation checkpointing only the step inputs are kept and one step is live at a time.
    Parameters count four times (weights, gradients, two AdamW moments).
    """
    cell_state = config.cells * batch_size * config.state_size * 4
    per_step = cell_state * (40 + 2 * 6 + config.euler_steps * 6)
    if uses_checkpointing(config, batch_size):
        activations = per_step + cell_state * (config.steps + 8)
    else:
        activations = per_step * config.steps + cell_state * 8
    surface = config.lattice_edge**2
    params = (
        2 * config.teacher_dim * surface
        + 2 * surface * config.surface_hidden
        + config.surface_hidden * config.teacher_dim
        + config.cells * 3
        + 40 * config.state_size**2
    )
    return int(activations + params * 4 * 4 + 64 * 2**20)


def uses_checkpointing(config: CubeConfig, batch_size: int) -> bool:
    """Whether lattice steps are recomputed in backward (explicit setting, else above ~4 GiB of activations)."""
    if config.activation_checkpointing is not None:
        return config.activation_checkpointing
    cell_state = config.cells * batch_size * config.state_size * 4
    return cell_state * 70 * config.steps > 4 * 2**30


def check_capacity(config: CubeConfig, batch_size: int, capacity_bytes: int | None) -> int:
    """The memory estimate; raises CubeConfigError when it is above ``capacity_bytes``."""
    need = estimate_training_bytes(config, batch_size)
    if capacity_bytes is not None and need > capacity_bytes:
        raise CubeConfigError(
            f"Estimated memory {need / 2**30:.2f} GiB exceeds the worker's capacity "
            f"{capacity_bytes / 2**30:.2f} GiB: lower lattice_edge, state_size or batch_size."
        )
    return need
