"""The cube model needs its lattice: the reach rule T_min(S), a change at the input face reaching
the whole output face, a lattice-free model failing, every loss term acting, no dead expert."""

from __future__ import annotations

import itertools

import pytest
import torch

from training.cube.config import CubeConfig
from training.cube.data import synthetic_embeddings
from training.cube.losses import DEFAULT_WEIGHTS, LOSS_TERMS, total_loss
from training.cube.model import CubeModel
from training.cube.neighbours import face_steps, neighbourhood, reach_steps

TABLE = {2: 2, 3: 3, 4: 4, 5: 3, 8: 4, 16: 5, 37: 7, 64: 10}


def _distant_offsets(edge: int) -> list[tuple[int, int, int]]:
    return [(dx, dy, dz) for dx, dy, dz in neighbourhood(edge).distant.offsets.tolist()]


def _dense_reach(edge: int, offsets: list[tuple[int, int, int]]) -> int:
    """Brute force: from every input-face cell, steps until the whole output face is reached."""
    return max(face_steps(edge, offsets, (x, y)) for x, y in itertools.product(range(edge), repeat=2))


@pytest.mark.parametrize("edge", range(2, 13))
def test_reach_rule_matches_the_dense_check(edge: int) -> None:
    offsets = _distant_offsets(edge)
    assert reach_steps(edge) == _dense_reach(edge, offsets)


def test_reach_table_and_every_size_is_reachable_within_the_spec_bound() -> None:
    assert {edge: reach_steps(edge) for edge in TABLE} == TABLE
    assert CubeConfig(lattice_edge=8).steps == 4  # the default, steps 0, is T_min(S)
    assert CubeConfig(lattice_edge=8, steps=9).steps == 9
    assert max(reach_steps(edge) for edge in range(2, 65)) <= 32


@pytest.mark.parametrize(
    ("edge", "gate", "top_k"),
    [(2, "soft", 2), (3, "soft", 2), (8, "soft", 2), (16, "soft", 2), (3, "topk", 2), (8, "topk", 1), (8, "topk", 2)],
)
def test_a_change_at_any_input_cell_reaches_every_output_cell(edge: int, gate: str, top_k: int) -> None:
    torch.manual_seed(0)
    model = CubeModel(CubeConfig(teacher_dim=16, lattice_edge=edge, state_size=4, gate=gate, top_k=top_k))  # type: ignore[arg-type]
    face = edge * edge
    h = model.initial_state(torch.randn(1, 16)).detach().requires_grad_(True)
    out = model.lattice(h).state[-face:]  # [S², 1, D]
    # d (output cell j) / d (input-face cells), for every output cell j: a dense S² × S² Jacobian.
    reached = torch.zeros(face, face, dtype=torch.bool)
    for j in range(face):
        (grad,) = torch.autograd.grad(out[j].sum(), h, retain_graph=True)
        reached[j] = grad[:face].abs().sum(dim=(1, 2)) > 0
    assert reached.all(), f"{int((~reached).sum())} (output, input) pairs unreached"


def _train(edge: int, steps: int | None, iterations: int, seed: int = 0) -> tuple[float, float]:
    """Train a small model (its forward at ``steps`` lattice steps) and return the held-out
    reconstruction MSE and cosine at those steps."""
    data, _ = synthetic_embeddings(640, 32, seed=3)
    x = torch.from_numpy(data)
    train, held = x[:512], x[512:]
    torch.manual_seed(seed)
    model = CubeModel(CubeConfig(teacher_dim=32, lattice_edge=edge, state_size=8))
    optimiser = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(iterations):
        batch = train[torch.randint(0, 512, (32,), generator=generator)]
        loss, _ = total_loss(model(batch, steps=steps), batch, DEFAULT_WEIGHTS)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    with torch.no_grad():
        _, metrics = total_loss(model(held, steps=steps), held, DEFAULT_WEIGHTS)
    return metrics["reconstruction"], metrics["cosine"]


def test_a_model_without_lattice_steps_is_clearly_worse_on_held_out_rows() -> None:
    lattice = _train(4, None, 150)
    skipped = _train(4, 0, 150)
    # Without steps the output face never sees the input: one prediction for every row.
    assert lattice[0] < 0.7 * skipped[0]
    assert lattice[1] > skipped[1] + 0.05


def test_every_loss_term_has_its_share_and_no_expert_dies() -> None:
    """A short top-2 run at 5³ on demo-sized rows: each term's share of the weighted total stays
    above a floor, and load balancing keeps both contenders for the second place in use."""
    data, _ = synthetic_embeddings(256, 32, seed=5)
    x = torch.from_numpy(data)
    torch.manual_seed(0)
    model = CubeModel(CubeConfig(teacher_dim=32, lattice_edge=5, state_size=8, gate="topk", top_k=2))
    with torch.no_grad():
        model.lattice.cell_gate[:, :, 1] += 3.0  # the router starts out favouring functional everywhere
    optimiser = torch.optim.AdamW(model.parameters(), lr=3e-3)
    shares: dict[str, list[float]] = {term: [] for term in LOSS_TERMS}
    usage = []
    for i in range(60):
        batch = x[(i * 16) % 256 : (i * 16) % 256 + 16]
        out = model(batch)
        loss, metrics = total_loss(out, batch, DEFAULT_WEIGHTS)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        for term in LOSS_TERMS:
            shares[term].append(metrics[f"share_{term}"])
        usage.append(metrics["gate_local"])
    mean_share = {term: sum(v) / len(v) for term, v in shares.items()}
    assert all(share > 0.01 for share in mean_share.values()), mean_share
    # The local expert starts dead (never in the top 2) and is in use by the end.
    assert usage[0] == 0.0
    assert usage[-1] > 0.05
