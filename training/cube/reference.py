"""A straightforward per-cell implementation of the lattice step, for comparison only.

It loops in Python over batch items and cells, finds each cell's neighbours by walking its
band offsets, and applies the experts to one cell at a time, with the same weights as a
``Lattice3D``. It is what the vectorized step replaces: the benchmark times it, and a test
checks that both compute the same thing. Never use it to train.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F  # noqa: N812

from training.cube.lattice import Lattice3D, LatticeOutput
from training.cube.model import CubeModel, CubeOutput


def _inside(edge: int, x: int, y: int, z: int) -> bool:
    return 0 <= x < edge and 0 <= y < edge and 0 <= z < edge


def _neighbours(edge: int, offsets: list[list[int]], x: int, y: int, z: int) -> list[int]:
    found = []
    for dx, dy, dz in offsets:
        nx, ny, nz = x + dx, y + dy, z + dz
        if _inside(edge, nx, ny, nz):
            found.append(nz * edge * edge + ny * edge + nx)
    return found


def band_offset_lists(lattice: Lattice3D) -> dict[str, list[list[int]]]:
    """Each band's offsets as plain lists, looked up once per forward pass."""
    return {band.name: band.offsets.tolist() for band in lattice.bands(torch.device("cpu")).bands}


def reference_cell_update(
    lattice: Lattice3D, h: torch.Tensor, n: int, b: int, offsets: dict[str, list[list[int]]]
) -> torch.Tensor:
    """The new state of cell ``n`` of batch item ``b``, computed from ``h`` ``[N, B, D]`` alone."""
    edge = lattice.config.lattice_edge
    d = lattice.config.state_size
    x, y, z = n % edge, (n // edge) % edge, n // (edge * edge)
    cell = h[n, b]

    # Local: attention over the local band, then the MLP.
    local = lattice.local
    kd = local.key_dim
    q, _, hidden = local.project(cell).split([kd, kd, d])
    scores, values = [], []
    for m in _neighbours(edge, offsets["local"], x, y, z):
        _, k, _ = local.project(h[m, b]).split([kd, kd, d])
        scores.append((q * k).sum() / math.sqrt(kd))
        values.append(h[m, b])
    attention = torch.softmax(torch.stack(scores), dim=0)
    context = sum((w * v for w, v in zip(attention, values, strict=True)), torch.zeros(d))
    local_update = local.out(F.gelu(hidden + local.context(context)))

    # Functional: GRU-style update from the mean of the functional band.
    functional = lattice.functional
    members = _neighbours(edge, offsets["functional"], x, y, z)
    message = sum((h[m, b] for m in members), torch.zeros(d)) / len(members)
    gates_m, candidate_m = functional.from_message(message).split([2 * d, d])
    zr = torch.sigmoid(functional.gates_state(cell) + gates_m)
    update_gate, reset_gate = zr[:d], zr[d:]
    candidate = torch.tanh(functional.candidate_state(reset_gate * cell) + candidate_m)
    functional_update = update_gate * (candidate - cell)

    # Distant: Euler steps of the continuous-time cell driven by the distant band's mean.
    distant = lattice.distant
    members = _neighbours(edge, offsets["distant"], x, y, z)
    message = sum((h[m, b] for m in members), torch.zeros(d)) / len(members)
    drive = distant.inp(message)
    rate = 1.0 / (distant.euler_steps * (0.5 + F.softplus(distant.log_tau)))
    state = cell
    for _ in range(distant.euler_steps):
        state = state + rate * (torch.tanh(distant.rec(state) + drive) - state)
    distant_update = state - cell

    logits = lattice.gate(cell) + lattice.cell_gate[n, 0]
    if lattice.config.gate == "topk" and lattice.config.top_k < 3:
        # The distant expert always stays; the others compete for the remaining places.
        ranked = torch.cat([logits[:2], torch.full_like(logits[2:], float("inf"))])
        kth = torch.sort(ranked, descending=True).values[lattice.config.top_k - 1]
        logits = torch.where(ranked < kth, torch.full_like(logits, float("-inf")), logits)
    g = torch.softmax(logits, dim=0)
    return cell + g[0] * local_update + g[1] * functional_update + g[2] * distant_update


def reference_forward(model: CubeModel, x: torch.Tensor, steps: int | None = None) -> CubeOutput:
    """``CubeModel.forward`` with the lattice stepped one cell and one batch item at a time."""
    h = model.initial_state(x)
    out = LatticeOutput(state=h, initial=h)
    cells, batch = h.shape[0], h.shape[1]
    offsets = band_offset_lists(model.lattice)
    for _ in range(model.config.steps if steps is None else steps):
        rows = [
            torch.stack([reference_cell_update(model.lattice, h, n, b, offsets) for b in range(batch)])
            for n in range(cells)
        ]
        new = torch.stack(rows)
        out.step_changes.append((new - h).pow(2).mean())
        h = new
        out.steps_run += 1
    out.state = h
    return CubeOutput(model.transformer.decode(model.extractor(h)), out)
