"""Augmentations on raw landmarks ([frames, points, 3], NaN where undetected), before features.

Each augmentation is a pure function of (landmarks, rng). Geometric ones move only detected
points, temporal resampling picks or blends frames, ``crop`` cuts a random window, and the
masking ones hide points: as NaN (undetected) or, for ``time_mask``, as ``HIDDEN`` (the
featurizer's mark for a frame that keeps its place but shows nothing). ``Augmenter``
applies them with the spec's probabilities (one draw per group, then each member's own
switch); every draw comes from the sample's seeded generator, so a replay augments alike.

The featurizer centres every sequence on its reference point's mean and divides by its
standard deviation (per axis or one for all), so a constant shift or a uniform zoom of the whole sequence cannot
change what the model sees: ``translate`` and ``scale`` therefore vary over the sequence
(the signer drifts across the image, the camera zooms), which the normalisation keeps.
"""

from __future__ import annotations

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


def _centre(x: np.ndarray) -> np.ndarray:
    """The mean x, y of the detected points (a point is detected in both or neither)."""
    xy = x[..., :2].reshape(-1, 2)
    seen = np.isfinite(xy[:, 0])
    count = int(np.count_nonzero(seen))
    if not count:
        return np.array([0.5, 0.5], dtype=x.dtype)
    return xy[seen].sum(0, dtype=np.float64).astype(x.dtype) / count


def _affine(x: np.ndarray, matrix: np.ndarray, centre: np.ndarray | None = None) -> np.ndarray:
    """Apply a 2×2 matrix (about ``centre``, by default the sequence's) to x, y; z untouched."""
    out = x.copy()
    centre = _centre(x) if centre is None else centre
    out[..., :2] = (x[..., :2] - centre) @ matrix.T.astype(x.dtype) + centre
    return out


def _ramp(frames: int, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """[frames, *start.shape]: ``start`` at the first frame, ``end`` at the last, linear between."""
    t = np.linspace(0.0, 1.0, frames)
    return start + np.multiply.outer(t, end - start)


def _drift(x: np.ndarray, factors: np.ndarray, shifts: np.ndarray, centre: np.ndarray | None = None) -> np.ndarray:
    """Scale x, y per frame by ``factors`` [frames, 2] (about ``centre``, by default the
    sequence's), then add ``shifts`` [frames, 2]; z untouched."""
    out = x.copy()
    centre = _centre(x) if centre is None else centre
    out[..., :2] = ((x[..., :2] - centre) * factors[:, None] + centre + shifts[:, None]).astype(x.dtype)
    return out


def resample(
    x: np.ndarray, rng: np.random.Generator, low: float = 0.5, high: float = 1.5, linear: bool = False
) -> np.ndarray:
    """Play the sequence 0.5–1.5× as long. Each new frame is the nearest original one or,
    with ``linear``, the blend of the two original frames it falls between (a point seen in
    only one of them keeps the nearer frame's value, NaN if that one is unseen)."""
    frames = x.shape[0]
    target = max(1, round(frames * rng.uniform(low, high)))
    if not linear or frames < 2 or target < 2:
        index = np.minimum((np.arange(target) * frames / target).astype(np.int64), frames - 1)
        return x[index]
    where = np.arange(target) * (frames - 1) / (target - 1)
    below = np.minimum(np.floor(where).astype(np.int64), frames - 2)
    weight = (where - below)[:, None, None].astype(x.dtype)
    blend = x[below] * (1 - weight) + x[below + 1] * weight
    nearest = x[np.rint(where).astype(np.int64)]
    return np.where(np.isfinite(blend), blend, nearest)


def crop(x: np.ndarray, rng: np.random.Generator, length: int) -> np.ndarray:
    """``length`` consecutive frames from a random start, when the sequence is longer."""
    frames = x.shape[0]
    if frames <= length:
        return x
    start = int(rng.integers(0, frames - length + 1))
    return x[start : start + length]


def spatial_mask(x: np.ndarray, rng: np.random.Generator, low: float = 0.5, high: float = 1.0) -> np.ndarray:
    """Hide (as undetected) every point inside a random square of the image: side 0.5–1 of
    the image, its lower corner anywhere in it, as the 1st-place ISLR solution's spatial
    mask does. Points outside keep their values."""
    corner = rng.uniform(0.0, 1.0, 2)
    side = rng.uniform(low, high)
    xy = x[..., :2]
    inside = ((xy > corner) & (xy < corner + side)).all(-1)
    out = x.copy()
    out[inside] = np.nan
    return out


def time_mask(x: np.ndarray, rng: np.random.Generator, max_fraction: float = 0.3) -> np.ndarray:
    """Mask a random span of up to 30 % of the frames: every point of each frame in the span
    that shows anything becomes ``HIDDEN``, so the frames keep their place and the model
    sees a gap (all-zero features), as the 1st-place ISLR solution's temporal mask does.
    Frames that show nothing stay empty (the featurizer drops them either way), and
    sequences under two frames are left alone (masking would leave nothing)."""
    frames = x.shape[0]
    if frames < 2:
        return x.copy()
    span = int(rng.integers(1, max(1, int(frames * max_fraction)) + 1))
    start = int(rng.integers(0, frames - span + 1))
    out = x.copy()
    window = out[start : start + span]
    window[np.isfinite(window[..., :2]).all(-1).any(-1)] = HIDDEN
    return out


def rotate(
    x: np.ndarray, rng: np.random.Generator, degrees: float = 15.0, centre: np.ndarray | None = None
) -> np.ndarray:
    """Rotate in the image plane by up to ±``degrees``."""
    a = np.deg2rad(rng.uniform(-degrees, degrees))
    return _affine(x, np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]]), centre)


def scale(
    x: np.ndarray, rng: np.random.Generator, low: float = 0.8, high: float = 1.2, centre: np.ndarray | None = None
) -> np.ndarray:
    """Zoom in or out during the sign, as a camera zoom or a signer leaning in would: the
    scale drifts linearly from one factor in 0.8–1.2 at the first frame to another at the
    last (about the sequence centre), each axis's factor varied by up to ±5 %. Only the
    change over time and the aspect survive the featurizer's per-sequence normalisation."""
    aspect = rng.uniform(0.95, 1.05, 2)
    factors = _ramp(x.shape[0], rng.uniform(low, high) * aspect, rng.uniform(low, high) * aspect)
    return _drift(x, factors, np.zeros_like(factors), centre)


def shear(
    x: np.ndarray, rng: np.random.Generator, amount: float = 0.15, centre: np.ndarray | None = None
) -> np.ndarray:
    """Shear along x or y by up to ±0.15."""
    m = np.eye(2)
    m[tuple(rng.permutation(2))] = rng.uniform(-amount, amount)
    return _affine(x, m, centre)


def translate(
    x: np.ndarray, rng: np.random.Generator, amount: float = 0.05, centre: np.ndarray | None = None
) -> np.ndarray:
    """Move the signer across the image during the sign: the shift drifts linearly from one
    offset (up to ±0.05 of the image on each axis) at the first frame to another at the
    last. Only the drift survives the featurizer, which centres on the sequence's mean."""
    factors = np.ones((x.shape[0], 2))
    start, end = rng.uniform(-amount, amount, 2), rng.uniform(-amount, amount, 2)
    return _drift(x, factors, _ramp(x.shape[0], start, end), centre)


def flip(x: np.ndarray, mirror: np.ndarray) -> np.ndarray:
    """Mirror horizontally: x ↦ 2c − x, and swap left/right hands, eyes, lips and nose points."""
    out = x[:, mirror].copy()
    centre = _centre(x)[0]
    out[..., 0] = 2 * centre - out[..., 0]
    return out


def noise(x: np.ndarray, rng: np.random.Generator, sigma: float = 0.003) -> np.ndarray:
    """Gaussian jitter on every detected coordinate."""
    return x + rng.normal(0.0, sigma, x.shape).astype(x.dtype)


def feature_mask(x: np.ndarray, rng: np.random.Generator, parts: dict[str, np.ndarray]) -> np.ndarray:
    """Hide one body part (lips, a hand, eyes, nose, pose) for the whole sequence."""
    out = x.copy()
    names = sorted(parts)
    out[:, parts[names[int(rng.integers(len(names)))]]] = np.nan
    return out


def landmark_dropout(x: np.ndarray, rng: np.random.Generator, rate: float = 0.05) -> np.ndarray:
    """Hide each point of each frame independently with probability 5 %."""
    out = x.copy()
    out[rng.random(x.shape[:2]) < rate] = np.nan
    return out


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
        """An augmented copy of ``x`` [frames, points, 3]: resample, flip, crop, the affine
        parts, noise, the spatial mask, the masks of parts and points, and last the time
        mask, so no other augmentation touches the frames it marks.
        """
        on = self.enabled
        mask_time = False
        if rng.random() < self.p_temporal:
            if "resample" in on:
                linear = self.interpolation == "mixed" and rng.random() < 0.5
                x = resample(x, rng, linear=linear)
            mask_time = "time_mask" in on and rng.random() < 0.5
        if "flip" in on and rng.random() < self.p_flip:
            x = flip(x, self.mirror)
        if "crop" in on and self.crop:
            x = crop(x, rng, self.crop)
        if rng.random() < self.p_spatial:
            # One pivot for the whole affine group: the sequence's centre before it (rotation
            # and shear about it leave it in place; the drifts move it a little).
            centre = _centre(x)
            if "rotate" in on and rng.random() < 0.5:
                x = rotate(x, rng, self.rotate_degrees, centre=centre)
            for name, fn in (("scale", scale), ("shear", shear), ("translate", translate)):
                if name in on and rng.random() < 0.5:
                    x = fn(x, rng, centre=centre)
        if "noise" in on and rng.random() < self.p_noise:
            x = noise(x, rng)
        if "spatial_mask" in on and rng.random() < self.p_spatial_mask:
            x = spatial_mask(x, rng)
        if rng.random() < self.p_masking:
            if "feature_mask" in on and rng.random() < 0.5:
                x = feature_mask(x, rng, self.parts)
            if "landmark_dropout" in on:
                x = landmark_dropout(x, rng)
        if mask_time:
            x = time_mask(x, rng)
        return x
