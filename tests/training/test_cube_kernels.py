"""The cube's hand-written backward passes against numerical gradients, and the fused lattice step
against its experts' modules and against the dense (non-CPU) attention path."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.autograd import gradcheck

from training.cube.config import CubeConfig
from training.cube.fused import DistantUpdate, FunctionalUpdate, LatticeStep, LocalUpdate, StepSpec
from training.cube.kernels import Attention, ShiftAttention, SparseAttention, band_mean
from training.cube.model import CubeModel
from training.cube.neighbours import Band, RowSum, neighbourhood, row_pattern

EDGE, BATCH, D, KD = 3, 2, 4, 2
N, R = EDGE**3, EDGE**3 * BATCH
F64 = torch.float64


def _p(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=F64, requires_grad=True)


def _rate() -> torch.Tensor:
    return (torch.rand(D, dtype=F64) * 0.5 + 0.1).requires_grad_()


def _attentions() -> list[Attention]:
    band = neighbourhood(EDGE).local
    pattern = row_pattern(band, BATCH)
    sample = pattern.sample
    pattern64 = dataclasses.replace(
        pattern,
        score_mask=pattern.score_mask.to(F64),
        sample=torch.sparse_csr_tensor(
            sample.crow_indices(), sample.col_indices(), sample.values().to(F64), sample.shape
        ),
    )
    return [ShiftAttention(band.score_mask.to(F64), band.shifts, 0.7), SparseAttention(pattern64, 0.7)]


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.mark.parametrize("attention", _attentions(), ids=["shift", "sparse"])
def test_local_update_gradients(attention: Attention) -> None:
    def local(*args: torch.Tensor) -> torch.Tensor:
        return LocalUpdate.apply(*args, attention)

    args = (_p(N, BATCH, KD), _p(N, BATCH, KD), _p(N, BATCH, D), _p(N, BATCH, D), _p(D, D), _p(D, D), _p(D))
    assert gradcheck(local, args)


def test_functional_update_gradients() -> None:
    assert gradcheck(FunctionalUpdate.apply, (_p(R, D), _p(R, D), _p(R, 2 * D), _p(3 * D, D), _p(D, D), _p(D)))


def test_distant_update_gradients() -> None:
    def distant(*args: torch.Tensor) -> torch.Tensor:
        return DistantUpdate.apply(*args, 3)

    assert gradcheck(distant, (_p(R, D), _p(R, D), _p(D, D), _p(D), _p(D, D), _rate()))


@pytest.mark.parametrize("top_k", [3, 2, 1])
@pytest.mark.parametrize("attention", _attentions(), ids=["shift", "sparse"])
def test_lattice_step_gradients(attention: Attention, top_k: int) -> None:
    nb = neighbourhood(EDGE)
    means = RowSum(nb.means.indices, nb.means.offsets, nb.means.values.to(F64))
    means_t = RowSum(nb.means_transposed.indices, nb.means_transposed.offsets, nb.means_transposed.values.to(F64))
    spec = StepSpec(KD, top_k, 3, attention, means, means_t)

    def step(*args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        new, change, _ = LatticeStep.apply(spec, *args)
        return new, change

    width = 2 * KD + 3 * D + 3
    args = (
        *(_p(N, BATCH, D), _p(width, D), _p(width), _p(N, 1, 3)),
        *(_p(D, D), _p(D, D), _p(D)),
        *(_p(3 * D, D), _p(D, D), _p(D)),
        *(_p(D, D), _p(D), _p(D, D), _rate()),
    )
    assert gradcheck(step, args)


def _model(gate: str = "soft", edge: int = 4) -> CubeModel:
    torch.manual_seed(0)
    model = CubeModel(CubeConfig(teacher_dim=32, lattice_edge=edge, state_size=8, steps=2, gate=gate))  # type: ignore[arg-type]
    for p in model.lattice.parameters():
        p.data.normal_(0.0, 0.3)
    return model


@pytest.mark.parametrize("gate", ["soft", "topk"])
def test_lattice_step_is_the_gated_sum_of_its_experts(gate: str) -> None:
    """The fused step against the experts' own modules, each run on its own."""
    model = _model(gate)
    lattice = model.lattice
    with torch.no_grad():
        h = model.initial_state(torch.randn(3, 32))
        nb = lattice.bands(h.device)
        gates = lattice.gate_weights(h)
        experts = [
            lattice.local(h, nb.local),
            lattice.functional(h, band_mean(nb.functional.matrix, nb.functional.transposed, h)),
            lattice.distant(h, band_mean(nb.distant.matrix, nb.distant.transposed, h)),
        ]
        expected = h + sum(gates[..., i : i + 1] * e for i, e in enumerate(experts))
        new, change, step_gates = lattice.step(h)
    torch.testing.assert_close(new, expected)
    torch.testing.assert_close(change, (expected - h).pow(2).mean())
    torch.testing.assert_close(step_gates.permute(1, 2, 0), gates)


def test_dense_attention_path_matches_the_sparse_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Off CPU the Local attention reads shifted views instead of sparse patterns: same model."""
    model = _model()
    x = torch.randn(3, 32)
    sparse_out = model(x).prediction
    sparse_grads = torch.autograd.grad(sparse_out.sum(), list(model.parameters()))

    def dense(band: Band, batch: int, device: torch.device) -> Attention:
        return ShiftAttention(band.score_mask, band.shifts, model.lattice.local.key_dim**-0.5)

    monkeypatch.setattr(model.lattice.local, "attention", dense)
    dense_out = model(x).prediction
    dense_grads = torch.autograd.grad(dense_out.sum(), list(model.parameters()))
    torch.testing.assert_close(dense_out, sparse_out)
    for a, b in zip(dense_grads, sparse_grads, strict=True):
        torch.testing.assert_close(a, b)


def test_row_sums_match_the_band_matrices() -> None:
    nb = neighbourhood(5)
    x = torch.randn(125, 7)
    stacked = torch.cat([nb.functional.matrix @ x, nb.distant.matrix @ x])
    torch.testing.assert_close(nb.means(x), stacked)
    y = torch.randn(250, 7)
    expected = nb.functional.matrix.to_dense().t() @ y[:125] + nb.distant.matrix.to_dense().t() @ y[125:]
    torch.testing.assert_close(nb.means_transposed(y), expected)
