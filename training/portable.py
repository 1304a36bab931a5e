"""Initial weights that are the same bits on every machine.

A trained run must start from the untrained model the spec's seed gives, and the platform
checks that by its sha256 (``training.replay.plan_of``, ``workers.verification.base``). So
the seeded initialisation has to give the same bits on the worker's machine, whatever its
CPU, as on the platform's. PyTorch's own initialisers do not: ``uniform_(a, b)`` computes
``u · (b − a) + a``, which its AVX2 and AVX-512 CPU kernels contract into one fused
multiply-add and its baseline kernels do not, and ``normal_`` takes a vectorised
Box–Muller path under AVX2. Under one seed, an ``nn.Linear`` initialised with
``ATEN_CPU_CAPABILITY=default`` (a CPU without AVX2) differs in the low bits from one
initialised with ``avx2``. An ARM node may differ the same way. Such a node would fail
every proof at checkpoint 0 (tests/training/test_portable.py).

``portable_init`` draws every trainable tensor again from integers. ``torch.randint`` on the
CPU generator gives the same integers on every machine. Each weight is an odd integer n in
(−2²⁴, 2²⁴) times ``bound / 2²⁴``, multiplied in float64 and rounded to float32. Both
operations are single, correctly rounded IEEE operations, so they give the same bits
everywhere. The draw is uniform on (−bound, bound), on a grid of 2²⁴ points.

The bounds are PyTorch's defaults: ±1/√fan_in for the weight and bias of ``nn.Linear`` and
of every convolution (``kaiming_uniform_`` with a = √5). A module states its other
parameters' bounds in ``PORTABLE_BOUNDS``. A tensor whose elements are all equal
(LayerNorm's ones, a zero gate; a one-element tensor only when it is 0 or 1) keeps its
value, which is exact already. Any other tensor
is refused: a new layer cannot be initialised in a way that is not portable without this
module saying so.
"""

from __future__ import annotations

import math
from typing import TypeVar

import torch
from torch import nn

# 2²⁴: the draws are the odd integers n in (−GRID, GRID), scaled by bound / GRID.
GRID = 2**24
M = TypeVar("M", bound=nn.Module)


def uniform_bound_std(std: float) -> float:
    """The bound of the uniform draw with standard deviation ``std``: std · √3 (math.sqrt is
    correctly rounded, so this is the same double everywhere)."""
    return std * math.sqrt(3.0)


def _draw(shape: torch.Size, bound: float, generator: torch.Generator) -> torch.Tensor:
    """Uniform on (−bound, bound), the same bits on every machine."""
    k = torch.randint(0, GRID, shape, generator=generator, dtype=torch.int64)
    n = 2 * k + 1 - GRID  # odd, |n| < 2²⁴: exact in float64
    return (n.to(torch.float64) * (bound / GRID)).to(torch.float32)


def _bounds(module: nn.Module) -> dict[str, float]:
    """The bound of each of ``module``'s own parameters that ``portable_init`` draws."""
    bounds: dict[str, float] = dict(getattr(module, "PORTABLE_BOUNDS", {}))
    if isinstance(module, (nn.Linear, nn.modules.conv._ConvNd)):
        fan_in = module.weight[0].numel()
        bound = 1.0 / math.sqrt(fan_in) if fan_in else 0.0
        bounds.setdefault("weight", bound)
        bounds.setdefault("bias", bound)
    return bounds


def _constant(t: torch.Tensor) -> bool:
    """Whether ``t`` is a constant initialisation: all its elements equal, and, for a single
    element (where any draw is "all equal"), 0 or 1."""
    if t.numel() == 0:
        return True
    first = t.reshape(-1)[0]
    if t.numel() == 1:
        return float(first) in (0.0, 1.0)
    return bool((t == first).all())


def portable_init(model: M, seed: int) -> M:
    """Draw ``model``'s parameters again from ``seed``, the same bits on every machine
    (module docstring). ValueError names a parameter or buffer with no portable rule."""
    generator = torch.Generator().manual_seed(int(seed) % 2**63)
    with torch.no_grad():
        for module_name, module in model.named_modules():
            bounds = _bounds(module)
            for name, param in module.named_parameters(recurse=False):
                full = f"{module_name}.{name}" if module_name else name
                if not param.is_floating_point():
                    continue
                if name in bounds:
                    param.copy_(_draw(param.shape, bounds[name], generator))
                elif not _constant(param):
                    raise ValueError(f"{full} has no portable initialisation rule (training.portable).")
            for name, buffer in module.named_buffers(recurse=False):
                persistent = name not in module._non_persistent_buffers_set
                if persistent and buffer.is_floating_point() and not _constant(buffer):
                    full = f"{module_name}.{name}" if module_name else name
                    raise ValueError(f"buffer {full} has no portable initialisation rule (training.portable).")
    return model
