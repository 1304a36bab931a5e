"""Augmentations on raw landmarks ([frames, points, 3], NaN where undetected), before features.

Each augmentation is a pure function of (landmarks, rng). Geometric ones move only detected
points, temporal resampling picks or blends frames, ``crop`` cuts a random window, and the
masking ones hide points: as NaN (undetected) or, for ``time_mask``, as ``HIDDEN`` (the
featurizer's mark for a frame that keeps its place but shows nothing). ``Augmenter``
applies them with the spec's probabilities (one draw per group, then each member's own
switch); every draw comes from the sample's seeded generator, so a replay augments alike.

``Augmenter.batch`` augments a padded batch at once: it draws each sample's parameters from
that sample's generator, in the order and number one sample alone would (the draws depend
on nothing but the sample's frame count), then runs each augmentation's arithmetic on every
row it applies to together. Row b of a batch is bit for bit the sample augmented alone,
whatever else is in the batch, so neither batch size nor loader workers change training.

The featurizer centres every sequence on its reference point's mean and divides by its
standard deviation (per axis or one for all), so a constant shift or a uniform zoom of the whole sequence cannot
change what the model sees: ``translate`` and ``scale`` therefore vary over the sequence
(the signer drifts across the image, the camera zooms), which the normalisation keeps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from training.asl.landmarks import groups, mirror_permutation
from training.asl.preprocess import HIDDEN

ALL = (
    "resample",
    "crop",
    "time_mask",
    "rotate",
    "scale",
    "shear",
    "translate",
    "flip",
    "noise",
    "feature_mask",
    "landmark_dropout",
    "spatial_mask",
)
INTERPOLATIONS = ("mixed", "nearest")
# Ranges: speed of resampling, side of the spatial mask's square, the time mask's longest
# span (share of the frames), zoom, shear, drift of the shift, noise σ, dropout rate.
SPEED = (0.5, 1.5)
SQUARE = (0.5, 1.0)
TIME_MASK_FRACTION = 0.3
ZOOM = (0.8, 1.2)
SHEAR = 0.15
SHIFT = 0.05
NOISE = 0.003
DROPOUT = 0.05
# Rows of a batch augmented together: enough to spread numpy's cost per call, few enough
# for their arrays to stay in the CPU's cache from one augmentation to the next.
ROWS = 8


def _centre(x: np.ndarray) -> np.ndarray:
    """The mean x, y of the detected points (a point is detected in both or neither)."""
    seen = np.isfinite(x[..., 0])
    count = int(np.count_nonzero(seen))
    if not count:
        return np.array([0.5, 0.5], dtype=x.dtype)
    sums = np.array([x[..., 0][seen].sum(dtype=np.float64), x[..., 1][seen].sum(dtype=np.float64)])
    return sums.astype(x.dtype) / count


def _turn(y: np.ndarray, matrices: np.ndarray, centres: np.ndarray) -> None:
    """In place on rows [r, frames, points, 3]: x, y ↦ matrix · (x, y − centre) + centre,
    each row by its own 2×2 matrix [r, 2, 2] and centre [r, 2]; z untouched. Written out per
    coordinate (a BLAS product of 2×2 matrices costs more than the rest of the batch)."""
    m = matrices.astype(y.dtype)[:, :, :, None, None]
    cx, cy = centres[:, 0, None, None], centres[:, 1, None, None]
    dx, dy = y[..., 0] - cx, y[..., 1] - cy
    y[..., 0] = dx * m[:, 0, 0] + dy * m[:, 0, 1] + cx
    y[..., 1] = dx * m[:, 1, 0] + dy * m[:, 1, 1] + cy


def _stretch(y: np.ndarray, factors: np.ndarray, shifts: np.ndarray, centres: np.ndarray) -> None:
    """In place on rows [r, frames, points, 3]: scale x, y per frame by ``factors``
    [r, frames, 2] about each row's centre [r, 2], then add ``shifts`` [r, frames, 2] (in
    float64); z untouched."""
    for k in (0, 1):
        c = centres[:, k, None, None]
        y[..., k] = ((y[..., k] - c) * factors[:, :, k, None] + c + shifts[:, :, k, None]).astype(y.dtype)


def _affine(x: np.ndarray, matrix: np.ndarray, centre: np.ndarray | None = None) -> np.ndarray:
    """Apply a 2×2 matrix (about ``centre``, by default the sequence's) to x, y; z untouched."""
    out = x.copy()
    _turn(out[None], matrix[None], (_centre(x) if centre is None else centre)[None])
    return out


def _ramp(frames: int, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """[frames, *start.shape]: ``start`` at the first frame, ``end`` at the last, linear between."""
    t = np.linspace(0.0, 1.0, frames)
    return start + np.multiply.outer(t, end - start)


def _drift(x: np.ndarray, factors: np.ndarray, shifts: np.ndarray, centre: np.ndarray | None = None) -> np.ndarray:
    """Scale x, y per frame by ``factors`` [frames, 2] (about ``centre``, by default the
    sequence's), then add ``shifts`` [frames, 2]; z untouched."""
    out = x.copy()
    _stretch(out[None], factors[None], shifts[None], (_centre(x) if centre is None else centre)[None])
    return out


def _speed(frames: int, rng: np.random.Generator, low: float, high: float) -> int:
    """The length of a sequence of ``frames`` played ``low``–``high`` times as long."""
    return max(1, round(frames * rng.uniform(low, high)))


def _resampling(frames: int, target: int, linear: bool) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Where ``target`` new frames come from in ``frames`` old ones: the nearest old frame
    of each, and for a linear blend the old frame below it and the weight of the one above
    (None, None when the blend does not apply)."""
    if not linear or frames < 2 or target < 2:
        return np.minimum((np.arange(target) * frames / target).astype(np.int64), frames - 1), None, None
    where = np.arange(target) * (frames - 1) / (target - 1)
    below = np.minimum(np.floor(where).astype(np.int64), frames - 2)
    return np.rint(where).astype(np.int64), below, where - below


def _blend(x: np.ndarray, nearest: np.ndarray, below: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Each new frame the blend of ``x[below]`` and the next frame by ``weight``; a point
    unseen in either keeps ``x[nearest]``. The frame axis is the one ``below`` indexes."""
    blend = x[below] * (1 - weight) + x[below + 1] * weight
    return np.where(np.isfinite(blend), blend, x[nearest])


def resample(
    x: np.ndarray, rng: np.random.Generator, low: float = SPEED[0], high: float = SPEED[1], linear: bool = False
) -> np.ndarray:
    """Play the sequence 0.5–1.5× as long. Each new frame is the nearest original one or,
    with ``linear``, the blend of the two original frames it falls between (a point seen in
    only one of them keeps the nearer frame's value, NaN if that one is unseen)."""
    frames = x.shape[0]
    target = _speed(frames, rng, low, high)
    nearest, below, weight = _resampling(frames, target, linear)
    if below is None or weight is None:
        return x[nearest]
    return _blend(x, nearest, below, weight[:, None, None].astype(x.dtype))


def crop(x: np.ndarray, rng: np.random.Generator, length: int) -> np.ndarray:
    """``length`` consecutive frames from a random start, when the sequence is longer."""
    frames = x.shape[0]
    if frames <= length:
        return x
    start = int(rng.integers(0, frames - length + 1))
    return x[start : start + length]


def _square(rng: np.random.Generator, low: float, high: float) -> tuple[np.ndarray, float]:
    """The spatial mask's square: its lower corner (x, y) and its side."""
    return rng.uniform(0.0, 1.0, 2), float(rng.uniform(low, high))


def spatial_mask(
    x: np.ndarray, rng: np.random.Generator, low: float = SQUARE[0], high: float = SQUARE[1]
) -> np.ndarray:
    """Hide (as undetected) every point inside a random square of the image: side 0.5–1 of
    the image, its lower corner anywhere in it, as the 1st-place ISLR solution's spatial
    mask does. Points outside keep their values."""
    corner, side = _square(rng, low, high)
    xy = x[..., :2]
    inside = ((xy > corner) & (xy < corner + side)).all(-1)
    out = x.copy()
    out[inside] = np.nan
    return out


def _span(frames: int, rng: np.random.Generator, max_fraction: float) -> tuple[int, int]:
    """The time mask's first frame and length in a sequence of ``frames`` (at least 2)."""
    span = int(rng.integers(1, max(1, int(frames * max_fraction)) + 1))
    return int(rng.integers(0, frames - span + 1)), span


def time_mask(x: np.ndarray, rng: np.random.Generator, max_fraction: float = TIME_MASK_FRACTION) -> np.ndarray:
    """Mask a random span of up to 30 % of the frames: every point of each frame in the span
    that shows anything becomes ``HIDDEN``, so the frames keep their place and the model
    sees a gap (all-zero features), as the 1st-place ISLR solution's temporal mask does.
    Frames that show nothing stay empty (the featurizer drops them either way), and
    sequences under two frames are left alone (masking would leave nothing)."""
    frames = x.shape[0]
    if frames < 2:
        return x.copy()
    start, span = _span(frames, rng, max_fraction)
    out = x.copy()
    window = out[start : start + span]
    window[np.isfinite(window[..., :2]).all(-1).any(-1)] = HIDDEN
    return out


def _rotation(rng: np.random.Generator, degrees: float) -> np.ndarray:
    """A rotation matrix by up to ±``degrees``."""
    a = np.deg2rad(rng.uniform(-degrees, degrees))
    return np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])


def _zoom(frames: int, rng: np.random.Generator, low: float, high: float) -> np.ndarray:
    """Per-frame x, y factors [frames, 2] of a zoom drifting from one factor to another."""
    aspect = rng.uniform(0.95, 1.05, 2)
    return _ramp(frames, rng.uniform(low, high) * aspect, rng.uniform(low, high) * aspect)


def _shear(rng: np.random.Generator, amount: float) -> np.ndarray:
    """A shear matrix along x or y by up to ±``amount``."""
    m = np.eye(2)
    m[tuple(rng.permutation(2))] = rng.uniform(-amount, amount)
    return m


def _shift(frames: int, rng: np.random.Generator, amount: float) -> np.ndarray:
    """Per-frame x, y offsets [frames, 2] drifting from one offset to another."""
    start, end = rng.uniform(-amount, amount, 2), rng.uniform(-amount, amount, 2)
    return _ramp(frames, start, end)


def rotate(
    x: np.ndarray, rng: np.random.Generator, degrees: float = 15.0, centre: np.ndarray | None = None
) -> np.ndarray:
    """Rotate in the image plane by up to ±``degrees``."""
    return _affine(x, _rotation(rng, degrees), centre)


def scale(
    x: np.ndarray,
    rng: np.random.Generator,
    low: float = ZOOM[0],
    high: float = ZOOM[1],
    centre: np.ndarray | None = None,
) -> np.ndarray:
    """Zoom in or out during the sign, as a camera zoom or a signer leaning in would: the
    scale drifts linearly from one factor in 0.8–1.2 at the first frame to another at the
    last (about the sequence centre), each axis's factor varied by up to ±5 %. Only the
    change over time and the aspect survive the featurizer's per-sequence normalisation."""
    factors = _zoom(x.shape[0], rng, low, high)
    return _drift(x, factors, np.zeros_like(factors), centre)


def shear(
    x: np.ndarray, rng: np.random.Generator, amount: float = SHEAR, centre: np.ndarray | None = None
) -> np.ndarray:
    """Shear along x or y by up to ±0.15."""
    return _affine(x, _shear(rng, amount), centre)


def translate(
    x: np.ndarray, rng: np.random.Generator, amount: float = SHIFT, centre: np.ndarray | None = None
) -> np.ndarray:
    """Move the signer across the image during the sign: the shift drifts linearly from one
    offset (up to ±0.05 of the image on each axis) at the first frame to another at the
    last. Only the drift survives the featurizer, which centres on the sequence's mean."""
    return _drift(x, np.ones((x.shape[0], 2)), _shift(x.shape[0], rng, amount), centre)


def flip(x: np.ndarray, mirror: np.ndarray) -> np.ndarray:
    """Mirror horizontally: x ↦ 2c − x, and swap left/right hands, eyes, lips and nose points."""
    out = x[:, mirror].copy()
    centre = _centre(x)[0]
    out[..., 0] = 2 * centre - out[..., 0]
    return out


def noise(x: np.ndarray, rng: np.random.Generator, sigma: float = NOISE) -> np.ndarray:
    """Gaussian jitter on every detected coordinate."""
    return x + rng.normal(0.0, sigma, x.shape).astype(x.dtype)


def _part(rng: np.random.Generator, parts: dict[str, np.ndarray]) -> np.ndarray:
    """The points of one body part, drawn among ``parts`` by name."""
    names = sorted(parts)
    return parts[names[int(rng.integers(len(names)))]]


def feature_mask(x: np.ndarray, rng: np.random.Generator, parts: dict[str, np.ndarray]) -> np.ndarray:
    """Hide one body part (lips, a hand, eyes, nose, pose) for the whole sequence."""
    out = x.copy()
    out[:, _part(rng, parts)] = np.nan
    return out


def landmark_dropout(x: np.ndarray, rng: np.random.Generator, rate: float = DROPOUT) -> np.ndarray:
    """Hide each point of each frame independently with probability 5 %."""
    out = x.copy()
    out[rng.random(x.shape[:2]) < rate] = np.nan
    return out


@dataclass
class _Draws:
    """One sample's random parameters (``Augmenter.draw``); None or False: that augmentation is off."""

    frames: int  # after resampling and the crop
    resampled: int  # after resampling
    nearest: np.ndarray | None = None  # resampling: each new frame's nearest old one
    below: np.ndarray | None = None  # linear resampling: the old frame below, and the weight
    weight: np.ndarray | None = None  # of the one above
    flip: bool = False
    crop: int | None = None  # the window's first frame
    spatial: bool = False
    rotate: np.ndarray | None = None
    zoom: np.ndarray | None = None
    shear: np.ndarray | None = None
    shift: np.ndarray | None = None
    noise: np.ndarray | None = None
    square: tuple[np.ndarray, float] | None = None
    part: np.ndarray | None = None
    dropout: np.ndarray | None = None
    span: tuple[int, int] | None = None


@dataclass
class Augmenter:
    """The train-split augmentation policy: probabilities, ranges and per-augmentation switches.

    ``crop`` (frames, 0: off) is the random window a longer sequence is cut to.
    """

    points: list[int]
    p_temporal: float = 0.5
    p_spatial: float = 0.7
    p_noise: float = 0.3
    p_masking: float = 0.2
    enabled: frozenset[str] = field(default_factory=lambda: frozenset(ALL))
    p_flip: float = 0.35
    rotate_degrees: float = 15.0
    p_spatial_mask: float = 0.0
    interpolation: str = "nearest"
    crop: int = 0

    def __post_init__(self) -> None:
        unknown = set(self.enabled) - set(ALL)
        if unknown:
            raise ValueError(f"unknown augmentation(s): {', '.join(sorted(unknown))}")
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(f"interpolation must be one of {', '.join(INTERPOLATIONS)}, not {self.interpolation!r}")
        self.mirror = mirror_permutation(self.points)
        self.parts = groups(self.points)

    def __call__(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """An augmented copy of ``x`` [frames, points, 3] (float32): resample, flip, crop, the
        affine parts (about one pivot, the sequence's centre before them: rotation and shear
        leave it in place, the drifts move it a little), noise, the spatial mask, the masks of
        parts and points, and last the time mask, so no other augmentation touches the frames
        it marks. Each applies as the module's function of its name does; ``batch`` does it
        for many sequences at once.
        """
        y, lengths = self.batch(x[None], np.array([x.shape[0]]), [rng])
        return y[0, : lengths[0]]

    def draw(self, frames: int, points: int, rng: np.random.Generator) -> _Draws:
        """Every random parameter of one sequence of ``frames`` frames and ``points`` points,
        from ``rng`` in the recipe's order (each group's switch, then its members' switches
        and parameters). What is drawn depends on the frame count alone, so every draw is
        taken before any arithmetic."""
        on = self.enabled
        mask_time = False
        d = _Draws(frames, frames)
        if rng.random() < self.p_temporal:
            if "resample" in on:
                linear = self.interpolation == "mixed" and rng.random() < 0.5
                target = _speed(frames, rng, *SPEED)
                d.nearest, d.below, weight = _resampling(frames, target, linear)
                d.weight = None if weight is None else weight.astype(np.float32)
                frames = target
            mask_time = "time_mask" in on and rng.random() < 0.5
        d.resampled = frames
        d.flip = "flip" in on and rng.random() < self.p_flip
        if "crop" in on and self.crop and frames > self.crop:
            d.crop = int(rng.integers(0, frames - self.crop + 1))
            frames = self.crop
        d.frames = frames
        if rng.random() < self.p_spatial:
            d.spatial = True
            if "rotate" in on and rng.random() < 0.5:
                d.rotate = _rotation(rng, self.rotate_degrees)
            if "scale" in on and rng.random() < 0.5:
                d.zoom = _zoom(frames, rng, *ZOOM)
            if "shear" in on and rng.random() < 0.5:
                d.shear = _shear(rng, SHEAR)
            if "translate" in on and rng.random() < 0.5:
                d.shift = _shift(frames, rng, SHIFT)
        if "noise" in on and rng.random() < self.p_noise:
            d.noise = rng.normal(0.0, NOISE, (frames, points, 3)).astype(np.float32)
        if "spatial_mask" in on and rng.random() < self.p_spatial_mask:
            d.square = _square(rng, *SQUARE)
        if rng.random() < self.p_masking:
            if "feature_mask" in on and rng.random() < 0.5:
                d.part = _part(rng, self.parts)
            if "landmark_dropout" in on:
                d.dropout = rng.random((frames, points)) < DROPOUT
        if mask_time and frames >= 2:
            d.span = _span(frames, rng, TIME_MASK_FRACTION)
        return d

    def batch(
        self, x: np.ndarray, lengths: np.ndarray, rngs: Sequence[np.random.Generator]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Augment a float32 batch ``x`` [B, T, P, 3] whose row b holds a sequence of
        ``lengths[b]`` frames (NaN after them), row b with ``rngs[b]``: row b of the result,
        to its new length, is exactly ``self(x[b, :lengths[b]], rngs[b])``, the same draws
        and the same float arithmetic, and every frame after it is NaN.

        The draws are taken per row (they depend on nothing but the frame count); the
        arithmetic runs on all the rows an augmentation applies to at once. Returns the
        augmented batch and its lengths.
        """
        draws = [self.draw(int(n), x.shape[2], rng) for n, rng in zip(lengths, rngs, strict=True)]
        out = np.full((len(draws), max([1, *(d.frames for d in draws)]), *x.shape[2:]), np.nan, dtype=x.dtype)
        # ROWS at a time, each few padded only to its own longest sequence.
        for start in range(0, len(draws), ROWS):
            few = slice(start, start + ROWS)
            y = self._apply(x[few, : max(1, int(lengths[few].max()))], lengths[few], draws[few])
            out[few, : y.shape[1]] = y
        return out, np.array([d.frames for d in draws], dtype=np.int64)

    def _apply(self, x: np.ndarray, lengths: np.ndarray, draws: Sequence[_Draws]) -> np.ndarray:
        """The augmentations ``draws`` says, on the rows of ``x`` at once."""
        y = _frames(x, [np.arange(d.resampled) if d.nearest is None else d.nearest for d in draws])
        for b, d in enumerate(draws):
            if d.below is not None and d.weight is not None and d.nearest is not None:
                y[b, : d.resampled] = _blend(x[b, : int(lengths[b])], d.nearest, d.below, d.weight[:, None, None])
        flipped = [b for b, d in enumerate(draws) if d.flip]
        if flipped:
            centres = np.array([_centre(y[b, : draws[b].resampled])[0] for b in flipped])
            rows = y[flipped][:, :, self.mirror]
            rows[..., 0] = 2 * centres[:, None, None] - rows[..., 0]
            y[flipped] = rows
        if any(d.crop is not None for d in draws):
            y = _frames(y, [np.arange(d.frames) + (d.crop or 0) for d in draws])
        _affines(y, draws)
        for b, d in enumerate(draws):
            if d.noise is not None:
                y[b, : d.frames] += d.noise
        _squares(y, draws)
        for b, d in enumerate(draws):
            if d.part is not None:
                y[b, :, d.part] = np.nan
            if d.dropout is not None:
                y[b, : d.frames][d.dropout] = np.nan
            if d.span is not None:
                window = y[b, d.span[0] : d.span[0] + d.span[1]]
                window[np.isfinite(window[..., :2]).all(-1).any(-1)] = HIDDEN
        return y


def _frames(x: np.ndarray, sources: Sequence[np.ndarray]) -> np.ndarray:
    """[B, T', P, 3]: row b's frames ``x[b, sources[b]]``, then NaN (T' the longest)."""
    lengths = np.array([len(s) for s in sources])
    index = np.zeros((len(sources), max(1, int(lengths.max(initial=0)))), dtype=np.int64)
    for b, source in enumerate(sources):
        index[b, : len(source)] = source
    out = x[np.arange(len(sources))[:, None], index]
    out[np.arange(index.shape[1])[None, :] >= lengths[:, None]] = np.nan
    return out


def _affines(y: np.ndarray, draws: Sequence[_Draws]) -> None:
    """The affine group in place, in ``__call__``'s order, each part on the rows it applies to,
    about each row's centre before the group."""
    spatial = [b for b, d in enumerate(draws) if d.spatial]
    if not spatial:
        return
    centres = np.zeros((len(draws), 2), dtype=y.dtype)
    for b in spatial:
        centres[b] = _centre(y[b, : draws[b].frames])
    frames = y.shape[1]
    for name in ("rotate", "zoom", "shear", "shift"):
        rows = [b for b, d in enumerate(draws) if getattr(d, name) is not None]
        if not rows:
            continue
        part = y[rows]
        if name in ("rotate", "shear"):
            _turn(part, np.stack([getattr(draws[b], name) for b in rows]), centres[rows])
        else:
            factors, shifts = np.ones((len(rows), frames, 2)), np.zeros((len(rows), frames, 2))
            for k, b in enumerate(rows):
                ramp = getattr(draws[b], name)
                (factors if name == "zoom" else shifts)[k, : len(ramp)] = ramp
            _stretch(part, factors, shifts, centres[rows])
        y[rows] = part


def _squares(y: np.ndarray, draws: Sequence[_Draws]) -> None:
    """The spatial mask in place on the rows it applies to."""
    rows = [b for b, d in enumerate(draws) if d.square is not None]
    if not rows:
        return
    corner = np.stack([draws[b].square[0] for b in rows])[:, None, None, :]  # type: ignore[index]
    side = np.array([draws[b].square[1] for b in rows])[:, None, None, None]  # type: ignore[index]
    out = y[rows]
    xy = out[..., :2]
    out[((xy > corner) & (xy < corner + side)).all(-1)] = np.nan
    y[rows] = out
