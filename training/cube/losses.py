"""The cube losses, their weighted total, each term's share of it, and the cosine to the teacher.

- reconstruction: MSE between prediction and target: the task.
- similarity: MSE between the batch's cosine-similarity matrices of prediction and target,
  so the geometry of the batch is preserved, not only each row.
- diversity: per feature, how far the batch spread of the prediction falls short of the
  target's (a hinge, zero once predictions are as varied as the targets): stops collapse to
  the mean embedding, the easy minimum of a lattice that has not yet learned to carry the
  input face across.
- balance: top-k gating with two places only (``top_k`` 2): Switch-Transformer load balancing
  between the local and functional experts, which compete for the place the distant expert
  leaves (``training.cube.lattice._balance``), so neither is dead; zero otherwise.

Three earlier terms are gone. The emergence hinge on the lattice's total relative change was
zero from the first step to the last (any working lattice moves more than its margin), and
the model now needs no such guard: the output face starts from a state of its position alone,
so a prediction can depend on the input only through the lattice. The per-step change
(dynamics) and the spatial roughness of the final state weighed at most 2·10⁻⁴ of the total
at their default weights, and a weight that made them count would pull against the lattice's
job: carrying a varied signal from cell to cell across the lattice. The mean squared change
per step stays in the metrics (``step_change``).

Batch terms (similarity, diversity) are zero for a batch of one.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F  # noqa: N812

from training.cube.model import CubeOutput
from training.cube.spec import CubeTrainingSpec
from training.specs import default

LOSS_TERMS = ("reconstruction", "similarity", "diversity", "balance")
SPEC_WEIGHT_FIELDS = {term: f"loss_{term}" for term in LOSS_TERMS}
DEFAULT_WEIGHTS = {term: default(CubeTrainingSpec, field) for term, field in SPEC_WEIGHT_FIELDS.items()}


def weights_from_spec(spec: Mapping[str, object]) -> dict[str, float]:
    """Loss weights from a spec's ``loss_<term>`` fields (defaults where absent)."""
    out = {}
    for term in LOSS_TERMS:
        value = spec.get(SPEC_WEIGHT_FIELDS[term], DEFAULT_WEIGHTS[term])
        out[term] = float(value)  # type: ignore[arg-type]
    return out


def _cosine_matrix(x: torch.Tensor) -> torch.Tensor:
    x = F.normalize(x, dim=-1)
    return x @ x.t()


def loss_terms(output: CubeOutput, target: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each loss term, as fp32 scalars."""
    pred = output.prediction.float()
    target = target.float()
    zero = pred.new_zeros(())
    batch = pred.shape[0]
    balance = output.lattice.balance
    return {
        "reconstruction": F.mse_loss(pred, target),
        "similarity": F.mse_loss(_cosine_matrix(pred), _cosine_matrix(target)) if batch > 1 else zero,
        "diversity": F.relu(target.std(dim=0) - pred.std(dim=0)).mean() if batch > 1 else zero,
        "balance": balance.float() if balance is not None else zero,
    }


def total_loss(
    output: CubeOutput, target: torch.Tensor, weights: Mapping[str, float]
) -> tuple[torch.Tensor, dict[str, float]]:
    """The weighted sum of the terms, and metrics: each term, its share of the weighted total
    (``share_<term>``), the mean squared change per lattice step and the cosine to the teacher."""
    terms = loss_terms(output, target)
    weighted = {name: weights[name] * value for name, value in terms.items()}
    total = sum(weighted.values(), start=output.prediction.new_zeros(()).float())
    # Every figure is read back in one transfer: on a GPU each read is a wait for the device.
    with torch.no_grad():
        names = [*terms, *(f"weighted_{n}" for n in weighted), "total"]
        figures = [*terms.values(), *weighted.values(), total]
        changes = output.lattice.step_changes
        if changes:
            names.append("step_change")
            figures.append(torch.stack(changes).mean())
        names.append("cosine")
        figures.append(F.cosine_similarity(output.prediction.float(), target.float(), dim=-1).mean())
        if output.lattice.gate_mean is not None:
            # How much each expert is used, averaged over cells, batch and steps.
            names.extend(f"gate_{name}" for name in ("local", "functional", "distant"))
            figures.extend(output.lattice.gate_mean.float().unbind(0))
        read = dict(zip(names, torch.stack([f.detach().float() for f in figures]).tolist(), strict=True))
    metrics = {name: read[name] for name in terms}
    whole = read["total"]
    for name in weighted:
        metrics[f"share_{name}"] = read[f"weighted_{name}"] / whole if whole > 0 else 0.0
    metrics["step_change"] = read.get("step_change", 0.0)
    metrics["cosine"] = read["cosine"]
    for name in ("local", "functional", "distant"):
        if f"gate_{name}" in read:
            metrics[f"gate_{name}"] = read[f"gate_{name}"]
    return total, metrics
