"""Augmentations keep shapes and NaN masks; the flip mirrors and swaps left and right."""

from __future__ import annotations

import numpy as np
import pytest

from training.asl import augment
from training.asl.augment import ALL, Augmenter
from training.asl.landmarks import (
    EYE_LEFT,
    EYE_RIGHT,
    LEFT_HAND,
    LIPS_LEFT,
    LIPS_RIGHT,
    RIGHT_HAND,
    groups,
    selected_landmarks,
)
from training.asl.preprocess import HIDDEN

POINTS = selected_landmarks(use_pose=True)
POS = {p: i for i, p in enumerate(POINTS)}


@pytest.fixture
def sequence() -> np.ndarray:
    """30 frames; the left hand is missing in frames 3-8 and the right hand throughout frame 20."""
    rng = np.random.default_rng(0)
    x = rng.uniform(0.2, 0.8, (30, len(POINTS), 3)).astype(np.float32)
    x[3:9, [POS[p] for p in LEFT_HAND]] = np.nan
    x[20, [POS[p] for p in RIGHT_HAND]] = np.nan
    return x


@pytest.mark.parametrize("name", ["rotate", "scale", "shear", "translate", "noise"])
def test_geometric_and_noise_keep_shape_dtype_and_nan_mask_and_move_points(sequence: np.ndarray, name: str) -> None:
    out = getattr(augment, name)(sequence, np.random.default_rng(1))
    assert out.shape == sequence.shape
    assert out.dtype == np.float32
    np.testing.assert_array_equal(np.isnan(out), np.isnan(sequence))
    finite = ~np.isnan(sequence)
    assert not np.allclose(out[finite], sequence[finite])
    if name != "noise":  # the depth coordinate is left alone by 2-D transforms
        np.testing.assert_array_equal(out[..., 2], sequence[..., 2])


def test_resample_picks_whole_frames_so_the_nan_mask_follows(sequence: np.ndarray) -> None:
    rng = np.random.default_rng(3)
    lengths = set()
    for _ in range(20):
        out = augment.resample(sequence, rng)
        lengths.add(out.shape[0])
        assert 15 <= out.shape[0] <= 45
        assert out.shape[1:] == sequence.shape[1:]
        # Every output frame is one of the input frames, NaNs included.
        for frame in out:
            assert any(np.array_equal(frame, src, equal_nan=True) for src in sequence)
    assert len(lengths) > 5


@pytest.mark.parametrize("name", ["feature_mask", "landmark_dropout"])
def test_masking_only_adds_nans_and_keeps_the_rest(sequence: np.ndarray, name: str) -> None:
    rng = np.random.default_rng(4)
    fn = getattr(augment, name)
    out = fn(sequence, rng, groups(POINTS)) if name == "feature_mask" else fn(sequence, rng)
    assert out.shape == sequence.shape
    before, after = np.isnan(sequence), np.isnan(out)
    assert (after & ~before).any()
    assert not (before & ~after).any()
    kept = ~after
    np.testing.assert_array_equal(out[kept], sequence[kept])


def test_time_mask_hides_one_span_of_whole_frames_in_place(sequence: np.ndarray) -> None:
    rng = np.random.default_rng(4)
    for _ in range(20):
        out = augment.time_mask(sequence, rng)
        assert out.shape == sequence.shape
        hidden = np.isinf(out).all((1, 2))
        where = np.flatnonzero(hidden)
        assert 1 <= where.size <= 9  # at most 30 % of 30 frames
        assert where[-1] - where[0] + 1 == where.size  # one span
        assert (out[hidden] == HIDDEN).all()
        np.testing.assert_array_equal(out[~hidden], sequence[~hidden])
    one = sequence[:1]
    np.testing.assert_array_equal(augment.time_mask(one, rng), one)


def test_flip_swaps_hands_and_mirrored_face_points(sequence: np.ndarray) -> None:
    out = augment.flip(sequence, augment.mirror_permutation(POINTS))
    assert out.shape == sequence.shape
    left = [POS[p] for p in LEFT_HAND]
    right = [POS[p] for p in RIGHT_HAND]
    # The left hand was missing in frames 3-8: after the flip the right hand is, and vice versa.
    assert np.isnan(out[3:9, right]).all()
    assert not np.isnan(out[3:9, left]).any()
    assert np.isnan(out[20, left]).all()
    assert not np.isnan(out[20, right]).any()
    centre = np.nanmean(sequence[..., 0])
    np.testing.assert_allclose(out[0, left, 0], 2 * centre - sequence[0, right, 0], rtol=1e-5)
    np.testing.assert_array_equal(out[0, left, 1], sequence[0, right, 1])
    for a, b in ((LIPS_LEFT[4], LIPS_RIGHT[4]), (EYE_LEFT[0], EYE_RIGHT[0])):
        np.testing.assert_allclose(out[:, POS[a], 0], 2 * centre - sequence[:, POS[b], 0], rtol=1e-5)
    # Mirroring twice is the identity.
    twice = augment.flip(out, augment.mirror_permutation(POINTS))
    np.testing.assert_allclose(twice, sequence, rtol=1e-5, atol=1e-6)


def test_augmenter_is_deterministic_per_seed_and_switchable(sequence: np.ndarray) -> None:
    policy = Augmenter(POINTS, p_temporal=1.0, p_spatial=1.0, p_noise=1.0, p_masking=1.0)
    a = policy(sequence, np.random.default_rng(7))
    b = policy(sequence, np.random.default_rng(7))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, sequence, equal_nan=True)
    off = Augmenter(POINTS, 1.0, 1.0, 1.0, 1.0, enabled=frozenset())
    np.testing.assert_array_equal(off(sequence, np.random.default_rng(7)), sequence)
    never = Augmenter(POINTS, 0.0, 0.0, 0.0, 0.0)
    np.testing.assert_array_equal(never(sequence, np.random.default_rng(7)), sequence)
    only_noise = Augmenter(POINTS, 1.0, 1.0, 1.0, 1.0, enabled=frozenset({"noise"}))
    out = only_noise(sequence, np.random.default_rng(7))
    np.testing.assert_array_equal(np.isnan(out), np.isnan(sequence))
    assert out.shape == sequence.shape


def test_unknown_augmentation_is_named() -> None:
    with pytest.raises(ValueError, match="unknown augmentation"):
        Augmenter(POINTS, enabled=frozenset({"warp"}))
    assert set(ALL) >= {"flip", "resample"}
