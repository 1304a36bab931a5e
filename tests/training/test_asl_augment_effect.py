"""Each augmentation changes what the model sees: its features after the real featurizer.

The featurizer centres each sequence on its reference point's mean and divides by one
standard deviation, so an augmentation that this normalisation undoes (a constant shift, a
uniform zoom) would only cost time. These tests run the generated data through the path
training uses (augment, drop empty frames, collate, the model's featurizer) and measure
the change in the features.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from training.asl import augment
from training.asl.augment import Augmenter
from training.asl.data import SequenceDataset, collate
from training.asl.dataset import LandmarkDataset, load_dataset
from training.asl.landmarks import groups, selected_landmarks
from training.asl.preprocess import Featurizer, drop_empty_frames
from training.asl.synthetic import generate

POINTS = selected_landmarks(use_pose=False)
MAX_LEN = 64
SEEDS = range(8)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> LandmarkDataset:
    root = tmp_path_factory.mktemp("asl-augment")
    folder = generate(root / "set", n_signs=4, n_participants=2, per_participant=1, min_frames=30, max_frames=40)
    return load_dataset(folder, cache_dir=root / "cache")


def features(x: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's input for one sequence of the selected points, as training computes it."""
    batch = collate([{"x": drop_empty_frames(x.astype(np.float32, copy=False), MAX_LEN), "y": 0}])
    feats, mask = Featurizer(POINTS, MAX_LEN)(batch["x"], batch["lengths"])
    return feats[0], mask[0]


def relative_change(before: torch.Tensor, after: torch.Tensor) -> float:
    return float((after - before).norm() / before.norm())


SPATIAL: dict[str, Callable[[np.ndarray, np.random.Generator], np.ndarray]] = {
    "rotate": augment.rotate,
    "scale": augment.scale,
    "shear": augment.shear,
    "translate": augment.translate,
    "noise": augment.noise,
    "flip": lambda x, rng: augment.flip(x, augment.mirror_permutation(POINTS)),
    "time_mask": augment.time_mask,
    "feature_mask": lambda x, rng: augment.feature_mask(x, rng, groups(POINTS)),
    "landmark_dropout": augment.landmark_dropout,
}


@pytest.mark.parametrize("name", sorted(SPATIAL))
def test_each_augmentation_changes_the_normalised_features_and_keeps_the_frame_count(
    data: LandmarkDataset, name: str
) -> None:
    points = np.asarray(POINTS)
    changes = []
    for i in range(len(data)):
        x = np.asarray(data.sequence(i)[:, points], dtype=np.float32)
        before, before_mask = features(x)
        for seed in SEEDS:
            after, after_mask = features(SPATIAL[name](x, np.random.default_rng((seed, i))))
            # Frames are moved, hidden or masked, never removed: the model sees as many.
            assert after.shape == before.shape
            assert torch.equal(after_mask, before_mask)
            changes.append(relative_change(before, after))
    # A material change on (nearly) every draw, not one a normalisation undoes.
    assert np.median(changes) > 2e-2, f"{name}: median relative change {np.median(changes):.2e}"
    # (feature_mask may hide a hand that a one-handed sign never shows.)
    assert np.mean(np.asarray(changes) > 1e-3) > 0.8, f"{name}: too many draws change nothing"


def test_resample_changes_the_frame_count(data: LandmarkDataset) -> None:
    x = np.asarray(data.sequence(0)[:, np.asarray(POINTS)], dtype=np.float32)
    lengths = {int(features(augment.resample(x, np.random.default_rng(s)))[1].sum()) for s in SEEDS}
    assert len(lengths) > 3


def test_time_mask_in_training_keeps_each_frame_in_place_and_shows_the_span_as_zeros(data: LandmarkDataset) -> None:
    """Through the training dataset: a masked span is still there, at its place, all zeros."""
    plain = SequenceDataset(data, POINTS, MAX_LEN)
    masked = SequenceDataset(data, POINTS, MAX_LEN, Augmenter(POINTS, 1.0, 0.0, 0.0, 0.0, frozenset({"time_mask"})))
    featurizer = Featurizer(POINTS, MAX_LEN)
    spans = 0
    for i in range(len(data)):
        base = collate([plain[i]])
        before, before_mask = featurizer(base["x"], base["lengths"])
        for seed in SEEDS:
            batch = collate([masked[(seed, i)]])
            assert torch.equal(batch["lengths"], base["lengths"])
            after, after_mask = featurizer(batch["x"], batch["lengths"])
            assert torch.equal(after_mask, before_mask)
            hidden = (after[0].abs().sum(-1) == 0) & after_mask[0]
            if not hidden.any():
                continue
            spans += 1
            # One contiguous span; every other frame's positions are as before up to the
            # renormalisation (the hidden frames no longer count towards centre and scale).
            where = torch.nonzero(hidden)[:, 0]
            assert int(where[-1] - where[0]) + 1 == int(hidden.sum())
            assert int(hidden.sum()) < int(before_mask.sum())
            assert (before[0, hidden].abs().sum(-1) > 0).all()
    assert spans >= len(data) * len(SEEDS) // 4


def test_spatial_mask_hides_exactly_the_points_inside_one_square(data: LandmarkDataset) -> None:
    """It hides every detected point inside the square its draws give (corner anywhere in the
    image, side 0.5–1) and nothing else: every point outside keeps its values."""
    points = np.asarray(POINTS)
    hid_any = 0
    for i in range(len(data)):
        x = np.asarray(data.sequence(i)[:, points], dtype=np.float32)
        for seed in SEEDS:
            out = augment.spatial_mask(x, np.random.default_rng((seed, i)))
            corner = np.random.default_rng((seed, i)).uniform(0.0, 1.0, 2)
            side = float(np.random.default_rng((seed, i)).uniform(0.0, 1.0, 3)[2] * 0.5 + 0.5)
            seen = np.isfinite(x).all(-1)
            inside = seen & ((x[..., :2] > corner) & (x[..., :2] < corner + side)).all(-1)
            assert np.isnan(out[inside]).all()
            np.testing.assert_array_equal(out[~inside], x[~inside])
            hid_any += int(inside.any())
    assert hid_any >= len(data) * len(SEEDS) // 4


def test_linear_resampling_makes_frames_between_their_neighbours(data: LandmarkDataset) -> None:
    x = np.asarray(data.sequence(0)[:, np.asarray(POINTS)], dtype=np.float32)
    between = 0
    for seed in SEEDS:
        out = augment.resample(x, np.random.default_rng(seed), linear=True)
        nearest = augment.resample(x, np.random.default_rng(seed))
        assert out.shape[0] == nearest.shape[0]  # the same speed change, another way to fill it
        where = np.arange(out.shape[0]) * (x.shape[0] - 1) / (out.shape[0] - 1)
        for k, t in enumerate(where):
            lo = min(int(np.floor(t)), x.shape[0] - 2)
            a, b = x[lo], x[lo + 1]
            ok = np.isfinite(a) & np.isfinite(b)
            low, high = np.minimum(a, b)[ok], np.maximum(a, b)[ok]
            assert ((out[k][ok] >= low - 1e-6) & (out[k][ok] <= high + 1e-6)).all()
            between += int(((out[k][ok] > low + 1e-6) & (out[k][ok] < high - 1e-6)).any())
            # A point seen on one side only keeps the nearer frame's value.
            near = x[int(np.rint(t))]
            one_side = ~ok
            np.testing.assert_array_equal(out[k][one_side], near[one_side])
    assert between > len(SEEDS) * 5  # new positions, not copies of the original frames


def test_random_crop_returns_a_window_of_contiguous_frames_from_a_seeded_start(data: LandmarkDataset) -> None:
    """Through the training dataset: the crop comes from the sample's seeded stream (the
    same epoch seed gives the same window), different seeds give different windows, and
    each window is that many consecutive frames of the sequence."""
    length = 12
    policy = Augmenter(POINTS, 0.0, 0.0, 0.0, 0.0, frozenset({"crop"}), p_flip=0.0, crop=length)
    cropped = SequenceDataset(data, POINTS, length, policy)
    whole = SequenceDataset(data, POINTS, 1000)
    for i in range(len(data)):
        full = whole[i]["x"]
        starts = set()
        for seed in SEEDS:
            window = cropped[(seed, i)]["x"]
            assert window.shape[0] <= length
            np.testing.assert_array_equal(window, cropped[(seed, i)]["x"])
            raw = np.asarray(data.sequence(i)[:, np.asarray(POINTS)], dtype=np.float32)
            matches = [
                start
                for start in range(raw.shape[0] - length + 1)
                if np.array_equal(window, drop_empty_frames(raw[start : start + length], length), equal_nan=True)
            ]
            assert matches, "the window is no run of consecutive frames"
            starts.add(matches[0])
        assert len(starts) > 3
        # Without the crop the first max_len frames are the sequence's start.
        np.testing.assert_array_equal(SequenceDataset(data, POINTS, length)[i]["x"], full[:length])
