"""The ASL loader: worker processes (persistent across epochs, as on a GPU) give exactly
the batches the in-process loader gives, epoch after epoch, and a run that starts at a later
epoch (a resume) gets that epoch's batches."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest
import torch

from training.asl.augment import Augmenter
from training.asl.data import SequenceDataset, loader_settings, make_loader
from training.asl.dataset import LandmarkDataset
from training.asl.landmarks import selected_landmarks

POINTS = selected_landmarks(use_pose=False)
SEQUENCES = 48
BATCH = 8


def _dataset() -> SequenceDataset:
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 20, SEQUENCES)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    frames = rng.uniform(0.2, 0.8, (int(lengths.sum()), 543, 3)).astype(np.float32)
    data = LandmarkDataset(
        frames=frames,
        starts=starts,
        lengths=lengths,
        labels=np.arange(SEQUENCES) % 5,
        participants=np.arange(SEQUENCES) % 4,
        sequence_ids=np.arange(SEQUENCES),
        signs=[f"sign{i}" for i in range(5)],
    )
    return SequenceDataset(data, POINTS, max_len=32, augmenter=Augmenter(POINTS, 1.0, 1.0, 1.0, 1.0))


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
