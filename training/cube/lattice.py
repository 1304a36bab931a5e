"""Lattice3D: synchronous updates of every cell by a gated mixture of three experts.

State layout is ``[cells, batch, state]``. No step loops over cells or batch items; the only
Python loops are over lattice steps and the Distant expert's few Euler steps (and, off CPU,
over the Local band's six offsets).

A step runs as one autograd function with a hand-written backward pass,
``training.cube.fused.LatticeStep``: on small lattices its cost is passes over memory and the
number of operations, not arithmetic. The experts' modules hold the weights and also run on
their own (``LocalExpert.forward`` and so on, which tests compare with the fused step); the
per-cell reference (``training.cube.reference``) applies the same weights one cell at a time.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch.utils.checkpoint import checkpoint

from training.cube.config import CubeConfig
from training.cube.fused import DistantUpdate, FunctionalUpdate, LatticeStep, LocalUpdate, StepSpec, gate_weights
from training.cube.kernels import Attention, ShiftAttention, SparseAttention, band_mean
from training.cube.neighbours import Band, Neighbourhood, neighbourhood, row_pattern


class LocalExpert(nn.Module):
    """Dot-product attention of a cell over its local band, then an MLP on [state, context].

    Queries and keys live in a narrow space (``state/4``); the values are the neighbours' raw
    states, and the value projection is folded into the MLP's context weights (attention is
    linear in the values, so ``W_c Σ a·W_v h = (W_c W_v) Σ a·h``): the attention reads the
    neighbours' states where they are.
    """

    def __init__(self, d: int) -> None:
        super().__init__()
        self.d = d
        self.key_dim = max(4, d // 4)
        # Query, key and the MLP's state half in one matmul; the MLP's first layer on
        # [state, context] is split in two so no concatenation is needed.
        self.project = nn.Linear(d, 2 * self.key_dim + d)
        self.context = nn.Linear(d, d, bias=False)
        self.out = nn.Linear(d, d)

    def neighbour_input(self, h: torch.Tensor, index: torch.Tensor) -> dict[str, torch.Tensor]:
        """The query, the MLP's state half, and the band's gathered keys and states ``[N, K, B, ·]``."""
        n, b, d = h.shape
        q, k, hidden = self.project(h).split([self.key_dim, self.key_dim, d], dim=-1)
        flat, k_neighbours = index.reshape(-1), index.shape[1]
        return {
            "query": q,
            "hidden": hidden,
            "keys": k.index_select(0, flat).reshape(n, k_neighbours, b, self.key_dim),
            "values": h.index_select(0, flat).reshape(n, k_neighbours, b, d),
        }

    def attention(self, band: Band, batch: int, device: torch.device) -> Attention:
        """How the attention over ``band`` runs: sparse matmuls on CPU (fewest operations), dense
        shifted views elsewhere (no reliance on the device's sparse kernels)."""
        scale = 1.0 / math.sqrt(self.key_dim)
        if device.type == "cpu":
            return SparseAttention(row_pattern(band, batch), scale)
        return ShiftAttention(band.score_mask, band.shifts, scale)

    def forward(self, h: torch.Tensor, band: Band) -> torch.Tensor:
        """The update proposed for every cell (``Lattice3D.step`` computes it fused with the others)."""
        n, b, d = h.shape
        q, k, hidden = self.project(h).split([self.key_dim, self.key_dim, d], dim=-1)
        with _fp32(h):
            out = LocalUpdate.apply(
                q.float(),
                k.float(),
                hidden.float(),
                h.float(),
                self.context.weight.float(),
                self.out.weight.float(),
                self.out.bias.float(),
                self.attention(band, b, h.device),
            )
        return out.view(n, b, d)


class FunctionalExpert(nn.Module):
    """Message passing with a GRU-style gated update from the functional band's mean."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.d = d
        self.gates_state = nn.Linear(d, 2 * d)
        self.from_message = nn.Linear(d, 3 * d, bias=False)  # update/reset gates and candidate
        self.candidate_state = nn.Linear(d, d)

    def forward(self, h: torch.Tensor, message: torch.Tensor) -> torch.Tensor:
        """The update proposed for every cell: z·(h̃ − h), as in a GRU (``Lattice3D.step`` computes
        it fused with the others)."""
        n, b, d = h.shape
        x = h.reshape(n * b, d)
        gates_h = self.gates_state(x)
        with _fp32(h):
            out = FunctionalUpdate.apply(
                x.float(),
                message.reshape(n * b, d).float(),
                gates_h.float(),
                self.from_message.weight.float(),
                self.candidate_state.weight.float(),
                self.candidate_state.bias.float(),
            )
        return out.view(n, b, d)


class DistantExpert(nn.Module):
    """A continuous-time cell, dx/dt = (−x + tanh(W x + U m)) / τ, integrated by Euler steps."""

    def __init__(self, d: int, euler_steps: int) -> None:
        super().__init__()
        self.euler_steps = euler_steps
        self.inp = nn.Linear(d, d)
        self.rec = nn.Linear(d, d, bias=False)
        self.log_tau = nn.Parameter(torch.zeros(d))

    def rate(self) -> torch.Tensor:
        """Each Euler step's fraction of the way to the target, ``[D]``, in fp32."""
        return 1.0 / (self.euler_steps * (0.5 + F.softplus(self.log_tau.float())))

    def forward(self, h: torch.Tensor, message: torch.Tensor) -> torch.Tensor:
        """The state change after integrating one unit of time: ``euler_steps`` steps of
        x ← x + rate·(tanh(W x + U m) − x), rate = 1 / (euler_steps · (0.5 + softplus(log τ)))
        (``Lattice3D.step`` computes it fused with the others)."""
        n, b, d = h.shape
        rate = self.rate()
        with _fp32(h):
            out = DistantUpdate.apply(
                h.reshape(n * b, d).float(),
                message.reshape(n * b, d).float(),
                self.inp.weight.float(),
                self.inp.bias.float(),
                self.rec.weight.float(),
                rate,
                self.euler_steps,
            )
        return out.view(n, b, d)


def _balance(preference: torch.Tensor, usage: torch.Tensor) -> torch.Tensor:
    """Switch-Transformer load balancing for the one contested place of top-2 (the distant expert
    always holds the other): ``E·Σₑ fₑ·pₑ − 1`` over the two contenders, with ``f`` the share of
    cells that keep each (not differentiable) and ``p`` the router's mean probability of each.
    0 when they share evenly, 1 when one is dead; its gradient lowers the favourite's
    probability in proportion to how often it wins."""
    f, p = usage.detach(), preference
    return (2.0 * (f * p + (1.0 - f) * (1.0 - p)) - 1.0).clamp_min(0.0)


def _fp32(h: torch.Tensor) -> contextlib.AbstractContextManager[Any]:
    """The experts' fused updates run in fp32: inside autocast, turn it off for them."""
    if torch.is_autocast_enabled(h.device.type):
        return torch.autocast(h.device.type, enabled=False)
    return contextlib.nullcontext()


@dataclass
class LatticeOutput:
    """Final state plus what the losses need about the trajectory."""

    state: torch.Tensor  # [N, B, D]
    initial: torch.Tensor  # [N, B, D]
    step_changes: list[torch.Tensor] = field(default_factory=list)  # mean squared change per step
    gate_mean: torch.Tensor | None = None  # [3] average gate weight per expert
    # Top-k with two places: the load-balancing term over the steps (0 when the local and
    # functional experts share the contested place evenly, 1 when one never gets it).
    balance: torch.Tensor | None = None
    steps_run: int = 0


class Lattice3D(nn.Module):
    """``steps`` synchronous updates: h ← h + Σₑ gₑ(h)·expertₑ(h, band neighbours)."""

    def __init__(self, config: CubeConfig) -> None:
        super().__init__()
        self.config = config
        d = config.state_size
        self.local = LocalExpert(d)
        self.functional = FunctionalExpert(d)
        self.distant = DistantExpert(d, config.euler_steps)
        self.gate = nn.Linear(d, 3)
        # A learned per-cell preference among the experts, added to the state-dependent logits.
        self.cell_gate = nn.Parameter(torch.zeros(config.cells, 1, 3))
        self.checkpointing = False

    def bands(self, device: torch.device) -> Neighbourhood:
        """The cached neighbourhood of this lattice shape on ``device``."""
        return neighbourhood(self.config.lattice_edge, self.config.max_neighbours, device)

    def gate_weights(self, h: torch.Tensor) -> torch.Tensor:
        """Per-cell expert weights ``[N, B, 3]``: softmax, or softmax over the top-k logits."""
        n, b, d = h.shape
        logits = F.linear(h.reshape(n * b, d), self.gate.weight)
        return gate_weights(logits, self.gate.bias, self.cell_gate, n, b, self._top_k).permute(1, 2, 0)

    @property
    def _top_k(self) -> int:
        return self.config.top_k if self.config.gate == "topk" else 3

    def expert_inputs(self, h: torch.Tensor) -> dict[str, torch.Tensor]:
        """What each expert receives from its band, as gathered copies (for inspection and tests;
        ``step`` reads the same neighbours in place)."""
        nb = self.bands(h.device)
        return {
            **{f"local_{k}": v for k, v in self.local.neighbour_input(h, nb.local.index).items()},
            "functional": band_mean(nb.functional.matrix, nb.functional.transposed, h),
            "distant": band_mean(nb.distant.matrix, nb.distant.transposed, h),
        }

    def _state_projection(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Weight and bias of every linear map applied to the state, stacked: the Local projection
        (query, key, MLP state half), the gate, the Functional gates' state term."""
        maps = (self.local.project, self.gate, self.functional.gates_state)
        return torch.cat([m.weight for m in maps]), torch.cat([m.bias for m in maps])

    def step(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One synchronous update of every cell: the new state, the mean squared change (a scalar)
        and the gate weights ``[3, N, B]``."""
        nb = self.bands(h.device)
        spec = StepSpec(
            key_dim=self.local.key_dim,
            top_k=self._top_k,
            euler_steps=self.distant.euler_steps,
            attention=self.local.attention(nb.local, h.shape[1], h.device),
            means=nb.means,
            means_transposed=nb.means_transposed,
        )
        weight, bias = self._state_projection()
        params = (
            weight,
            bias,
            self.cell_gate,
            self.local.context.weight,
            self.local.out.weight,
            self.local.out.bias,
            self.functional.from_message.weight,
            self.functional.candidate_state.weight,
            self.functional.candidate_state.bias,
            self.distant.inp.weight,
            self.distant.inp.bias,
            self.distant.rec.weight,
            self.distant.rate(),
        )
        with _fp32(h):
            return LatticeStep.apply(spec, h.float(), *(p.float() for p in params))

    def forward(self, h: torch.Tensor, steps: int | None = None) -> LatticeOutput:
        """Run ``steps`` (default: the configured number) updates. With ``early_exit_tolerance`` > 0
        it stops after the first step whose RMS state change falls below the tolerance."""
        out = LatticeOutput(state=h, initial=h)
        gate_sum: torch.Tensor | None = None
        balance: list[torch.Tensor] = []
        tolerance = self.config.early_exit_tolerance
        for _ in range(self.config.steps if steps is None else steps):
            preference = self._local_preference(h) if self._top_k == 2 else None
            if self.checkpointing and self.training and torch.is_grad_enabled():
                h, change, gates = self._checkpointed_step(h)
            else:
                h, change, gates = self.step(h)
            out.step_changes.append(change)
            gate_mean = gates.detach().mean(dim=(1, 2))
            gate_sum = gate_mean if gate_sum is None else gate_sum + gate_mean
            if preference is not None:
                balance.append(_balance(preference, (gates[0] > 0).float().mean()))
            out.steps_run += 1
            if tolerance > 0 and float(change.detach().sqrt()) < tolerance:
                break
        out.state = h
        out.gate_mean = gate_sum / out.steps_run if gate_sum is not None else None
        out.balance = torch.stack(balance).mean() if balance else None
        return out

    def _local_preference(self, h: torch.Tensor) -> torch.Tensor:
        """The router's probability of the local expert over the functional one for the contested
        place, averaged over cells and batch (differentiable; fp32)."""
        n, b, d = h.shape
        w, bias = self.gate.weight.float(), self.gate.bias.float()
        cell = (self.cell_gate[:, :, 0] - self.cell_gate[:, :, 1]).float()  # [N, 1]
        margin = F.linear(h.reshape(n, b, d).float(), w[0] - w[1]) + (bias[0] - bias[1]) + cell
        return torch.sigmoid(margin).mean()

    def _checkpointed_step(self, h: torch.Tensor) -> Any:
        # A step draws nothing at random, so there is no RNG state to save and restore for
        # the recomputation (saving it is a host read, which a CUDA graph capture refuses).
        return checkpoint(self.step, h, use_reentrant=False, preserve_rng_state=False)
