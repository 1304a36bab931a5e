"""Augmenting a padded batch at once gives, row for row, bit for bit, what the recipe's
augmentations give each sample alone from its own seeded stream: the same draws, the same
arithmetic, padding left as padding. So the batch around a sample cannot change how it is
augmented, in a run or in a replay (the loader's side: tests/training/test_asl_loader.py)."""

from __future__ import annotations

import numpy as np
import pytest

from training.asl import augment
from training.asl.augment import ALL, Augmenter
from training.asl.data import pad
from training.asl.landmarks import LEFT_HAND, RIGHT_HAND, selected_landmarks

POINTS = selected_landmarks(use_pose=False)
POS = {p: i for i, p in enumerate(POINTS)}


def recipe(policy: Augmenter, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The recipe written out with the module's augmentations, one sample at a time: the
    definition a batch must reproduce."""
    on = policy.enabled
    mask_time = False
    if rng.random() < policy.p_temporal:
        if "resample" in on:
            linear = policy.interpolation == "mixed" and rng.random() < 0.5
            x = augment.resample(x, rng, linear=linear)
        mask_time = "time_mask" in on and rng.random() < 0.5
    if "flip" in on and rng.random() < policy.p_flip:
        x = augment.flip(x, policy.mirror)
    if "crop" in on and policy.crop:
        x = augment.crop(x, rng, policy.crop)
    if rng.random() < policy.p_spatial:
        centre = augment._centre(x)
        if "rotate" in on and rng.random() < 0.5:
            x = augment.rotate(x, rng, policy.rotate_degrees, centre=centre)
        for name, fn in (("scale", augment.scale), ("shear", augment.shear), ("translate", augment.translate)):
            if name in on and rng.random() < 0.5:
                x = fn(x, rng, centre=centre)
    if "noise" in on and rng.random() < policy.p_noise:
        x = augment.noise(x, rng)
    if "spatial_mask" in on and rng.random() < policy.p_spatial_mask:
        x = augment.spatial_mask(x, rng)
    if rng.random() < policy.p_masking:
        if "feature_mask" in on and rng.random() < 0.5:
            x = augment.feature_mask(x, rng, policy.parts)
        if "landmark_dropout" in on:
            x = augment.landmark_dropout(x, rng)
    if mask_time:
        x = augment.time_mask(x, rng)
    return x


POLICIES = {
    "ours": Augmenter(POINTS),
    # The 1st-place recipe: flip 0.5, affine ±30° at 0.75, resampling at 0.8 with mixed
    # interpolation, the spatial mask at 0.5, a random crop.
    "theirs": Augmenter(
        POINTS,
        p_temporal=0.8,
        p_spatial=0.75,
        p_flip=0.5,
        rotate_degrees=30.0,
        p_spatial_mask=0.5,
        interpolation="mixed",
        crop=24,
    ),
    "everything": Augmenter(POINTS, 1.0, 1.0, 1.0, 1.0, p_flip=0.5, p_spatial_mask=1.0, interpolation="mixed", crop=24),
}


def sequences(count: int, seed: int = 0) -> list[np.ndarray]:
    """Sequences of 1 to 50 frames with hands missing now and then and some frames empty."""
    rng = np.random.default_rng(seed)
    left, right = np.array([POS[p] for p in LEFT_HAND]), np.array([POS[p] for p in RIGHT_HAND])
    out = []
    for k in range(count):
        frames = (2, 1)[k] if k < 2 else int(rng.integers(1, 51))
        x = rng.uniform(0.1, 0.9, (frames, len(POINTS), 3)).astype(np.float32)
        x[np.ix_(np.flatnonzero(rng.random(frames) < 0.3), left)] = np.nan
        x[np.ix_(np.flatnonzero(rng.random(frames) < 0.4), right)] = np.nan
        x[rng.random(frames) < 0.1] = np.nan
        out.append(x)
    return out


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal to the bit where it matters: the same shape, NaN and ±inf in the same places."""
    return a.shape == b.shape and np.array_equal(a, b, equal_nan=True)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_each_row_of_a_batch_is_the_sample_augmented_alone_by_the_recipe(name: str) -> None:
    policy = POLICIES[name]
    raw = sequences(24)
    x, lengths = pad(raw)
    for trial in range(4):
        keys = [(trial, i) for i in range(len(raw))]
        out, out_lengths = policy.batch(x.copy(), lengths, [np.random.default_rng(key) for key in keys])
        for b, key in enumerate(keys):
            expected = recipe(policy, raw[b], np.random.default_rng(key))
            assert out_lengths[b] == expected.shape[0]
            assert same(out[b, : out_lengths[b]], expected), f"{name}: row {b}, trial {trial}"
            # Padding stays padding: every frame after the row's length is undetected.
            assert np.isnan(out[b, out_lengths[b] :]).all()
            # One sample alone (a batch of one) is the same sample.
            assert same(policy(raw[b], np.random.default_rng(key)), expected)
    assert out.shape[0] == len(raw)


@pytest.mark.parametrize("only", ALL)
def test_each_augmentation_on_its_own_does_on_a_batch_what_its_name_says(only: str) -> None:
    """One augmentation at a time, always on: the batch equals the recipe row by row, the
    augmentation changes something, and only resampling and the crop change a length."""
    policy = Augmenter(POINTS, 1.0, 1.0, 1.0, 1.0, frozenset({only}), p_flip=1.0, p_spatial_mask=1.0, crop=24)
    raw = sequences(16, seed=3)
    x, lengths = pad(raw)
    rngs = [np.random.default_rng((9, i)) for i in range(len(raw))]
    out, out_lengths = policy.batch(x.copy(), lengths, rngs)
    changed = 0
    for b, seq in enumerate(raw):
        expected = recipe(policy, seq, np.random.default_rng((9, b)))
        assert same(out[b, : out_lengths[b]], expected)
        assert np.isnan(out[b, out_lengths[b] :]).all()
        if only not in ("resample", "crop"):
            assert out_lengths[b] == lengths[b]
        changed += not same(out[b, : out_lengths[b]], seq)
    assert changed >= len(raw) // 4, f"{only} changed {changed} of {len(raw)} rows"


def test_the_batch_is_left_as_it_was() -> None:
    raw = sequences(8)
    x, lengths = pad(raw)
    before = x.copy()
    POLICIES["everything"].batch(x, lengths, [np.random.default_rng(i) for i in range(len(raw))])
    assert same(x, before)
