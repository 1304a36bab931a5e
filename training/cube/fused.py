"""The lattice step and the experts' updates as autograd functions with hand-written backward passes.

On a small lattice a step's cost is its passes over memory and its number of operations (each
a dispatch, a fresh allocation, an autograd node), not arithmetic: on 8³ a ``[cells·batch,
state]`` tensor is half a megabyte and most of them come back from main memory. The functions
below compute exactly the formulas of ``training.cube.lattice`` (and of the per-cell
``training.cube.reference``), but:

- every linear map of the state is one matmul, with each bias added where its part is first
  used (in a copy that is needed anyway) rather than in a separate pass;
- activations run in place, and the three experts write their outputs into one buffer, so the
  gates' gradients are one product and one sum;
- the backward pass writes the gradient of each part straight into one buffer and
  accumulates the state's gradient in place, where autograd would concatenate, zero-fill and
  add.

``LatticeStep`` is one step of the whole lattice; ``LocalUpdate``, ``FunctionalUpdate`` and
``DistantUpdate`` are the experts on their own (``LocalExpert.forward`` etc.). Both are built
from the same ``*_forward``/``*_backward`` functions. Rows are ``R = cells · batch`` and ``D``
the state size; weights are ``nn.Linear`` layouts (``[out, in]``). Everything runs in fp32:
under autocast the callers cast their inputs up. ``tests/training/test_cube_kernels.py`` checks
every gradient against numerical differentiation (``torch.autograd.gradcheck``) and the fused
step against the experts' modules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch.autograd.function import once_differentiable

from training.cube.kernels import Attention
from training.cube.neighbours import RowSum

Saved = tuple[Any, ...]

# The experts' order in the gate: local, functional, distant.
DISTANT = 2


# --- Local: attention over the band, then an MLP on [state, context] -------------------------


def local_forward(
    query: torch.Tensor,
    keys: torch.Tensor,
    pre: torch.Tensor,
    h: torch.Tensor,
    context_weight: torch.Tensor,
    out_weight: torch.Tensor,
    out_bias: torch.Tensor,
    attention: Attention,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Saved]:
    """``out(gelu(pre + W_c · attention(q, k, h)))``. ``query``/``keys`` ``[N, B, Dk]``, ``h`` ``[N, B, D]``;
    ``pre`` ``[R, D]`` holds the MLP's state half (bias included) and is overwritten."""
    n, b, d = h.shape
    context, weights = attention.forward(query, keys, h)
    context = context.view(n * b, d)
    pre.addmm_(context, context_weight.t())
    activation = F.gelu(pre)
    if out is None:
        out = torch.addmm(out_bias, activation, out_weight.t())
    else:
        torch.addmm(out_bias, activation, out_weight.t(), out=out)
    return out, (query, keys, h, weights, context, pre, activation)


def local_backward(
    grad: torch.Tensor,
    saved: Saved,
    context_weight: torch.Tensor,
    out_weight: torch.Tensor,
    attention: Attention,
    grad_pre: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    """Gradients of ``local_forward`` for query, keys, pre, h (through the attention's values),
    W_c, W_out and b_out. ``grad_pre``: where to write pre's gradient."""
    query, keys, h, weights, context, pre, activation = saved
    grad_activation = grad @ out_weight
    if grad_pre is None:
        grad_pre = torch.ops.aten.gelu_backward(grad_activation, pre)
    else:
        torch.ops.aten.gelu_backward.grad_input(grad_activation, pre, grad_input=grad_pre)
    grad_context = torch.mm(grad_pre, context_weight, out=grad_activation).view(h.shape)
    grad_query, grad_keys, grad_h = attention.backward(grad_context, query, keys, h, weights)
    return (
        grad_query,
        grad_keys,
        grad_pre,
        grad_h,
        grad_pre.t() @ context,
        grad.t() @ activation,
        grad.sum(dim=0),
    )


# --- Functional: GRU-style update from the band mean -----------------------------------------


def functional_forward(
    x: torch.Tensor,
    message: torch.Tensor,
    zr: torch.Tensor,
    message_weight: torch.Tensor,
    state_weight: torch.Tensor,
    state_bias: torch.Tensor,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Saved]:
    """z·(h̃ − x), with [z, r] = σ(zr + W_g m) and h̃ = tanh(W_s (r ⊙ x) + b_s + W_c m). ``x``,
    ``message`` ``[R, D]``; ``zr`` ``[R, 2D]`` holds the state's gate term (bias included) and is
    overwritten with [z, r]; ``message_weight`` is ``[W_g; W_c]``, ``[3D, D]``."""
    d = x.shape[1]
    gate_weight, candidate_weight = message_weight[: 2 * d], message_weight[2 * d :]
    zr.addmm_(message, gate_weight.t()).sigmoid_()
    z, r = zr[:, :d], zr[:, d:]
    reset = r * x
    candidate = torch.addmm(state_bias, message, candidate_weight.t()).addmm_(reset, state_weight.t()).tanh_()
    diff = candidate - x
    out = torch.mul(z, diff, out=out) if out is not None else z * diff
    return out, (x, message, zr, reset, candidate, diff)


def functional_backward(
    grad: torch.Tensor,
    saved: Saved,
    message_weight: torch.Tensor,
    state_weight: torch.Tensor,
    grad_zr: torch.Tensor | None = None,
    grad_message: torch.Tensor | None = None,
    grad_x: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    """Gradients of ``functional_forward`` for x, message, zr, the message weight, W_s and b_s.
    ``grad_zr``/``grad_message``: where to write those; ``grad_x``: a tensor to add x's gradient to."""
    x, message, zr, reset, candidate, diff = saved
    d = x.shape[1]
    gate_weight, candidate_weight = message_weight[: 2 * d], message_weight[2 * d :]
    z, r = zr[:, :d], zr[:, d:]
    grad_gates = torch.empty_like(zr, memory_format=torch.contiguous_format)  # of [z, r], before the sigmoid
    torch.mul(grad, diff, out=grad_gates[:, :d])
    grad_candidate = grad * z
    # x enters directly (z·(h̃ − x)) and through the reset (r ⊙ x).
    if grad_x is None:
        grad_x = grad_candidate.neg()
    else:
        grad_x.sub_(grad_candidate)
    grad_candidate_pre = torch.ops.aten.tanh_backward.grad_input(grad_candidate, candidate, grad_input=grad_candidate)
    grad_reset = grad_candidate_pre @ state_weight
    torch.mul(grad_reset, x, out=grad_gates[:, d:])
    grad_x.addcmul_(grad_reset, r)
    if grad_zr is None:
        grad_zr = torch.ops.aten.sigmoid_backward(grad_gates, zr)
    else:
        torch.ops.aten.sigmoid_backward.grad_input(grad_gates, zr, grad_input=grad_zr)
    if grad_message is None:
        grad_message = grad_zr @ gate_weight
    else:
        torch.mm(grad_zr, gate_weight, out=grad_message)
    grad_message.addmm_(grad_candidate_pre, candidate_weight)
    return (
        grad_x,
        grad_message,
        grad_zr,
        torch.cat([grad_zr.t() @ message, grad_candidate_pre.t() @ message]),
        grad_candidate_pre.t() @ reset,
        grad_candidate_pre.sum(dim=0),
    )


# --- Distant: Euler steps of a continuous-time cell ------------------------------------------


def distant_forward(
    x: torch.Tensor,
    message: torch.Tensor,
    input_weight: torch.Tensor,
    input_bias: torch.Tensor,
    recurrent_weight: torch.Tensor,
    rate: torch.Tensor,
    steps: int,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Saved]:
    """``steps`` Euler steps of x ← x + rate ⊙ (tanh(W_r x + W_i m + b_i) − x) from ``x``; returns the
    change. ``x``, ``message`` ``[R, D]``, ``rate`` ``[D]``."""
    drive = torch.addmm(input_bias, message, input_weight.t())
    states, targets = [x], []
    for i in range(steps):
        targets.append(torch.addmm(drive, states[-1], recurrent_weight.t()).tanh_())
        # The last step goes straight into ``out`` and becomes the change there.
        states.append(torch.lerp(states[-1], targets[-1], rate, out=out if i == steps - 1 else None))
    return states[-1].sub_(x), (message, states[:-1], targets)


def distant_backward(
    grad: torch.Tensor,
    saved: Saved,
    input_weight: torch.Tensor,
    recurrent_weight: torch.Tensor,
    rate: torch.Tensor,
    grad_message: torch.Tensor | None = None,
    grad_x: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    """Gradients of ``distant_forward`` for x, message, W_i, b_i, W_r and rate. ``grad_message``:
    where to write the message's gradient; ``grad_x``: a tensor to add x's gradient to."""
    message, states, targets = saved
    # With g the gradient of an Euler step's output, its pre-activation's gradient is
    # rate ⊙ g ⊙ (1 − t²): rate scales columns, so it is applied to the small weights instead.
    rate_rows = rate[:, None]
    scaled_recurrent = recurrent_weight * rate_rows
    keep = 1.0 - rate
    grad_rate = torch.zeros_like(grad, memory_format=torch.contiguous_format)
    grad_recurrent = torch.zeros_like(recurrent_weight)
    # Scratch buffers reused across the Euler steps, which stay in cache.
    scratch, states_grad = torch.empty_like(grad_rate), (torch.empty_like(grad_rate), torch.empty_like(grad_rate))
    grad_state, grad_drive = grad, None
    for i, (previous, target) in enumerate(zip(reversed(states), reversed(targets), strict=True)):
        grad_rate.addcmul_(grad_state, torch.sub(target, previous, out=scratch))
        if grad_drive is None:
            grad_pre = grad_drive = torch.ops.aten.tanh_backward(grad_state, target)  # ÷ rate
        else:
            grad_pre = torch.ops.aten.tanh_backward.grad_input(grad_state, target, grad_input=scratch)
            grad_drive.add_(grad_pre)
        grad_recurrent.addmm_(grad_pre.t(), previous)
        grad_state = torch.mul(grad_state, keep, out=states_grad[i % 2]).addmm_(grad_pre, scaled_recurrent)
    assert grad_drive is not None  # steps ≥ 1
    if grad_message is None:
        grad_message = grad_drive @ (input_weight * rate_rows)
    else:
        torch.mm(grad_drive, input_weight * rate_rows, out=grad_message)
    if grad_x is None:
        grad_x = grad_state.sub(grad)
    else:
        grad_x.add_(grad_state).sub_(grad)
    return (
        grad_x,
        grad_message,
        (grad_drive.t() @ message).mul_(rate_rows),
        grad_drive.sum(dim=0).mul_(rate),
        grad_recurrent.mul_(rate_rows),
        grad_rate.sum(dim=0),
    )


# --- The experts on their own ----------------------------------------------------------------


class LocalUpdate(torch.autograd.Function):
    """``local_forward``: q, k, hidden ``[N, B, ·]``, h ``[N, B, D]`` → ``[R, D]``."""

    @staticmethod
    def forward(
        ctx: Any,
        query: torch.Tensor,
        keys: torch.Tensor,
        hidden: torch.Tensor,
        h: torch.Tensor,
        context_weight: torch.Tensor,
        out_weight: torch.Tensor,
        out_bias: torch.Tensor,
        attention: Attention,
    ) -> torch.Tensor:
        pre = hidden.reshape(-1, h.shape[-1]).clone()
        out, saved = local_forward(query, keys, pre, h, context_weight, out_weight, out_bias, attention)
        ctx.save_for_backward(*saved, context_weight, out_weight)
        ctx.attention = attention
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        *saved, context_weight, out_weight = ctx.saved_tensors
        grads = local_backward(grad.contiguous(), tuple(saved), context_weight, out_weight, ctx.attention)
        query, keys, grad_pre, *rest = grads
        return (query, keys, grad_pre.view(saved[2].shape), *rest, None)


class FunctionalUpdate(torch.autograd.Function):
    """``functional_forward``: x, message ``[R, D]``, gates_h ``[R, 2D]`` → ``[R, D]``."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        message: torch.Tensor,
        gates_h: torch.Tensor,
        message_weight: torch.Tensor,
        state_weight: torch.Tensor,
        state_bias: torch.Tensor,
    ) -> torch.Tensor:
        out, saved = functional_forward(x, message, gates_h.clone(), message_weight, state_weight, state_bias)
        ctx.save_for_backward(*saved, message_weight, state_weight)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
        *saved, message_weight, state_weight = ctx.saved_tensors
        return functional_backward(grad.contiguous(), tuple(saved), message_weight, state_weight)


class DistantUpdate(torch.autograd.Function):
    """``distant_forward``: x, message ``[R, D]``, rate ``[D]`` → ``[R, D]``."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        message: torch.Tensor,
        input_weight: torch.Tensor,
        input_bias: torch.Tensor,
        recurrent_weight: torch.Tensor,
        rate: torch.Tensor,
        steps: int,
    ) -> torch.Tensor:
        out, (message, states, targets) = distant_forward(
            x, message, input_weight, input_bias, recurrent_weight, rate, steps
        )
        ctx.save_for_backward(message, input_weight, recurrent_weight, rate, *states, *targets)
        ctx.steps = steps
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        message, input_weight, recurrent_weight, rate, *rest = ctx.saved_tensors
        saved = (message, rest[: ctx.steps], rest[ctx.steps :])
        return (*distant_backward(grad.contiguous(), saved, input_weight, recurrent_weight, rate), None)


# --- One step of the whole lattice -----------------------------------------------------------


@dataclass(frozen=True)
class StepSpec:
    """What a lattice step needs besides tensors."""

    key_dim: int
    top_k: int  # 3: a soft gate over all experts
    euler_steps: int
    attention: Attention
    means: RowSum  # the functional band's mean stacked on the distant band's, [2N, N]
    means_transposed: RowSum


class LatticeStep(torch.autograd.Function):
    """h ← h + Σₑ gₑ · expertₑ(h): returns the new state ``[N, B, D]``, the mean squared update (a
    scalar) and the gate weights ``[3, N, B]`` (not differentiable).

    ``projection_weight``/``projection_bias`` stack the Local projection (query, key, MLP state
    half), the gate and the Functional gates' state term, ``[2Dk + D + 3 + 2D, D]``; ``cell_gate``
    is ``[N, 1, 3]``.
    """

    @staticmethod
    def forward(
        ctx: Any,
        spec: StepSpec,
        h: torch.Tensor,
        projection_weight: torch.Tensor,
        projection_bias: torch.Tensor,
        cell_gate: torch.Tensor,
        context_weight: torch.Tensor,
        out_weight: torch.Tensor,
        out_bias: torch.Tensor,
        message_weight: torch.Tensor,
        state_weight: torch.Tensor,
        state_bias: torch.Tensor,
        input_weight: torch.Tensor,
        input_bias: torch.Tensor,
        recurrent_weight: torch.Tensor,
        rate: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n, b, d = h.shape
        rows, kd = n * b, spec.key_dim
        q_, k_, h_, g_, z_ = _parts(kd, d)
        x = h.reshape(rows, d)
        # Every linear map of the state in one matmul. Each bias joins its part where that part is
        # first used: q and k in contiguous copies, the MLP's and the gates' parts in place.
        projected = torch.mm(x, projection_weight.t())
        query = torch.add(projected[:, q_], projection_bias[q_]).view(n, b, kd)
        keys = torch.add(projected[:, k_], projection_bias[k_]).view(n, b, kd)
        pre = projected[:, h_].add_(projection_bias[h_])
        zr = projected[:, z_].add_(projection_bias[z_])
        gates = gate_weights(projected[:, g_], projection_bias[g_], cell_gate, n, b, spec.top_k)
        messages = spec.means(x.view(n, b * d))  # [2N, B·D]
        experts = torch.empty(3, rows, d, dtype=h.dtype, device=h.device)  # local, functional, distant
        _, saved_local = local_forward(
            query, keys, pre, h, context_weight, out_weight, out_bias, spec.attention, out=experts[0]
        )
        _, saved_functional = functional_forward(
            x, messages[:n].view(rows, d), zr, message_weight, state_weight, state_bias, out=experts[1]
        )
        _, saved_distant = distant_forward(
            x,
            messages[n:].view(rows, d),
            input_weight,
            input_bias,
            recurrent_weight,
            rate,
            spec.euler_steps,
            out=experts[2],
        )
        mix = gates.view(3, rows, 1)
        update = torch.mul(experts[0], mix[0]).addcmul_(experts[1], mix[1]).addcmul_(experts[2], mix[2])
        change = torch.dot(update.view(-1), update.view(-1)) / update.numel()
        ctx.save_for_backward(
            *saved_local,
            *saved_functional,
            saved_distant[0],
            *saved_distant[1],
            *saved_distant[2],
            experts,
            gates,
            update,
            projection_weight,
            context_weight,
            out_weight,
            message_weight,
            state_weight,
            input_weight,
            recurrent_weight,
            rate,
        )
        ctx.spec = spec
        ctx.mark_non_differentiable(gates)
        return (x + update).view(n, b, d), change, gates

    @staticmethod
    @once_differentiable
    def backward(
        ctx: Any, grad_state: torch.Tensor, grad_change: torch.Tensor, _: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        spec: StepSpec = ctx.spec
        saved = list(ctx.saved_tensors)
        saved_local, saved_functional = tuple(saved[:7]), tuple(saved[7:13])
        e = spec.euler_steps
        saved_distant = (saved[13], saved[14 : 14 + e], saved[14 + e : 14 + 2 * e])
        (
            experts,
            gates,
            update,
            projection_weight,
            context_weight,
            out_weight,
            message_weight,
            state_weight,
            input_weight,
            recurrent_weight,
            rate,
        ) = saved[14 + 2 * e :]
        x = saved_functional[0]
        rows, d = x.shape
        n, b = gates.shape[1], gates.shape[2]
        q_, k_, h_, g_, z_ = _parts(spec.key_dim, d)

        grad_new = grad_state.reshape(rows, d)
        grad_update = torch.addcmul(grad_new, update, grad_change * (2.0 / update.numel()))
        # The mixture: each gate's gradient is a dot with its expert's output.
        mix = gates.view(3, rows, 1)
        grad_gates = torch.linalg.vecdot(experts, grad_update).view(3, n, b)
        grad_logits = gates * (grad_gates - (gates * grad_gates).sum(dim=0, keepdim=True))

        grad_projected = torch.empty(rows, projection_weight.shape[0], dtype=x.dtype, device=x.device)
        grad_projected[:, g_] = grad_logits.view(3, rows).t()
        grad_messages = torch.empty(2 * n, b * d, dtype=x.dtype, device=x.device)
        grad_query, grad_keys, _, grad_values, *grad_local_params = local_backward(
            grad_update * mix[0],
            saved_local,
            context_weight,
            out_weight,
            spec.attention,
            grad_pre=grad_projected[:, h_],
        )
        grad_projected[:, q_] = grad_query.view(rows, -1)
        grad_projected[:, k_] = grad_keys.view(rows, -1)
        grad_x = torch.add(grad_new, grad_values.view(rows, d))
        _, _, _, *grad_functional_params = functional_backward(
            grad_update * mix[1],
            saved_functional,
            message_weight,
            state_weight,
            grad_zr=grad_projected[:, z_],
            grad_message=grad_messages[:n].view(rows, d),
            grad_x=grad_x,
        )
        _, _, *grad_distant_params = distant_backward(
            grad_update * mix[2],
            saved_distant,
            input_weight,
            recurrent_weight,
            rate,
            grad_message=grad_messages[n:].view(rows, d),
            grad_x=grad_x,
        )
        grad_x.add_(spec.means_transposed(grad_messages).view(rows, d))
        grad_x.addmm_(grad_projected, projection_weight)
        return (
            None,
            grad_x.view(n, b, d),
            grad_projected.t() @ x,
            grad_projected.sum(dim=0),
            grad_logits.sum(dim=2).t().unsqueeze(1),
            *grad_local_params,
            *grad_functional_params,
            *grad_distant_params,
        )


def _parts(key_dim: int, d: int) -> tuple[slice, slice, slice, slice, slice]:
    """Column ranges of the stacked state projection: query, key, MLP state half, gate, Functional gates."""
    ends = [key_dim, 2 * key_dim, 2 * key_dim + d, 2 * key_dim + d + 3, 2 * key_dim + 3 * d + 3]
    starts = [0, *ends[:-1]]
    q, k, h, g, z = (slice(s, e) for s, e in zip(starts, ends, strict=True))
    return q, k, h, g, z


def gate_weights(
    logits: torch.Tensor, bias: torch.Tensor, cell_gate: torch.Tensor, n: int, b: int, top_k: int
) -> torch.Tensor:
    """Softmax (over the top-k when ``top_k`` < 3) of the state's ``[R, 3]`` logits plus the bias and
    the per-cell term, laid out ``[3, N, B]``: a softmax over a leading dimension is vectorised,
    over a trailing dimension of 3 it is not. The top-k always keep the distant expert: its band
    carries the input face across the lattice (``training.cube.neighbours``, rule 3); the
    others compete for the remaining ``top_k − 1`` places."""
    total = (logits.t().reshape(3, n, b) + (cell_gate.permute(2, 0, 1) + bias[:, None, None])).contiguous()
    if top_k < 3:
        ranked = total.clone()
        ranked[DISTANT] = float("inf")
        kth = ranked.topk(top_k, dim=0).values[-1:]
        total = total.masked_fill(ranked < kth, float("-inf"))
    return total.softmax(dim=0)
