"""The lattice's neighbour operations, with hand-written backward passes.

- ``band_mean``: the mean of each cell's valid neighbours, one embedding-bag row sum over the
  ``[N, B·D]`` view of the state, with the transposed matrix precomputed for backward.
- ``attention_forward``/``attention_backward``: each cell's softmax attention over its band
  (used by the Local expert's fused update, ``training.cube.fused``). A neighbour offset is a
  constant distance in row numbers (``dz·S² + dy·S + dx``), so the neighbours of a range of
  cells are a shifted range of rows: the attention reads them as views, one offset at a time,
  and never materialises ``[N, K, B, D]`` gathered copies. Offsets that cross a wall land on
  a wrong row or outside ``[0, N)``; the band's score mask gives them weight zero.

Each is exactly the formula it replaces (of the per-cell reference, ``training.cube.reference``);
the hand-written backward passes only avoid passes over memory and the large temporaries
autograd would keep.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable

from training.cube.neighbours import RowPattern, RowSum


class _SparseMean(torch.autograd.Function):
    """``A @ X`` whose backward is ``Aᵀ @ grad`` with a precomputed ``Aᵀ``."""

    @staticmethod
    def forward(ctx: Any, matrix: RowSum, transposed: RowSum, x: torch.Tensor) -> torch.Tensor:
        ctx.transposed = transposed
        return matrix(x)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None, torch.Tensor]:
        return None, None, ctx.transposed(grad.contiguous())


def band_mean(matrix: RowSum | torch.Tensor, transposed: RowSum | torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """``matrix`` ``[M, N]`` (row-normalised; a ``RowSum`` or a sparse CSR tensor) applied to ``h``
    ``[N, B, D]``: ``[M, B, D]``, computed in fp32."""
    n, b, d = h.shape
    if not isinstance(matrix, RowSum):
        matrix = RowSum.from_csr(matrix)
    if not isinstance(transposed, RowSum):
        transposed = RowSum.from_csr(transposed)
    with torch.autocast(h.device.type, enabled=False):
        out = _SparseMean.apply(matrix, transposed, h.reshape(n, b * d).float())
    return out.reshape(matrix.offsets.shape[0], b, d).to(h.dtype)


def _rows(shift: int, n: int) -> tuple[slice, slice]:
    """The cells whose neighbour ``shift`` rows away is a row of the state, and those rows."""
    if shift >= 0:
        return slice(0, n - shift), slice(shift, n)
    return slice(-shift, n), slice(0, n + shift)


def _row_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a * b).sum(dim=-1)


class ShiftAttention:
    """Softmax attention of every cell over one band, reading each offset's neighbours as a
    shifted row range of the state: dense operations only, one offset at a time.

    The scores are ``scale · q_n · k_{n+s}`` plus the band's mask; weights and scores are laid
    out ``[K, N, B]`` (a softmax over a leading dimension is vectorised; one over a short
    trailing dimension is not: ten times slower at K = 6).
    """

    def __init__(self, score_mask: torch.Tensor, shifts: tuple[int, ...], scale: float) -> None:
        self.score_mask, self.shifts, self.scale = score_mask, shifts, scale

    def forward(
        self, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``query``/``keys`` ``[N, B, Dk]``, ``values`` ``[N, B, D]`` → context ``[N, B, D]`` and weights."""
        n = query.shape[0]
        scores = self.score_mask.expand(-1, -1, query.shape[1]).clone()  # [K, N, B]
        for j, shift in enumerate(self.shifts):
            cells, neighbours = _rows(shift, n)
            scores[j, cells] += _row_dot(query[cells], keys[neighbours])
        weights = scores.mul_(self.scale).softmax(dim=0)
        out = torch.zeros_like(values)
        for j, shift in enumerate(self.shifts):
            cells, neighbours = _rows(shift, n)
            out[cells].addcmul_(weights[j, cells].unsqueeze(-1), values[neighbours])
        return out, weights

    def backward(
        self, grad: torch.Tensor, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, weights: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Gradients of the context with respect to query, keys and values."""
        n = query.shape[0]
        # Masked neighbours have weight 0, so their (meaningless) entries drop out below.
        grad_weights = torch.zeros_like(weights)
        for j, shift in enumerate(self.shifts):
            cells, neighbours = _rows(shift, n)
            grad_weights[j, cells] = _row_dot(grad[cells], values[neighbours])
        grad_scores = weights * (grad_weights - (weights * grad_weights).sum(dim=0, keepdim=True))
        grad_scores.mul_(self.scale)
        grad_query, grad_keys, grad_values = torch.zeros_like(query), torch.zeros_like(keys), torch.zeros_like(values)
        for j, shift in enumerate(self.shifts):
            cells, neighbours = _rows(shift, n)
            g = grad_scores[j, cells].unsqueeze(-1)
            grad_query[cells].addcmul_(g, keys[neighbours])
            grad_keys[neighbours].addcmul_(g, query[cells])
            grad_values[neighbours].addcmul_(weights[j, cells].unsqueeze(-1), grad[cells])
        return grad_query, grad_keys, grad_values


class SparseAttention:
    """The same attention as three sparse operations over rows ``r = cell·B + b``: the scores are a
    sampled matmul ``q kᵀ`` on the band's row pattern, the context an embedding-bag row sum with
    the weights. A dozen operations a step instead of ``ShiftAttention``'s hundreds: the CPU path.
    """

    def __init__(self, pattern: RowPattern, scale: float) -> None:
        self.pattern, self.scale = pattern, scale

    def forward(
        self, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``query``/``keys`` ``[N, B, Dk]``, ``values`` ``[N, B, D]`` → context ``[N, B, D]`` and weights ``[K, R]``."""
        rows, k = values.shape[0] * values.shape[1], self.pattern.score_mask.shape[0]
        q, kk, v = query.reshape(rows, -1), keys.reshape(rows, -1), values.reshape(rows, -1)
        dots = torch.sparse.sampled_addmm(self.pattern.sample, q, kk.t(), beta=0.0).values()
        weights = torch.add(self.pattern.score_mask, dots.view(rows, k).t(), alpha=self.scale).softmax(dim=0)
        context = self.pattern.apply(weights.t().reshape(-1), v)
        return context.view(values.shape), weights

    def backward(
        self, grad: torch.Tensor, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, weights: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Gradients of the context with respect to query, keys and values."""
        rows, k = values.shape[0] * values.shape[1], weights.shape[0]
        q, kk, v, g = query.reshape(rows, -1), keys.reshape(rows, -1), values.reshape(rows, -1), grad.reshape(rows, -1)
        grad_weights = torch.sparse.sampled_addmm(self.pattern.sample, g, v.t(), beta=0.0).values().view(rows, k).t()
        grad_scores = weights * (grad_weights - (weights * grad_weights).sum(dim=0, keepdim=True))
        grad_scores = grad_scores.mul_(self.scale).t().reshape(-1)
        return (
            self.pattern.apply(grad_scores, kk).view(query.shape),
            self.pattern.apply_transposed(grad_scores, q).view(keys.shape),
            self.pattern.apply_transposed(weights.t().reshape(-1), g).view(values.shape),
        )


Attention = ShiftAttention | SparseAttention
