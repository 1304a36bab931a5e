"""Lattice3D: synchronous updates of every cell by a gated mixture of three experts.

State layout is ``[cells, batch, state]`` so that a neighbour gather is one ``index_select``
over rows and a band mean is one sparse matmul on a ``[cells, batch·state]`` view. No step
loops over cells or batch items; the only Python loops are over lattice steps and the
Distant expert's few Euler steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch.utils.checkpoint import checkpoint

from training.cube.config import CubeConfig
from training.cube.neighbours import Neighbourhood, neighbourhood


class _SparseMean(torch.autograd.Function):
    """``A @ X`` whose backward uses a precomputed ``Aᵀ`` (torch would transpose A every call)."""

    @staticmethod
    def forward(ctx: Any, matrix: torch.Tensor, transposed: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        ctx.transposed = transposed
        with torch.autocast(x.device.type, enabled=False):  # sparse kernels have no bf16/fp16 path
            return torch.sparse.mm(matrix, x.float())

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None, torch.Tensor]:
        with torch.autocast(grad.device.type, enabled=False):
            return None, None, torch.sparse.mm(ctx.transposed, grad.float().contiguous())


def band_mean(matrix: torch.Tensor, transposed: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """Mean of each cell's valid neighbours: one sparse matmul over the ``[N, B·D]`` view."""
    n, b, d = h.shape
    out = _SparseMean.apply(matrix, transposed, h.reshape(n, b * d))
    return out.reshape(n, b, d).to(h.dtype)


class LocalExpert(nn.Module):
    """Dot-product attention of a cell over its local band, then an MLP on [state, context].

    Queries and keys live in a narrow space (``state/4``); the values are the neighbours' raw
    states, and the value projection is folded into the MLP's context weights (attention is
    linear in the values, so ``W_c Σ a·W_v h = (W_c W_v) Σ a·h``). That halves the memory
    traffic of the ``[N, K, B, ·]`` tensors, which dominate this expert's cost.
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

    def forward(self, inputs: dict[str, torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
        """The update proposed for every cell."""
        scores = (inputs["query"].unsqueeze(1) * inputs["keys"]).sum(dim=-1) * (1.0 / math.sqrt(self.key_dim))
        weights = scores.masked_fill(~mask[:, :, None], float("-inf")).softmax(dim=1)  # [N, K, B]
        context = (weights.unsqueeze(-1) * inputs["values"]).sum(dim=1)
        return self.out(F.gelu(inputs["hidden"] + self.context(context)))


class FunctionalExpert(nn.Module):
    """Message passing with a GRU-style gated update from the functional band's mean."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.d = d
        self.gates_state = nn.Linear(d, 2 * d)
        self.from_message = nn.Linear(d, 3 * d, bias=False)  # update/reset gates and candidate
        self.candidate_state = nn.Linear(d, d)

    def forward(self, h: torch.Tensor, message: torch.Tensor) -> torch.Tensor:
        """The update proposed for every cell: z·(h̃ − h), as in a GRU."""
        gates_m, candidate_m = self.from_message(message).split([2 * self.d, self.d], dim=-1)
        z, r = torch.sigmoid(self.gates_state(h) + gates_m).chunk(2, dim=-1)
        candidate = torch.tanh(self.candidate_state(r * h) + candidate_m)
        return z * (candidate - h)


class DistantExpert(nn.Module):
    """A continuous-time cell, dx/dt = (−x + tanh(W x + U m)) / τ, integrated by Euler steps."""

    def __init__(self, d: int, euler_steps: int) -> None:
        super().__init__()
        self.euler_steps = euler_steps
        self.inp = nn.Linear(d, d)
        self.rec = nn.Linear(d, d, bias=False)
        self.log_tau = nn.Parameter(torch.zeros(d))

    def forward(self, h: torch.Tensor, message: torch.Tensor) -> torch.Tensor:
        """The state change after integrating one unit of time."""
        n, b, d = h.shape
        drive = self.inp(message).reshape(n * b, d)
        rate = 1.0 / (self.euler_steps * (0.5 + F.softplus(self.log_tau)))
        weight = self.rec.weight.t()
        x = h.reshape(n * b, d)
        for _ in range(self.euler_steps):
            # x + rate·(tanh(W x + U m) − x), as one matmul-add, one tanh and one lerp.
            target = torch.tanh(torch.addmm(drive, x, weight))
            x = torch.lerp(x.to(target.dtype), target, rate.to(target.dtype))  # autocast may narrow target
        return x.reshape(n, b, d) - h


@dataclass
class LatticeOutput:
    """Final state plus what the losses need about the trajectory."""

    state: torch.Tensor  # [N, B, D]
    initial: torch.Tensor  # [N, B, D]
    step_changes: list[torch.Tensor] = field(default_factory=list)  # mean squared change per step
    gate_mean: torch.Tensor | None = None  # [3] average gate weight per expert
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
        logits = self.gate(h) + self.cell_gate.to(h.dtype)
        if self.config.gate == "topk" and self.config.top_k < 3:
            kth = logits.topk(self.config.top_k, dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        return logits.softmax(dim=-1)

    def expert_inputs(self, h: torch.Tensor) -> dict[str, torch.Tensor]:
        """What each expert receives from its band (exposed so tests can check it is non-zero)."""
        nb = self.bands(h.device)
        return {
            **{f"local_{k}": v for k, v in self.local.neighbour_input(h, nb.local.index).items()},
            "functional": band_mean(nb.functional.matrix, nb.functional.transposed, h),
            "distant": band_mean(nb.distant.matrix, nb.distant.transposed, h),
        }

    def step(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One synchronous update of every cell; returns the residual update (new state − h) and
        the gate weights."""
        nb = self.bands(h.device)
        inputs = self.expert_inputs(h)
        gates = self.gate_weights(h)
        local = {k.removeprefix("local_"): v for k, v in inputs.items() if k.startswith("local_")}
        update = gates[..., 0:1] * self.local(local, nb.local.mask)
        update = torch.addcmul(update, gates[..., 1:2], self.functional(h, inputs["functional"]))
        update = torch.addcmul(update, gates[..., 2:3], self.distant(h, inputs["distant"]))
        return update, gates

    def forward(self, h: torch.Tensor, steps: int | None = None) -> LatticeOutput:
        """Run ``steps`` (default: the configured number) updates. With ``early_exit_tolerance`` > 0
        it stops after the first step whose RMS state change falls below the tolerance."""
        out = LatticeOutput(state=h, initial=h)
        gate_sum: torch.Tensor | None = None
        tolerance = self.config.early_exit_tolerance
        for _ in range(self.config.steps if steps is None else steps):
            if self.checkpointing and self.training and torch.is_grad_enabled():
                update, gates = self._checkpointed_step(h)
            else:
                update, gates = self.step(h)
            new = h + update
            change = update.float().pow(2).mean()
            out.step_changes.append(change)
            gate_mean = gates.float().mean(dim=(0, 1))
            gate_sum = gate_mean if gate_sum is None else gate_sum + gate_mean
            h = new
            out.steps_run += 1
            if tolerance > 0 and float(change.detach().sqrt()) < tolerance:
                break
        out.state = h
        out.gate_mean = gate_sum / out.steps_run if gate_sum is not None else None
        return out

    def _checkpointed_step(self, h: torch.Tensor) -> Any:
        return checkpoint(self.step, h, use_reentrant=False)
