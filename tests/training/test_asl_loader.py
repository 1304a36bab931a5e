"""The ASL loader: worker processes (persistent across epochs, as on a GPU) give exactly
the batches the in-process loader gives, epoch after epoch, and a run that starts at a later
epoch (a resume) gets that epoch's batches. Each batch is built whole, augmented as one, and
is exactly its samples augmented one by one: worker count, timing and batch size change no
sample."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest
import torch

from training.asl.augment import Augmenter
from training.asl.data import SequenceDataset, collate, loader_settings, make_loader
from training.asl.dataset import LandmarkDataset
from training.asl.landmarks import selected_landmarks

POINTS = selected_landmarks(use_pose=False)
SEQUENCES = 48
BATCH = 8


def _landmarks(low: int, high: int, empty: float = 0.0) -> LandmarkDataset:
    """SEQUENCES random sequences of ``low`` to ``high - 1`` frames, about ``empty`` of the
    frames with no point detected."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(low, high, SEQUENCES)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    frames = rng.uniform(0.2, 0.8, (int(lengths.sum()), 543, 3)).astype(np.float32)
    if empty:
        frames[rng.random(len(frames)) < empty] = np.nan
    return LandmarkDataset(
        frames=frames,
        starts=starts,
        lengths=lengths,
        labels=np.arange(SEQUENCES) % 5,
        participants=np.arange(SEQUENCES) % 4,
        sequence_ids=np.arange(SEQUENCES),
        signs=[f"sign{i}" for i in range(5)],
    )


def _dataset() -> SequenceDataset:
    return SequenceDataset(_landmarks(5, 20), POINTS, max_len=32, augmenter=Augmenter(POINTS, 1.0, 1.0, 1.0, 1.0))


def _epochs(workers: int, epochs: range) -> list[list[dict[str, Any]]]:
    """Every batch of each epoch in ``epochs``, with torch's RNG seeded per epoch as the
    training loop seeds it."""
    loader = make_loader(_dataset(), BATCH, shuffle=True, device=torch.device("cpu"), num_workers=workers)
    assert loader.loader.num_workers == workers
    assert loader.loader.persistent_workers == bool(workers)
    out = []
    for epoch in epochs:
        torch.manual_seed(1000 + epoch)
        out.append(list(loader))
    return out


def _same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x["y"], y["y"])
        and torch.equal(x["lengths"], y["lengths"])
        and torch.equal(x["x"].nan_to_num(-9.0), y["x"].nan_to_num(-9.0))
        for x, y in zip(a, b, strict=True)
    )


def test_persistent_workers_give_the_in_process_batches_every_epoch() -> None:
    in_process = _epochs(0, range(3))
    workers = _epochs(2, range(3))
    assert all(_same(a, b) for a, b in zip(in_process, workers, strict=True))
    # Each epoch its own order and augmentation: the workers, started once, saw new seeds.
    assert not _same(workers[0], workers[1])
    assert not _same(workers[1], workers[2])
    assert sum(len(batch["y"]) for batch in workers[2]) == SEQUENCES


def test_a_run_starting_at_a_later_epoch_gets_that_epochs_batches() -> None:
    uninterrupted = _epochs(2, range(3))
    resumed = _epochs(2, range(2, 3))
    assert _same(uninterrupted[2], resumed[0])


def test_only_a_training_loaders_workers_persist() -> None:
    """Validation and inference start workers per pass: two sets never idle side by side."""
    loader = make_loader(_dataset(), BATCH, shuffle=False, device=torch.device("cpu"), num_workers=2)
    assert loader.loader.num_workers == 2
    assert not loader.loader.persistent_workers
    labels = [batch["y"].tolist() for batch in loader]
    assert labels[0] == [i % 5 for i in range(BATCH)]  # in order


def test_a_consumer_that_stops_early_frees_the_prefetch_thread_even_once_its_source_ran_out() -> None:
    """A replay reads a few batches of an epoch and stops; the reader thread, whose source
    was already read to its end with the buffer full, must give up its last put (it once
    blocked on it for ever, and the replay with it)."""
    from training.asl.data import _prefetch

    source = iter([{"x": torch.zeros(1)} for _ in range(4)])  # one more than the buffer holds
    batches = _prefetch(source, depth=3)
    next(batches)
    time.sleep(0.3)  # the thread fills the buffer and reaches the end of its source
    done = threading.Event()

    def close() -> None:
        batches.close()
        done.set()

    threading.Thread(target=close, daemon=True).start()
    assert done.wait(10), "closing the prefetching iterator never returned"


def test_a_gpu_run_gets_a_loader_worker_per_core_but_one(monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 27 §2: with 4 workers on a 16-core host an H100 waited for its batches.
    import training.asl.data as data

    monkeypatch.setattr(data.os, "sched_getaffinity", lambda pid: set(range(16)))
    assert loader_settings(torch.device("cuda"))["num_workers"] == 15
    monkeypatch.setattr(data.os, "sched_getaffinity", lambda pid: {0})
    assert loader_settings(torch.device("cuda"))["num_workers"] == 1
    assert loader_settings(torch.device("cpu"))["num_workers"] == 0


def _everything() -> SequenceDataset:
    """Sequences of 3 to 39 frames, some frames empty, every augmentation on (the crop and
    max_len cut the longer ones)."""
    data = _landmarks(3, 40, empty=0.1)  # empty frames, which the loader drops
    policy = Augmenter(POINTS, 1.0, 1.0, 1.0, 1.0, p_flip=0.5, p_spatial_mask=1.0, interpolation="mixed", crop=24)
    return SequenceDataset(data, POINTS, 20, policy)


def _same_x(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal to the bit, NaN and ±inf in the same places."""
    return a.shape == b.shape and np.array_equal(a.numpy(), b.numpy(), equal_nan=True)


def _same_batch(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return torch.equal(a["y"], b["y"]) and torch.equal(a["lengths"], b["lengths"]) and _same_x(a["x"], b["x"])


def test_a_batch_is_its_samples_augmented_one_by_one_and_padded() -> None:
    """Empty frames dropped, at most max_len kept, padded with NaN: the batch the per-sample
    path gives, and each sample the same whatever batch it is in."""
    data = _everything()
    keys = [(7, i) for i in range(SEQUENCES)]
    whole = data.batch(keys)
    assert _same_batch(whole, collate([data[key] for key in keys]))
    assert int(whole["lengths"].max()) == 20  # some sequences were cut to max_len
    for start in range(0, SEQUENCES, 7):
        assert _same_batch(data.batch(keys[start : start + 7]), collate([data[key] for key in keys[start : start + 7]]))
    alone = data.batch(keys[3:4])
    assert _same_x(alone["x"][0, : int(alone["lengths"][0])], whole["x"][3, : int(whole["lengths"][3])])


def _samples(batches: list[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
    """Each sample of an epoch, without its padding."""
    return [batch["x"][row, : int(n)] for batch in batches for row, n in enumerate(batch["lengths"])]


def _epoch(data: SequenceDataset, workers: int, batch: int = BATCH, seed: int = 3) -> list[dict[str, torch.Tensor]]:
    loader = make_loader(data, batch, shuffle=True, device=torch.device("cpu"), num_workers=workers)
    assert loader.loader.num_workers == workers
    torch.manual_seed(seed)
    return list(loader)


class Jittery(SequenceDataset):
    """A dataset whose reads take a varying while, so workers finish out of turn."""

    def raw(self, i: int) -> np.ndarray:
        time.sleep(0.001 * (hash((i, time.perf_counter_ns())) % 8))
        return super().raw(i)


def test_worker_count_timing_and_batch_size_change_no_sample() -> None:
    """The adversary's angle: augmentation must come from the seeded streams alone. One,
    two or no loader workers, reads that take varying time, batches of 8 or 5: the same
    samples in the same order, augmented alike."""
    data = _everything()
    in_process = _epoch(data, 0)
    assert all(_same_batch(a, b) for a, b in zip(in_process, _epoch(data, 1), strict=True))
    jittery = Jittery(data.data, POINTS, data.max_len, data.augmenter)
    assert all(_same_batch(a, b) for a, b in zip(in_process, _epoch(jittery, 2), strict=True))
    by_eight, by_five = _samples(in_process), _samples(_epoch(data, 0, batch=5))
    assert len(by_eight) == len(by_five) == SEQUENCES
    assert all(_same_x(a, b) for a, b in zip(by_eight, by_five, strict=True))
    # And the seed matters: another epoch seed orders and augments otherwise.
    assert not all(_same_batch(a, b) for a, b in zip(in_process, _epoch(data, 0, seed=4), strict=True))


class _Counting(SequenceDataset):
    """Counts the batches it builds."""

    built = 0

    def batch(self, keys: Any) -> dict[str, torch.Tensor]:
        type(self).built += 1
        return super().batch(keys)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_replay_starting_mid_epoch_gets_the_epochs_later_batches_without_building_the_earlier(
    workers: int,
) -> None:
    # What a verifier re-executing a segment in the middle of an epoch reads: before, it
    # built (read and augmented) every batch of the epoch before the segment and dropped it.
    dataset = _Counting(_landmarks(5, 20), POINTS, max_len=32, augmenter=Augmenter(POINTS, 1.0, 1.0, 1.0, 1.0))
    loader = make_loader(dataset, BATCH, shuffle=True, device=torch.device("cpu"), num_workers=workers)
    torch.manual_seed(7)
    whole = list(loader)
    for skip in (2, 0, len(whole) - 1, len(whole) + 3):
        torch.manual_seed(7)
        _Counting.built = 0
        later = list(loader.iter_from(skip))
        assert _same(later, whole[skip:]), skip
        if not workers:  # the workers' processes count their own copies
            assert _Counting.built == len(whole[skip:]), skip
    # The skip held for that iteration only: the next epoch is whole.
    torch.manual_seed(7)
    assert _same(list(loader), whole)
