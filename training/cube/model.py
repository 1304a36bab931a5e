"""The cube model: teacher embedding → lattice input face → lattice dynamics → output face → embedding.

The input face is the ``z = 0`` layer and the output face the ``z = S − 1`` layer. The teacher
enters at the input face only: every other cell starts from a learned state of its position
alone, the same for every input. What the decoder reads from the output face depends on the
input only through the lattice steps, and ``steps`` ≥ T_min(S) (``training.cube.neighbours``)
lets every output-face cell see every input-face cell: with 0 steps the prediction is one
constant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from training.cube.config import CubeConfig, uses_checkpointing
from training.cube.lattice import Lattice3D, LatticeOutput
from training.portable import uniform_bound_std


def fourier_features(coords: torch.Tensor, bands: int = 3) -> torch.Tensor:
    """``coords`` in [-1, 1] with sin/cos at π·2^k, k < bands: ``[..., C·(1 + 2·bands)]``."""
    scaled = torch.cat([coords * math.pi * 2**k for k in range(bands)], dim=-1)
    return torch.cat([coords, scaled.sin(), scaled.cos()], dim=-1)


def _normalised_grid(edge: int, dims: int) -> torch.Tensor:
    axis = torch.linspace(-1.0, 1.0, edge) if edge > 1 else torch.zeros(1)
    grids = torch.meshgrid(*([axis] * dims), indexing="ij")  # slowest axis first: (z, y, x) / (y, x)
    return torch.stack([g.reshape(-1) for g in reversed(grids)], dim=-1)  # columns x, y[, z]


class EmbeddingTransformer(nn.Module):
    """teacher_dim ↔ S×S surface. ``encode``: LayerNorm, projection, residual MLP, LayerNorm and
    a learned 2-D positional term; ``decode``: its inverse, an MLP with a linear skip."""

    def __init__(self, teacher_dim: int, edge: int, hidden: int) -> None:
        super().__init__()
        surface = edge * edge
        self.in_norm = nn.LayerNorm(teacher_dim)
        self.to_surface = nn.Linear(teacher_dim, surface)
        self.residual = nn.Sequential(nn.Linear(surface, hidden), nn.GELU(), nn.Linear(hidden, surface))
        self.surface_norm = nn.LayerNorm(surface)
        self.position = nn.Parameter(torch.zeros(surface))
        self.out_norm = nn.LayerNorm(surface)
        self.from_surface = nn.Sequential(nn.Linear(surface, hidden), nn.GELU(), nn.Linear(hidden, teacher_dim))
        self.skip = nn.Linear(surface, teacher_dim)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, teacher_dim]`` → ``[B, S²]``."""
        u = self.to_surface(self.in_norm(x))
        return self.surface_norm(u + self.residual(u)) + self.position

    def decode(self, surface: torch.Tensor) -> torch.Tensor:
        """``[B, S²]`` → ``[B, teacher_dim]``."""
        s = self.out_norm(surface)
        return self.from_surface(s) + self.skip(s)


class EmbeddingToLatticeMapper(nn.Module):
    """Each surface value onto its own input-face cell: [value, 2-D position features] → state,
    plus a learned per-cell positional encoding."""

    face_features: torch.Tensor
    # The positional encoding's draw in training.portable: uniform, standard deviation 0.02.
    PORTABLE_BOUNDS: ClassVar[dict[str, float]] = {"position": uniform_bound_std(0.02)}

    def __init__(self, edge: int, d: int) -> None:
        super().__init__()
        features = fourier_features(_normalised_grid(edge, 2))
        self.register_buffer("face_features", features, persistent=False)
        self.project = nn.Sequential(nn.Linear(features.shape[1] + 1, d), nn.GELU(), nn.Linear(d, d))
        self.position = nn.Parameter(torch.randn(edge * edge, 1, d) * 0.02)

    def forward(self, surface: torch.Tensor) -> torch.Tensor:
        """``[B, S²]`` → face states ``[S², B, D]``."""
        b = surface.shape[0]
        value = surface.t().unsqueeze(-1)  # [S², B, 1]
        feats = self.face_features.to(surface.dtype).unsqueeze(1).expand(-1, b, -1)
        return self.project(torch.cat([value, feats], dim=-1)) + self.position


class VolumeStateInitializer(nn.Module):
    """The lattice before the first step: the input face holds the mapper's states, every other
    cell a learned state of its normalised (x, y, z) alone (an MLP of its position features),
    the same for every input."""

    cell_features: torch.Tensor

    def __init__(self, edge: int, d: int) -> None:
        super().__init__()
        features = fourier_features(_normalised_grid(edge, 3))[edge * edge :]
        self.register_buffer("cell_features", features, persistent=False)
        self.mlp = nn.Sequential(nn.Linear(features.shape[1], d), nn.GELU(), nn.Linear(d, d))

    def forward(self, face: torch.Tensor) -> torch.Tensor:
        """Face ``[S², B, D]`` → lattice ``[S³, B, D]``."""
        b = face.shape[1]
        inner = self.mlp(self.cell_features.to(face.dtype)).unsqueeze(1).expand(-1, b, -1)
        return torch.cat([face, inner], dim=0)


class LatticeToEmbeddingExtractor(nn.Module):
    """Reads the output face (z = S − 1) back cell by cell to an S×S surface."""

    def __init__(self, edge: int, d: int) -> None:
        super().__init__()
        self.surface = edge * edge
        self.norm = nn.LayerNorm(d)
        # No bias: the decoder's LayerNorm over the surface would cancel a shift shared by all cells.
        self.readout = nn.Linear(d, 1, bias=False)
        self.position = nn.Parameter(torch.zeros(edge * edge))

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        """Lattice ``[S³, B, D]`` → ``[B, S²]``."""
        face = state[-self.surface :]
        return self.readout(self.norm(face)).squeeze(-1).t() + self.position


@dataclass
class CubeOutput:
    """The model's prediction and its lattice trajectory."""

    prediction: torch.Tensor  # [B, teacher_dim]
    lattice: LatticeOutput


class CubeModel(nn.Module):
    """Teacher embedding in, reconstructed (autoencoder) or target (dialogue) embedding out."""

    def __init__(self, config: CubeConfig) -> None:
        super().__init__()
        self.config = config
        edge, d = config.lattice_edge, config.state_size
        self.transformer = EmbeddingTransformer(config.teacher_dim, edge, config.surface_hidden)
        self.mapper = EmbeddingToLatticeMapper(edge, d)
        self.initializer = VolumeStateInitializer(edge, d)
        self.lattice = Lattice3D(config)
        self.extractor = LatticeToEmbeddingExtractor(edge, d)

    def set_batch_size(self, batch_size: int) -> None:
        """Turn activation checkpointing on where the estimate says the activations are large."""
        self.lattice.checkpointing = uses_checkpointing(self.config, batch_size)

    def initial_state(self, x: torch.Tensor) -> torch.Tensor:
        """The lattice state before any step, ``[S³, B, D]``."""
        return self.initializer(self.mapper(self.transformer.encode(x)))

    def forward(self, x: torch.Tensor, steps: int | None = None) -> CubeOutput:
        """``x``: ``[B, teacher_dim]``. ``steps`` overrides the configured number of lattice steps."""
        if x.ndim != 2 or x.shape[1] != self.config.teacher_dim:
            raise ValueError(
                f"Expected embeddings of shape [batch, {self.config.teacher_dim}], got {list(x.shape)} "
                "(mismatched teacher_dim)."
            )
        lattice = self.lattice(self.initial_state(x), steps=steps)
        return CubeOutput(self.transformer.decode(self.extractor(lattice.state)), lattice)
