"""The six cube losses, their weighted total, and the cosine similarity to the teacher.

- reconstruction: MSE between prediction and target.
- similarity: MSE between the batch's cosine-similarity matrices of prediction and target,
  so the geometry of the batch is preserved, not only each row.
- diversity: per feature, how far the batch spread of the prediction falls short of the
  target's (a hinge, zero once predictions are as varied as the targets): stops collapse to
  the mean embedding.
- emergence: a hinge on the lattice's relative total change ‖h_T − h_0‖ / ‖h_0‖ below
  ``EMERGENCE_MARGIN``: the lattice is penalised for degenerating into an identity map.
- dynamics: mean squared change per step, so each step's update stays bounded.
- spatial: mean squared difference between face-adjacent cells of the final state (real 3-D
  neighbours, along x, y and z).

Batch terms (similarity, diversity) are zero for a batch of one.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F  # noqa: N812

from training.cube.kernels import state_regularisers
from training.cube.model import CubeOutput
from training.cube.spec import CubeTrainingSpec
from training.specs import default

LOSS_TERMS = ("reconstruction", "similarity", "diversity", "emergence", "dynamics", "spatial")
SPEC_WEIGHT_FIELDS = {term: f"loss_{term}" for term in LOSS_TERMS}
DEFAULT_WEIGHTS = {term: default(CubeTrainingSpec, field) for term, field in SPEC_WEIGHT_FIELDS.items()}
EMERGENCE_MARGIN = 0.1


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


def spatial_roughness(state: torch.Tensor, edge: int) -> torch.Tensor:
    """Mean squared difference between face-adjacent cells of a ``[S³, B, D]`` state."""
    if edge < 2:
        return state.new_zeros(())
    return state_regularisers(state, state.detach(), edge)[2]


def loss_terms(output: CubeOutput, target: torch.Tensor, edge: int) -> dict[str, torch.Tensor]:
    """Each of the six loss terms, as fp32 scalars."""
    pred = output.prediction.float()
    target = target.float()
    lattice = output.lattice
    zero = pred.new_zeros(())
    batch = pred.shape[0]
    # The mean squares of the change and of the initial state, and the spatial roughness, in one pass.
    change_ms, initial_ms, spatial = state_regularisers(lattice.state, lattice.initial, edge)
    change, scale = change_ms.sqrt(), initial_ms.sqrt().clamp_min(1e-6)
    return {
        "reconstruction": F.mse_loss(pred, target),
        "similarity": F.mse_loss(_cosine_matrix(pred), _cosine_matrix(target)) if batch > 1 else zero,
        "diversity": F.relu(target.std(dim=0) - pred.std(dim=0)).mean() if batch > 1 else zero,
        "emergence": F.relu(EMERGENCE_MARGIN - change / scale),
        "dynamics": torch.stack(lattice.step_changes).mean() if lattice.step_changes else zero,
        "spatial": spatial,
    }


def total_loss(
    output: CubeOutput, target: torch.Tensor, edge: int, weights: Mapping[str, float]
) -> tuple[torch.Tensor, dict[str, float]]:
    """The weighted sum of the six terms, and metrics: each term and the cosine to the teacher."""
    terms = loss_terms(output, target, edge)
    total = sum((weights[name] * value for name, value in terms.items()), start=output.prediction.new_zeros(()).float())
    metrics = {name: float(value.detach()) for name, value in terms.items()}
    metrics["cosine"] = float(F.cosine_similarity(output.prediction.float(), target.float(), dim=-1).mean().detach())
    if output.lattice.gate_mean is not None:
        # How much each expert is used, averaged over cells, batch and steps.
        for name, share in zip(("local", "functional", "distant"), output.lattice.gate_mean.tolist(), strict=True):
            metrics[f"gate_{name}"] = share
    return total, metrics
