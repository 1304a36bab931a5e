"""Neighbour bands of the cube lattice, built once per lattice shape and cached.

Cells are numbered ``n = z·S² + y·S + x`` on an S×S×S lattice with hard walls (no wrap-around).
The adaptive radius is ``r = 0.2 · S`` and a neighbour offset ``o ≠ 0`` (integer, Euclidean
length ``|o|``) falls into one of three bands:

- local       ``0      < |o| ≤ 0.1·r``
- functional  ``0.1·r  < |o| ≤ 0.65·r``
- distant     ``0.65·r < |o| ≤ r``

Offsets of one length form a *shell* (|o| = 1: the 6 face neighbours, √2: 12 edge
neighbours, …). The rules, in order:

1. **Empty band → nearest shell.** A band ``(lo, hi]`` that holds no shell for this lattice
   size takes the nearest shell beyond ``lo`` instead (on 8³, r = 1.6: the local band
   ``(0, 0.16]`` is empty and takes the |o| = 1 shell; on 4³ every band does). Bands may
   then share a shell: the experts still process it differently.
2. **Whole shells, capped.** A band keeps whole shells, so its offset set is closed under
   sign flips and axis permutations and every cell, corners included, has a neighbour in
   every band. When the band's shells hold more than ``max_neighbours`` offsets, shells are
   taken innermost first, then outermost, then the middle ones, while they fit; the
   innermost is always kept (so a band may exceed the cap by one shell, at most 48).
3. Offsets whose step leaves the lattice for every cell (a component ≥ S) are never used.

A band is held twice: as an index ``[N, K]`` with a validity mask (outside neighbours point at
the cell itself and are masked out), for the attention of the Local expert; and as a
row-normalised sparse ``[N, N]`` matrix, so the Functional and Distant experts' neighbour
means are one sparse matmul per step.
"""

from __future__ import annotations

import functools
import itertools
import math
import warnings
from dataclasses import dataclass

import torch

BAND_NAMES = ("local", "functional", "distant")
BAND_FRACTIONS = ((0.0, 0.1), (0.1, 0.65), (0.65, 1.0))
RADIUS_FRACTION = 0.2
DEFAULT_MAX_NEIGHBOURS = 48
_EPS = 1e-9


@dataclass(frozen=True)
class Band:
    """One band's offsets and, per cell, its valid neighbours."""

    name: str
    lower: float
    upper: float
    borrowed: bool  # the range was empty and the nearest shell stood in
    shells: tuple[float, ...]
    offsets: torch.Tensor  # [K, 3] (dx, dy, dz)
    index: torch.Tensor  # [N, K] cell numbers; the cell itself where the neighbour is outside the lattice
    mask: torch.Tensor  # [N, K] bool, False where the neighbour is outside the lattice
    matrix: torch.Tensor  # [N, N] sparse CSR, row-normalised over valid neighbours
    transposed: torch.Tensor  # matrix transposed, CSR (for the backward pass)


@dataclass(frozen=True)
class Neighbourhood:
    """The three bands of one lattice shape."""

    edge: int
    radius: float
    local: Band
    functional: Band
    distant: Band

    @property
    def bands(self) -> tuple[Band, Band, Band]:
        """Local, functional, distant."""
        return (self.local, self.functional, self.distant)


def _shells(edge: int, reach: float) -> dict[float, list[tuple[int, int, int]]]:
    span = min(edge - 1, math.ceil(reach))
    shells: dict[float, list[tuple[int, int, int]]] = {}
    for dx, dy, dz in itertools.product(range(-span, span + 1), repeat=3):
        o = (dx, dy, dz)
        if o == (0, 0, 0):
            continue
        d = round(math.sqrt(o[0] ** 2 + o[1] ** 2 + o[2] ** 2), 9)
        if d <= reach + _EPS:
            shells.setdefault(d, []).append(o)
    return dict(sorted(shells.items()))


def _pick_shells(in_band: list[float], sizes: dict[float, int], cap: int) -> list[float]:
    if not in_band:
        return []
    # Innermost, outermost, then the middle ones nearest the centre first: covers the band's range.
    middle = sorted(in_band[1:-1], key=lambda d: abs(in_band.index(d) - (len(in_band) - 1) / 2))
    order = [in_band[0]] + ([in_band[-1]] if len(in_band) > 1 else []) + middle
    chosen, total = [order[0]], sizes[order[0]]
    for d in order[1:]:
        if total + sizes[d] <= cap:
            chosen.append(d)
            total += sizes[d]
    return sorted(chosen)


def band_offsets(edge: int, max_neighbours: int = DEFAULT_MAX_NEIGHBOURS) -> list[tuple[str, bool, list[float]]]:
    """Per band: its name, whether it borrowed the nearest shell, and the shell lengths it uses."""
    if edge < 2:
        raise ValueError(f"lattice_edge must be at least 2 (got {edge}).")
    radius = RADIUS_FRACTION * edge
    # Far enough to find the nearest shell beyond any band's lower bound, even on tiny lattices.
    shells = _shells(edge, max(radius, math.sqrt(3)) + 1.0)
    sizes = {d: len(v) for d, v in shells.items()}
    out: list[tuple[str, bool, list[float]]] = []
    for name, (lo_f, hi_f) in zip(BAND_NAMES, BAND_FRACTIONS, strict=True):
        lo, hi = lo_f * radius, hi_f * radius
        in_band = [d for d in shells if lo + _EPS < d <= hi + _EPS]
        if in_band:
            out.append((name, False, _pick_shells(in_band, sizes, max_neighbours)))
        else:
            out.append((name, True, [next(d for d in shells if d > lo + _EPS)]))
    return out


def _cell_coords(edge: int) -> torch.Tensor:
    z, y, x = torch.meshgrid(torch.arange(edge), torch.arange(edge), torch.arange(edge), indexing="ij")
    return torch.stack([x.reshape(-1), y.reshape(-1), z.reshape(-1)], dim=1)


def _build_band(name: str, lower: float, upper: float, borrowed: bool, shells: list[float], edge: int) -> Band:
    all_shells = _shells(edge, max(shells) + _EPS)
    offsets = torch.tensor([o for d in shells for o in all_shells[d]], dtype=torch.long)
    coords = _cell_coords(edge)  # [N, 3]
    n = coords.shape[0]
    target = coords[:, None, :] + offsets[None, :, :]  # [N, K, 3]
    mask = ((target >= 0) & (target < edge)).all(dim=-1)
    index = target[..., 2] * edge * edge + target[..., 1] * edge + target[..., 0]
    # Outside neighbours point at the cell itself (always a valid row); the mask drops them.
    index = torch.where(mask, index, torch.arange(n)[:, None].expand_as(index))
    counts = mask.sum(dim=1)
    if int(counts.min()) == 0:
        raise AssertionError(f"band {name} leaves a cell without neighbours on {edge}³")
    rows = torch.arange(n)[:, None].expand_as(index)[mask]
    cols = index[mask]
    values = (1.0 / counts.float())[:, None].expand_as(index)[mask]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "sparse CSR support is in beta"
        coo = torch.sparse_coo_tensor(torch.stack([rows, cols]), values, (n, n)).coalesce()
        matrix = coo.to_sparse_csr()
        transposed = coo.t().coalesce().to_sparse_csr()
    return Band(name, lower, upper, borrowed, tuple(shells), offsets, index, mask, matrix, transposed)


@functools.lru_cache(maxsize=16)
def _neighbourhood_cpu(edge: int, max_neighbours: int) -> Neighbourhood:
    radius = RADIUS_FRACTION * edge
    bands = [
        _build_band(name, lo_f * radius, hi_f * radius, borrowed, shells, edge)
        for (name, borrowed, shells), (lo_f, hi_f) in zip(
            band_offsets(edge, max_neighbours), BAND_FRACTIONS, strict=True
        )
    ]
    return Neighbourhood(edge, radius, *bands)


_DEVICE_CACHE: dict[tuple[int, int, str], Neighbourhood] = {}


def neighbourhood(
    edge: int, max_neighbours: int = DEFAULT_MAX_NEIGHBOURS, device: torch.device | str = "cpu"
) -> Neighbourhood:
    """The bands of an ``edge``³ lattice on ``device``: built on first use, then cached."""
    key = (edge, max_neighbours, str(torch.device(device)))
    cached = _DEVICE_CACHE.get(key)
    if cached is None:
        cpu = _neighbourhood_cpu(edge, max_neighbours)
        if torch.device(device).type == "cpu":
            cached = cpu
        else:
            cached = Neighbourhood(
                cpu.edge,
                cpu.radius,
                *(
                    Band(
                        b.name,
                        b.lower,
                        b.upper,
                        b.borrowed,
                        b.shells,
                        b.offsets.to(device),
                        b.index.to(device),
                        b.mask.to(device),
                        b.matrix.to(device),
                        b.transposed.to(device),
                    )
                    for b in cpu.bands
                ),
            )
        _DEVICE_CACHE[key] = cached
    return cached
