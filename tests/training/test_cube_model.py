"""The cube model: shapes, neighbour bands, experts' inputs, gradients, and real lattice dynamics."""

from __future__ import annotations

import pytest
import torch

from training.cube.config import CubeConfig, CubeConfigError, check_capacity, estimate_training_bytes
from training.cube.losses import DEFAULT_WEIGHTS, LOSS_TERMS, total_loss
from training.cube.model import CubeModel
from training.cube.neighbours import band_offsets, neighbourhood
from training.cube.reference import reference_forward


def _model(edge: int = 4, teacher_dim: int = 32, state: int = 8, steps: int = 3, **kw: object) -> CubeModel:
    torch.manual_seed(0)
    return CubeModel(CubeConfig(teacher_dim=teacher_dim, lattice_edge=edge, state_size=state, steps=steps, **kw))  # type: ignore[arg-type]


def test_shapes_and_faces() -> None:
    model = _model(edge=5, teacher_dim=48, state=6)
    x = torch.randn(3, 48)
    out = model(x)
    assert out.prediction.shape == (3, 48)
    assert out.lattice.state.shape == (125, 3, 6)
    assert out.lattice.steps_run == 3
    # The input face (z = 0, the first 25 cells) holds the mapper's per-cell states, one surface value each.
    face = model.mapper(model.transformer.encode(x))
    assert face.shape == (25, 3, 6)
    torch.testing.assert_close(out.lattice.initial[:25], face)
    # Each face cell carries its own surface value, not one vector copied everywhere.
    assert torch.unique(face[:, 0, 0]).numel() == 25
    # Every other cell starts from its position alone: the same for any input.
    other = model(torch.randn(3, 48) * 5).lattice.initial
    torch.testing.assert_close(other[25:], out.lattice.initial[25:])
    assert torch.unique(out.lattice.initial[25:, 0, 0]).numel() == 100


def test_band_rule_on_documented_sizes() -> None:
    root = pytest.approx
    # 8³: r = 4. local (0, 0.16] is empty and borrows |o| = 1; functional (0.16, 1.12] holds only
    # |o| = 1, taken, and borrows √2; distant (1.12, 4] takes its outermost shells that fit 48
    # offsets (4, √13, √12, 2) and the face shell.
    assert band_offsets(8) == [
        ("local", True, [1.0]),
        ("functional", True, [root(2**0.5)]),
        ("distant", False, [1.0, 2.0, root(12**0.5), root(13**0.5), 4.0]),
    ]
    # 16³: r = 8; functional (0.32, 2.24] holds √2, √3, √5 once |o| = 1 is local's.
    (local, functional, distant) = band_offsets(16)
    assert local == ("local", True, [1.0])
    assert functional[2] == root([2**0.5, 3**0.5, 5**0.5])
    assert distant[2][0] == 1.0
    assert distant[2][-1] == 8.0
    # On a 2³ lattice every range is empty: each band borrows the nearest shell left.
    assert band_offsets(2) == [
        ("local", True, [1.0]),
        ("functional", True, [root(2**0.5)]),
        ("distant", True, [1.0, root(3**0.5)]),
    ]


@pytest.mark.parametrize("edge", range(2, 65))
def test_bands_are_distinct_at_every_size(edge: int) -> None:
    local, functional, distant = (set(shells) for _, _, shells in band_offsets(edge))
    assert local.isdisjoint(functional)
    # The distant band shares only the face shell (rule 3).
    assert (local | functional) & distant <= {1.0}


@pytest.mark.parametrize("edge", [2, 3, 5, 8, 13, 16, 23])
def test_every_cell_has_a_neighbour_in_every_band(edge: int) -> None:
    nb = neighbourhood(edge)
    for band in nb.bands:
        assert band.mask.any(dim=1).all(), band.name
        offsets = {tuple(o) for o in band.offsets.tolist()}
        # Whole shells: closed under sign flips, so no direction is favoured.
        assert offsets == {(-a, -b, -c) for a, b, c in offsets}
        # At most max_neighbours of its own shells; the distant band adds the 6 face neighbours.
        assert len(offsets) <= 48 + (6 if band.name == "distant" else 0)
        assert all(max(abs(c) for c in o) < edge for o in offsets)
        # Rows of the band-mean matrix average over exactly the valid neighbours.
        row_sums = band.matrix @ torch.ones(edge**3, 1)
        torch.testing.assert_close(row_sums.squeeze(1), torch.ones(edge**3))
        assert (band.matrix.crow_indices().diff() == band.mask.sum(dim=1)).all()


def test_neighbourhood_is_built_once_per_shape() -> None:
    assert neighbourhood(7) is neighbourhood(7)
    assert neighbourhood(7) is not neighbourhood(6)


@pytest.mark.parametrize("edge", [8, 16])
def test_every_expert_receives_non_zero_input(edge: int) -> None:
    model = _model(edge=edge, teacher_dim=32, state=8)
    h = model.initial_state(torch.randn(2, 32))
    with torch.no_grad():
        inputs = model.lattice.expert_inputs(h)
    mask = model.lattice.bands(h.device).local.mask
    local = (inputs["local_keys"].abs().sum(dim=(2, 3)) * mask).sum(dim=1)
    assert (local > 0).all()
    for name in ("functional", "distant"):
        assert (inputs[name].abs().sum(dim=(1, 2)) > 0).all(), name
    # The functional input of the corner cell is the mean of its in-lattice neighbours.
    band = model.lattice.bands(h.device).functional
    members = band.index[0][band.mask[0]]
    torch.testing.assert_close(inputs["functional"][0], h[members].mean(dim=0))


def test_gradients_reach_every_parameter() -> None:
    model = _model(edge=4, steps=2)
    x = torch.randn(4, 32)
    loss, metrics = total_loss(model(x), x, DEFAULT_WEIGHTS)
    loss.backward()
    assert set(LOSS_TERMS) <= set(metrics)
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert missing == []


def test_lattice_is_not_an_identity() -> None:
    model = _model(edge=4, steps=3)
    x = torch.randn(2, 32)
    with torch.no_grad():
        base = model(x).prediction
        # The number of steps matters.
        assert not torch.allclose(model(x, steps=1).prediction, base, atol=1e-5)
        assert not torch.allclose(model(x, steps=0).prediction, base, atol=1e-5)
        # Every expert's weights matter.
        for module in (model.lattice.local.out, model.lattice.functional.candidate_state, model.lattice.distant.rec):
            saved = module.weight.clone()
            module.weight.add_(0.5 * torch.randn_like(saved))
            changed = model(x).prediction
            module.weight.copy_(saved)
            assert not torch.allclose(changed, base, atol=1e-5), module
        # The state actually moves.
        out = model(x)
        assert (out.lattice.state - out.lattice.initial).abs().mean() > 1e-3


@pytest.mark.parametrize(("gate", "top_k"), [("soft", 2), ("topk", 2), ("topk", 1)])
def test_vectorized_step_matches_the_per_cell_loop(gate: str, top_k: int) -> None:
    model = _model(edge=3, steps=2, gate=gate, top_k=top_k)
    for p in model.lattice.parameters():
        p.data.normal_(0.0, 0.3)
    x = torch.randn(2, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x).prediction, reference_forward(model, x).prediction, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("top_k", [1, 2])
def test_topk_gate_keeps_k_experts_per_cell_the_distant_one_always(top_k: int) -> None:
    model = _model(edge=4, gate="topk", top_k=top_k)
    with torch.no_grad():
        model.lattice.gate.bias.copy_(torch.tensor([5.0, 5.0, -5.0]))  # the router dislikes distant
    h = model.initial_state(torch.randn(2, 32))
    gates = model.lattice.gate_weights(h)
    assert ((gates > 0).sum(dim=-1) == top_k).all()
    assert (gates[..., 2] > 0).all()
    torch.testing.assert_close(gates.sum(dim=-1), torch.ones(64, 2))


def test_early_exit_stops_when_converged() -> None:
    model = _model(edge=4, steps=6, early_exit_tolerance=1.0)
    assert model(torch.randn(2, 32)).lattice.steps_run == 1
    assert _model(edge=4, steps=6).forward(torch.randn(2, 32)).lattice.steps_run == 6


def test_activation_checkpointing_gives_the_same_gradients() -> None:
    x = torch.randn(2, 32)
    grads = []
    for flag in (False, True):
        model = _model(edge=4, steps=2, activation_checkpointing=flag)
        model.set_batch_size(2)
        assert model.lattice.checkpointing is flag
        total_loss(model(x), x, DEFAULT_WEIGHTS)[0].backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    torch.testing.assert_close(grads[0], grads[1])


@pytest.mark.parametrize(("edge", "ok"), [(1, False), (2, True), (64, True), (65, False)])
def test_lattice_edge_bounds(edge: int, ok: bool) -> None:
    if ok:
        CubeConfig(lattice_edge=edge)
    else:
        with pytest.raises(CubeConfigError, match="lattice_edge must be between 2 and 64"):
            CubeConfig(lattice_edge=edge)


def test_memory_estimate_above_capacity_is_refused() -> None:
    config = CubeConfig(lattice_edge=37)
    need = estimate_training_bytes(config, batch_size=8)
    assert 2**28 < need < 8 * 2**30
    assert check_capacity(config, 8, capacity_bytes=need) == need
    with pytest.raises(CubeConfigError, match="exceeds the worker's capacity"):
        check_capacity(config, 8, capacity_bytes=2**30)
    # Bigger lattices need more.
    assert estimate_training_bytes(CubeConfig(lattice_edge=64), 8) > need


def test_mismatched_teacher_dim_is_named() -> None:
    with pytest.raises(ValueError, match="mismatched teacher_dim"):
        _model(teacher_dim=32)(torch.randn(2, 40))


def test_losses_respond_to_what_they_measure() -> None:
    model = _model(edge=4)
    x = torch.randn(6, 32)
    out = model(x)
    _, perfect = total_loss(out, out.prediction.detach(), DEFAULT_WEIGHTS)
    assert perfect["reconstruction"] == pytest.approx(0.0, abs=1e-7)
    assert perfect["similarity"] == pytest.approx(0.0, abs=1e-7)
    assert perfect["diversity"] == 0.0
    assert perfect["cosine"] == pytest.approx(1.0, abs=1e-5)
    _, collapsed = total_loss(out, torch.randn(6, 32) * 10, DEFAULT_WEIGHTS)
    assert collapsed["diversity"] > 1.0
    # A lattice that does not move pays the emergence hinge; a moving one does not.
    # Without lattice steps the output face never hears of the input: one prediction for all rows.
    frozen_out = model(x, steps=0)
    torch.testing.assert_close(frozen_out.prediction, frozen_out.prediction[:1].expand(6, -1))
    _, frozen = total_loss(frozen_out, x, DEFAULT_WEIGHTS)
    assert frozen["step_change"] == 0.0
    # Shares of the weighted total add up to one.
    assert sum(perfect.get(f"share_{t}", 0.0) for t in LOSS_TERMS) in (0.0, pytest.approx(1.0))
    assert sum(collapsed[f"share_{t}"] for t in LOSS_TERMS) == pytest.approx(1.0)
    # Every loss term is non-negative (the cosine is a metric, not a loss).
    assert all(m[term] >= 0 for m in (perfect, collapsed, frozen) for term in LOSS_TERMS)


def test_bf16_autocast_on_cpu_trains() -> None:
    model = _model(edge=4, steps=2)
    x = torch.randn(4, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
        loss, _ = total_loss(out, x, DEFAULT_WEIGHTS)
    assert out.prediction.dtype == torch.bfloat16
    assert torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
