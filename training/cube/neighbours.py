"""Neighbour bands of the cube lattice, built once per lattice shape and cached.

Cells are numbered ``n = z·S² + y·S + x`` on an S×S×S lattice with hard walls (no wrap-around).
The adaptive radius is ``r = 0.5 · S`` and a neighbour offset ``o ≠ 0`` (integer, Euclidean
length ``|o|``) falls into one of three ranges:

- local       ``0      < |o| ≤ 0.04·r``
- functional  ``0.04·r < |o| ≤ 0.28·r``
- distant     ``0.28·r < |o| ≤ r``

Offsets of one length form a *shell* (|o| = 1: the 6 face neighbours, √2: 12 edge
neighbours, …). The rules, in order, band by band from local outwards:

1. **Distinct bands.** A band never takes a shell an inner band took. A band whose range
   holds no shell left for it takes the nearest unused shell beyond its lower bound instead
   (on 8³, r = 4: the local range ``(0, 0.16]`` is empty and takes |o| = 1; the functional
   range ``(0.16, 1.12]`` holds only |o| = 1, taken, and takes √2).
2. **Whole shells, capped.** A band keeps whole shells, so its offset set is closed under
   sign flips and axis permutations and every cell, corners included, has a neighbour in
   every band. When the band's shells hold more than ``max_neighbours`` offsets, the local
   and functional bands take the innermost shell, then the outermost, then the middle ones
   nearest the centre, while they fit; the distant band takes the outermost shell that fits
   (the innermost when none does), then the next ones inwards while they fit: it is the band
   that carries a cell's state across the lattice, so it keeps the longest reach.
3. **The distant band connects on its own.** It also holds the face shell |o| = 1, so its
   offsets alone link every cell to every other (shells such as √2 or √3 alone reach only a
   sublattice). Top-k gating never drops the distant expert (``training.cube.fused.gate_weights``).
4. Offsets whose step leaves the lattice for every cell (a component ≥ S) are never used.

**Reach.** ``reach_steps(S)`` is T_min(S), the fewest lattice steps after which a change at any
input-face cell (z = 0) can have reached every output-face cell (z = S − 1): a breadth-first
search over the distant band's offsets, hard walls, from the input-face corner, edge middle and
centre (``tests/training/test_cube_reach.py`` checks it against the dense check from every
input-face cell for S = 2..12). Since the distant expert acts in every cell whatever the gate,
this holds under soft and top-k gating alike; the other bands can only shorten the way.

A band is held three ways: as an index ``[N, K]`` with a validity mask (outside neighbours
point at the cell itself and are masked out); as the constant row shift of each offset
(``dz·S² + dy·S + dx``) with an additive score mask ``[K, N, 1]``, so an attention can read
its neighbours as shifted row ranges of the state; and as a row-normalised sparse ``[N, N]``
matrix. The Functional and Distant bands' matrices are also stacked into one ``[2N, N]``
``RowSum``, so both neighbour means are one embedding-bag row sum per step. ``row_pattern``
lays a band over the rows ``cell·B + b`` of a batch, for the Local attention's sparse
operations on CPU.
"""

from __future__ import annotations

import functools
import itertools
import math
import warnings
from collections import OrderedDict
from dataclasses import dataclass

import torch

BAND_NAMES = ("local", "functional", "distant")
BAND_FRACTIONS = ((0.0, 0.04), (0.04, 0.28), (0.28, 1.0))
RADIUS_FRACTION = 0.5
FACE_SHELL = 1.0
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
    matrix: torch.Tensor  # [N, N] sparse CSR (int32 indices), row-normalised over valid neighbours
    transposed: torch.Tensor  # matrix transposed, CSR (for the backward pass)
    shifts: tuple[int, ...]  # per offset, the row distance dz·S² + dy·S + dx of the neighbour
    score_mask: torch.Tensor  # [K, N, 1] float: 0 for a valid neighbour, -inf for one outside


@dataclass(frozen=True)
class RowSum:
    """A sparse ``[M, N]`` matrix in CSR arrays, applied to a ``[N, F]`` dense tensor as an
    embedding bag: row i of the result is ``Σ values[j] · x[indices[j]]`` over the row's entries.

    On CPU this is several times faster than a sparse matmul, which zero-fills and copies its
    output on every call; the embedding bag writes each output row once.
    """

    indices: torch.Tensor  # [nnz] int64, the column of each entry, row by row
    offsets: torch.Tensor  # [M] int64, where each row's entries start
    values: torch.Tensor  # [nnz] float: the matrix's entries (callers may pass others on the same pattern)

    def __call__(self, x: torch.Tensor, values: torch.Tensor | None = None) -> torch.Tensor:
        """``matrix @ x``, with ``values`` in place of the stored entries when given."""
        weights = self.values if values is None else values
        return torch.embedding_bag(x, self.indices, self.offsets, False, 0, False, weights, False, None)[0]

    @classmethod
    def from_csr(cls, csr: torch.Tensor) -> RowSum:
        """The row sum of a sparse CSR matrix."""
        return cls(csr.col_indices().long(), csr.crow_indices()[:-1].long(), csr.values())

    def to(self, device: torch.device | str) -> RowSum:
        """The same operator on ``device``."""
        return RowSum(self.indices.to(device), self.offsets.to(device), self.values.to(device))


@dataclass(frozen=True)
class Neighbourhood:
    """The three bands of one lattice shape."""

    edge: int
    radius: float
    local: Band
    functional: Band
    distant: Band
    # The functional matrix stacked on the distant one, [2N, N], and its transpose.
    means: RowSum
    means_transposed: RowSum

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


def _pick_shells(in_band: list[float], sizes: dict[float, int], cap: int, outermost_first: bool) -> list[float]:
    if outermost_first:
        # The longest reach that fits, then inwards while the band has room.
        order = sorted((d for d in in_band if sizes[d] <= cap), reverse=True) or [in_band[0]]
    else:
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
    """Per band: its name, whether it borrowed a shell from beyond its range, and the shell
    lengths it uses (the distant band's include the face shell, rule 3)."""
    if edge < 2:
        raise ValueError(f"lattice_edge must be at least 2 (got {edge}).")
    radius = RADIUS_FRACTION * edge
    # Far enough to find an unused shell beyond any band's lower bound, even on tiny lattices.
    shells = _shells(edge, max(radius, math.sqrt(3)) + 2.0)
    sizes = {d: len(v) for d, v in shells.items()}
    used: set[float] = set()
    out: list[tuple[str, bool, list[float]]] = []
    for name, (lo_f, hi_f) in zip(BAND_NAMES, BAND_FRACTIONS, strict=True):
        lo, hi = lo_f * radius, hi_f * radius
        in_band = [d for d in shells if lo + _EPS < d <= hi + _EPS and d not in used]
        distant = name == "distant"
        if in_band:
            chosen = _pick_shells(in_band, sizes, max_neighbours, outermost_first=distant)
        else:
            chosen = [next(d for d in shells if d > lo + _EPS and d not in used)]
        used.update(chosen)
        if distant and FACE_SHELL not in chosen:
            chosen = [FACE_SHELL, *chosen]
        out.append((name, not in_band, chosen))
    return out


@functools.lru_cache(maxsize=128)
def reach_steps(edge: int, max_neighbours: int = DEFAULT_MAX_NEIGHBOURS) -> int:
    """T_min(S): the fewest lattice steps after which a change at any input-face cell can have
    reached every output-face cell, moving by the distant band's offsets between hard walls
    (see the module docstring)."""
    _, _, shells = band_offsets(edge, max_neighbours)[2]
    all_shells = _shells(edge, max(shells) + _EPS)
    offsets = [o for d in shells for o in all_shells[d]]
    middle = (edge - 1) // 2
    return max(face_steps(edge, offsets, (x, y)) for x, y in ((0, 0), (middle, 0), (middle, middle)))


def face_steps(edge: int, offsets: list[tuple[int, int, int]], start: tuple[int, int]) -> int:
    """Steps until the cells reachable from input-face cell ``start`` (x, y), moving by
    ``offsets`` (dx, dy, dz) between hard walls, cover the output face."""
    reached = torch.zeros(edge, edge, edge, dtype=torch.bool)  # [z, y, x]
    reached[0, start[1], start[0]] = True
    steps = 0
    while not bool(reached[-1].all()):
        grown = reached.clone()
        for dx, dy, dz in offsets:
            # Cell c reaches c + o: the reached set shifted by o, clipped at the walls.
            source = tuple(slice(max(0, -d), edge - max(0, d)) for d in (dz, dy, dx))
            target = tuple(slice(max(0, d), edge - max(0, -d)) for d in (dz, dy, dx))
            grown[target] |= reached[source]
        if bool((grown == reached).all()):
            raise AssertionError(f"the offsets do not connect the {edge}³ lattice")
        reached, steps = grown, steps + 1
    return steps


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
    matrix, transposed = _csr_pair(torch.stack([rows, cols]), values, (n, n))
    shifts = tuple(int(dz) * edge * edge + int(dy) * edge + int(dx) for dx, dy, dz in offsets.tolist())
    score_mask = torch.zeros(mask.shape).masked_fill(~mask, float("-inf")).t().contiguous().unsqueeze(-1)
    return Band(
        name, lower, upper, borrowed, tuple(shells), offsets, index, mask, matrix, transposed, shifts, score_mask
    )


def _csr_pair(indices: torch.Tensor, values: torch.Tensor, shape: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The sparse matrix with ``values`` at ``indices`` ``[2, nnz]``, as CSR, and its transpose as CSR."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "sparse CSR support is in beta"
        coo = torch.sparse_coo_tensor(indices, values, shape).coalesce()
        return _int32(coo.to_sparse_csr()), _int32(coo.t().coalesce().to_sparse_csr())


def _int32(csr: torch.Tensor) -> torch.Tensor:
    # With int64 indices the CPU sparse matmul converts them on every call: five times slower on 8³.
    return torch.sparse_csr_tensor(
        csr.crow_indices().int(), csr.col_indices().int(), csr.values(), csr.shape, check_invariants=False
    )


def _stacked_means(functional: Band, distant: Band) -> tuple[RowSum, RowSum]:
    n = functional.index.shape[0]
    f, d = functional.matrix.to_sparse_coo(), distant.matrix.to_sparse_coo()
    indices = torch.cat([f.indices(), d.indices() + torch.tensor([[n], [0]])], dim=1)
    matrix, transposed = _csr_pair(indices, torch.cat([f.values(), d.values()]), (2 * n, n))
    return RowSum.from_csr(matrix), RowSum.from_csr(transposed)


@functools.lru_cache(maxsize=16)
def _neighbourhood_cpu(edge: int, max_neighbours: int) -> Neighbourhood:
    radius = RADIUS_FRACTION * edge
    bands = [
        _build_band(name, lo_f * radius, hi_f * radius, borrowed, shells, edge)
        for (name, borrowed, shells), (lo_f, hi_f) in zip(
            band_offsets(edge, max_neighbours), BAND_FRACTIONS, strict=True
        )
    ]
    local, functional, distant = bands
    return Neighbourhood(edge, radius, local, functional, distant, *_stacked_means(functional, distant))


_DEVICE_CACHE: dict[tuple[int, int, str], Neighbourhood] = {}


@dataclass(frozen=True)
class RowPattern:
    """A band's neighbours over the rows ``r = cell·B + b`` of a ``[N·B, ·]`` state: ``K`` entries a
    row in the band's offset order, as ``[N·B, N·B]`` sparse patterns. An outside neighbour is an
    entry on the row itself, which ``score_mask`` gives weight zero."""

    rows: RowSum  # the pattern (values given per call)
    rows_transposed: RowSum  # its transpose
    order_t: torch.Tensor  # [R·K] int64: entry values in the transposed pattern's order are values[order_t]
    score_mask: torch.Tensor  # [K, R] float: 0 for a valid neighbour, -inf for one outside
    sample: torch.Tensor  # the pattern as a CSR tensor (int32 indices) of zeros, for sampled matmuls

    def apply(self, values: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``W @ x`` for the ``[R, R]`` matrix ``W`` with ``values`` (``[R·K]``, row-major) on the pattern."""
        return self.rows(x, values)

    def apply_transposed(self, values: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``Wᵀ @ x`` for the same ``W``."""
        return self.rows_transposed(x, values[self.order_t])


# Row patterns by (band, batch size), most recently used last. A training run uses two or three
# batch sizes (full, last, evaluation); on 37³ a pattern holds about 100 MB.
_ROW_PATTERNS: OrderedDict[tuple[int, int], tuple[Band, RowPattern]] = OrderedDict()
_ROW_PATTERNS_KEPT = 4


def row_pattern(band: Band, batch: int) -> RowPattern:
    """The row pattern of ``band`` for a batch of ``batch``, on the band's device: built on first
    use, then cached (the few most recently used)."""
    key = (id(band), batch)
    cached = _ROW_PATTERNS.get(key)
    if cached is not None and cached[0] is band:
        _ROW_PATTERNS.move_to_end(key)
        return cached[1]
    n, k = band.index.shape
    device, rows = band.index.device, n * batch
    cols = (band.index[:, None, :] * batch + torch.arange(batch, device=device)[None, :, None]).reshape(-1)
    entry_rows = torch.arange(rows, device=device).repeat_interleave(k)
    order_t = torch.argsort(cols * rows + entry_rows)
    counts = torch.bincount(cols, minlength=rows)
    unit = torch.ones(rows * k, device=device)
    crow = torch.arange(0, rows * k + 1, k, device=device)
    pattern = RowPattern(
        rows=RowSum(cols, crow[:-1], unit),
        rows_transposed=RowSum(entry_rows[order_t], torch.cat([counts.new_zeros(1), counts.cumsum(0)[:-1]]), unit),
        order_t=order_t,
        score_mask=band.score_mask.expand(k, n, batch).reshape(k, rows).contiguous(),
        sample=torch.sparse_csr_tensor(
            crow.int(), cols.int(), torch.zeros(rows * k, device=device), (rows, rows), check_invariants=False
        ),
    )
    _ROW_PATTERNS[key] = (band, pattern)
    while len(_ROW_PATTERNS) > _ROW_PATTERNS_KEPT:
        _ROW_PATTERNS.popitem(last=False)
    return pattern


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
            local, functional, distant = (
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
                    b.shifts,
                    b.score_mask.to(device),
                )
                for b in cpu.bands
            )
            cached = Neighbourhood(
                cpu.edge,
                cpu.radius,
                local,
                functional,
                distant,
                cpu.means.to(device),
                cpu.means_transposed.to(device),
            )
        _DEVICE_CACHE[key] = cached
    return cached
