"""The cube model's training forward and backward replayed as CUDA graphs.

On a GPU a cube step is thousands of small kernels (at 8³ the GPU is busy a few
milliseconds of a step that takes tens: the rest is Python and kernel launches). Captured
once with ``torch.cuda.make_graphed_callables``, the whole forward pass replays as one graph
and the whole backward pass as another; the loss, the optimizer and the metrics stay eager
around them, so the training loop, the proof-of-training checkpoints and their replays are
unchanged: the graphs run the same kernels on the same inputs.

``CapturedCube`` captures lazily, on the first training call of each input shape (at most
``MAX_GRAPHS``; an epoch's short last batch is the usual second), and runs the model eagerly
wherever a graph would be wrong or is not worth it: off CUDA, in evaluation or without
gradients, with early exit (its step count depends on the data), and under autocast caching.
A capture that fails is logged once and that shape runs eagerly from then on. A node's
operator turns the graphs off with ``PROOFWORK_CUDA_GRAPHS=0`` (docs/provider-node.md).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from training.cube.lattice import LatticeOutput
from training.cube.model import CubeModel, CubeOutput

log = logging.getLogger(__name__)

MAX_GRAPHS = 2


def cuda_graphs_allowed() -> bool:
    """False when the node's operator set ``PROOFWORK_CUDA_GRAPHS=0``."""
    return os.environ.get("PROOFWORK_CUDA_GRAPHS", "1").strip() != "0"


@contextlib.contextmanager
def _uncached_autocast(device: torch.device) -> Iterator[None]:
    """The caller's autocast, with its weight-cast cache off: a graph replays the casts it
    captured, so a cache filled during capture would hand back stale copies of the weights."""
    if not torch.is_autocast_enabled(device.type):
        yield
        return
    dtype = torch.get_autocast_dtype(device.type)
    with torch.autocast(device.type, dtype=dtype, cache_enabled=False):
        yield


class _Flat(nn.Module):
    """``CubeModel`` with tensors out, as a graph needs: prediction, balance (0 when the gate
    has none), the per-step changes and the gate means; the final state without gradient."""

    def __init__(self, model: CubeModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        with _uncached_autocast(x.device):
            out = self.model(x)
        lattice = out.lattice
        balance = lattice.balance if lattice.balance is not None else out.prediction.new_zeros((), dtype=torch.float32)
        changes = torch.stack(lattice.step_changes)
        gate_mean = lattice.gate_mean if lattice.gate_mean is not None else x.new_zeros(3)
        return out.prediction, balance, changes, gate_mean, lattice.state.detach()


def _key(x: torch.Tensor) -> tuple[Any, ...]:
    device = x.device.type
    autocast = torch.is_autocast_enabled(device)
    return (tuple(x.shape), x.dtype, autocast, torch.get_autocast_dtype(device) if autocast else None)


class CapturedCube:
    """Call as ``captured(model, x)`` in place of ``model(x)``: the same ``CubeOutput``,
    from replayed graphs where that is safe (see the module's docstring)."""

    def __init__(self, model: CubeModel, enabled: bool = True) -> None:
        self.model = model
        self.enabled = enabled
        self._flat = _Flat(model)
        self._graphs: dict[tuple[Any, ...], nn.Module | None] = {}
        self.replays = 0

    def usable(self, model: nn.Module, x: torch.Tensor) -> bool:
        """Whether this call may replay a graph."""
        return (
            self.enabled
            and model is self.model
            and x.is_cuda
            and model.training
            and torch.is_grad_enabled()
            and self.model.config.early_exit_tolerance == 0
        )

    def __call__(self, model: nn.Module, x: torch.Tensor) -> CubeOutput:
        if not self.usable(model, x):
            return model(x)
        key = _key(x)
        graphed = self._graphs.get(key, ...)
        if graphed is ...:
            graphed = self._capture(key, x) if len(self._graphs) < MAX_GRAPHS else None
            self._graphs[key] = graphed
        if graphed is None:
            return model(x)
        self.replays += 1
        prediction, balance, changes, gate_mean, state = graphed(x)
        lattice = LatticeOutput(
            state=state,
            initial=state,
            step_changes=list(changes.unbind(0)),
            gate_mean=gate_mean,
            balance=balance if self.model.lattice._top_k == 2 else None,
            steps_run=int(changes.shape[0]),
        )
        return CubeOutput(prediction, lattice)

    def _capture(self, key: tuple[Any, ...], x: torch.Tensor) -> nn.Module | None:
        sample = torch.empty_like(x).copy_(x)
        try:
            graphed: nn.Module = torch.cuda.make_graphed_callables(self._flat, (sample,), allow_unused_input=True)  # type: ignore[assignment]
        except Exception:
            log.warning("cube step: CUDA graph capture failed for %s; running it eagerly", key, exc_info=True)
            return None
        # Warm-up and capture ran the model on the sample: nothing of it reaches the
        # parameters' gradients, which stay as the caller left them.
        return graphed
