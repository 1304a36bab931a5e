"""From a cached dataset to batches: participant split, padding, augmentation of the batch.

A batch is ``{"x": [B, T, P, 3] raw landmarks (NaN-padded), "lengths": [B], "y": [B]}``;
the model's featurizer turns it into features, so the exported graph and training share
one implementation of preprocessing. The loader builds each batch whole
(``SequenceDataset.batch``): it pads the raw sequences, augments the padded batch at once
and drops empty frames, which gives exactly the batch that augmenting each sample alone
and padding would.
"""

from __future__ import annotations

import math
import os
import queue
import threading
from collections.abc import Generator, Iterator, Sequence
from typing import Any, Protocol

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler, Sampler, SequentialSampler

from training.asl.augment import Augmenter
from training.asl.dataset import LandmarkDataset
from training.asl.preprocess import drop_empty_frames
from training.device import pin_memory


def split_by_participant(
    participants: np.ndarray, fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Row indices (train, validation) with no participant in both, and the held-out ids.

    At least one participant goes each way; which ones depends only on the ids and ``seed``.
    """
    ids = np.unique(participants)
    if ids.size < 2:
        raise ValueError("a participant-disjoint split needs sequences from at least 2 participants")
    count = min(ids.size - 1, max(1, math.ceil(fraction * ids.size)))
    held = np.sort(np.random.default_rng(seed).permutation(ids)[:count])
    is_val = np.isin(participants, held)
    return np.flatnonzero(~is_val), np.flatnonzero(is_val), [int(i) for i in held]


class SequenceDataset(Dataset[dict[str, Any]]):
    """Sequences of a LandmarkDataset restricted to the model's points, optionally augmented."""

    def __init__(
        self, data: LandmarkDataset, points: list[int], max_len: int, augmenter: Augmenter | None = None
    ) -> None:
        self.data = data
        # Where the model's points are in the cache: None when the cache holds exactly them.
        self.columns = data.columns(points)
        self.max_len = max_len
        self.augmenter = augmenter

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, key: int | tuple[int, int]) -> dict[str, Any]:
        """Sample ``i``, or ``(seed, i)``: sample ``i`` augmented as the epoch's ``seed`` says.

        The seed travels with the index (``SeededSampler``), so the result depends on
        neither thread, worker process nor batch order.
        """
        seed, i = key if isinstance(key, tuple) else (0, key)
        x = self.raw(i)
        if self.augmenter is not None:
            x = self.augmenter(x, np.random.default_rng((seed, i)))
        x = drop_empty_frames(x, self.max_len)
        return {"x": x, "y": int(self.data.labels[i])}

    def raw(self, i: int) -> np.ndarray:
        """Sequence ``i``'s model points, float32."""
        seq = self.data.sequence(i)
        return np.array(seq if self.columns is None else seq[:, self.columns], dtype=np.float32)

    def batch(self, keys: Sequence[int | tuple[int, int]]) -> dict[str, torch.Tensor]:
        """The batch of ``keys`` (as ``__getitem__`` takes them): exactly
        ``collate([self[key] for key in keys])``, each sample augmented by its own seeded
        generator, but padded first and augmented as one batch."""
        pairs = [key if isinstance(key, tuple) else (0, key) for key in keys]
        x, lengths = pad([self.raw(i) for _, i in pairs])
        if self.augmenter is not None:
            x, lengths = self.augmenter.batch(x, lengths, [np.random.default_rng(pair) for pair in pairs])
        x, lengths = _drop_empty_frames(x, lengths, self.max_len)
        return {
            "x": torch.from_numpy(x),
            "lengths": torch.from_numpy(lengths),
            "y": torch.tensor([int(self.data.labels[i]) for _, i in pairs], dtype=torch.long),
        }


def pad(sequences: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """[B, T, P, 3] float32, NaN after each sequence's frames (T the longest, at least 1), and the lengths."""
    lengths = np.array([len(seq) for seq in sequences], dtype=np.int64)
    x = np.full((len(sequences), max(1, int(lengths.max())), sequences[0].shape[1], 3), np.nan, dtype=np.float32)
    for row, seq in enumerate(sequences):
        x[row, : len(seq)] = seq
    return x, lengths


def _drop_empty_frames(x: np.ndarray, lengths: np.ndarray, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """``drop_empty_frames`` on each row of a padded batch: its kept frames moved to the
    front in order, the first ``max_len`` of them kept, NaN after; the batch as long as its
    longest row (at least 1 frame)."""
    xy = x[..., :2]
    keep = np.isfinite(xy).all(-1).any(-1) | np.isinf(xy).any((-1, -2))
    keep &= np.arange(x.shape[1])[None, :] < lengths[:, None]
    kept = np.minimum(keep.sum(1), max_len)
    order = np.argsort(~keep, axis=1, kind="stable")[:, : max(1, int(kept.max(initial=0)))]
    out = x[np.arange(x.shape[0])[:, None], order]
    out[np.arange(order.shape[1])[None, :] >= kept[:, None]] = np.nan
    return out, kept.astype(np.int64)


def collate(items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Pad a list of samples with NaN into one batch."""
    x, lengths = pad([item["x"] for item in items])
    return {
        "x": torch.from_numpy(x),
        "lengths": torch.from_numpy(lengths),
        "y": torch.tensor([item["y"] for item in items], dtype=torch.long),
    }


class Batchable(Protocol):
    """What a loader reads: a sized dataset that builds a whole batch from a list of keys."""

    def __len__(self) -> int: ...

    def batch(self, keys: Sequence[int | tuple[int, int]]) -> dict[str, torch.Tensor]: ...


class _Batches(Dataset[dict[str, torch.Tensor]]):
    """``dataset``'s batches, keyed by the list of sample keys each one holds."""

    def __init__(self, dataset: Batchable) -> None:
        self.dataset = dataset

    def __getitem__(self, keys: list[tuple[int, int]]) -> dict[str, torch.Tensor]:
        return self.dataset.batch(keys)


def loader_settings(device: torch.device) -> dict[str, Any]:
    """DataLoader workers and pinning for ``device``.

    On CPU the trainer already uses every core, and a sample costs well under a
    millisecond to prepare, so loading stays in-process. On a GPU, workers prepare the
    next batches while the GPU computes, and pinned memory speeds the copy.
    """
    if device.type != "cuda":
        return {"num_workers": 0, "pin_memory": False}
    # One worker per core this process may use, less the one that drives the GPU: a worker
    # prepares a batch of 128 in about as long as an H100 trains on 25 (issue 27 measured
    # 2,300 samples/s with 4 workers, 5,700 with 15, against 2,750 for the model alone).
    workers = max(1, len(os.sched_getaffinity(0)) - 1)
    return {"num_workers": workers, "pin_memory": pin_memory(device)}


class SeededSampler(Sampler[tuple[int, int]]):
    """The indices of ``order`` (shuffled by ``generator``, or in sequence), each paired with
    the epoch's augmentation seed.

    It runs in the main process, so the seed set for an epoch reaches worker processes
    with the indices: workers kept from one epoch to the next (persistent, started once per
    run) augment exactly as fresh ones, or the main process, would.
    """

    def __init__(self, size: int, shuffle: bool) -> None:
        self.generator = torch.Generator()
        self.order: Sampler[int] = (
            RandomSampler(range(size), generator=self.generator) if shuffle else SequentialSampler(range(size))
        )
        self.seed = 0

    def __len__(self) -> int:
        return len(self.order)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[tuple[int, int]]:
        seed = self.seed
        return ((seed, i) for i in self.order)


class BatchKeys(Sampler[list[tuple[int, int]]]):
    """``sampler``'s keys in lists of ``size``, in its order: the last list shorter, or
    left out with ``drop_last``. ``skip`` lists are left out at the start of the next
    iteration only (``EpochLoader.iter_from``): their keys are drawn, their samples never
    read or augmented."""

    def __init__(self, sampler: SeededSampler, size: int, drop_last: bool) -> None:
        self.sampler, self.size, self.drop_last = sampler, size, drop_last
        self.skip = 0

    def __len__(self) -> int:
        whole, rest = divmod(len(self.sampler), self.size)
        return whole + int(bool(rest) and not self.drop_last)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        # ``skip`` is taken when the first list is asked for: DataLoader makes (and drops)
        # more than one of these iterators before it reads from one.
        skip, self.skip = self.skip, 0
        keys: list[tuple[int, int]] = []
        for key in self.sampler:
            keys.append(key)
            if len(keys) == self.size:
                if skip:
                    skip -= 1
                else:
                    yield keys
                keys = []
        if keys and not self.drop_last and not skip:
            yield keys


class EpochLoader:
    """A DataLoader whose shuffling and augmentation replay exactly on resume.

    At the start of each epoch it draws one seed from torch's global RNG (which the shared
    loop re-seeds per epoch) and derives the order and every augmentation from it, and
    nothing else draws from that RNG here: a resumed run's first epoch, which starts the
    worker processes, draws what an uninterrupted run's later epoch does. Without worker
    processes (CPU), a background thread prepares the next batches while the main thread
    trains: augmentation is numpy and torch kernels release the GIL, so the two overlap.
    """

    def __init__(self, loader: DataLoader[dict[str, Any]], sampler: SeededSampler) -> None:
        self.loader = loader
        self.sampler = sampler

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return self.iter_from(0)

    def iter_from(self, skip: int) -> Iterator[dict[str, torch.Tensor]]:
        """The epoch's batches after its first ``skip``, which are never built: each
        sample's augmentation is seeded by the epoch's seed and its index, not by what was
        drawn before it, so the batches that follow are those of the whole epoch. What a
        replay of a segment in the middle of an epoch reads (``training.loop``)."""
        seed = int(torch.randint(0, 2**31 - 1, (1,)).item())
        self.sampler.seed = seed
        self.sampler.generator.manual_seed(seed)
        keys = self.loader.batch_sampler if self.loader.batch_sampler is not None else self.loader.sampler
        if isinstance(keys, BatchKeys):
            keys.skip = max(0, skip)
        if self.loader.num_workers:
            return iter(self.loader)
        return _prefetch(iter(self.loader))


_END = object()


def _prefetch(source: Iterator[dict[str, torch.Tensor]], depth: int = 3) -> Generator[dict[str, torch.Tensor]]:
    """Items of ``source`` produced by a background thread, up to ``depth`` ahead."""
    buffer: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def offer(item: Any) -> bool:
        """Put ``item`` once there is room; False when the consumer has gone (a full buffer
        then never drains, so every put must give up)."""
        while not stop.is_set():
            try:
                buffer.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in source:
                if not offer(item):
                    return
            offer(_END)
        except BaseException as exc:  # handed to the consumer, which re-raises it
            offer(exc)

    thread = threading.Thread(target=produce, name="asl-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item = buffer.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join()


def make_loader(
    dataset: Batchable,
    batch_size: int,
    shuffle: bool,
    device: torch.device,
    drop_last: bool = False,
    num_workers: int | None = None,
) -> EpochLoader:
    """An EpochLoader with the device's worker and pinning settings (``num_workers`` overrides)."""
    settings = loader_settings(device)
    if num_workers is not None:
        settings["num_workers"] = num_workers
    if settings["num_workers"] and len(dataset) < 4 * batch_size:
        settings = {"num_workers": 0, "pin_memory": settings["pin_memory"]}
    sampler = SeededSampler(len(dataset), shuffle)
    loader: DataLoader[dict[str, Any]] = DataLoader(
        _Batches(dataset),
        # Each of the sampler's lists of keys is one batch, built whole by one worker (or the
        # prefetching thread): the workers split the batches, never a batch.
        sampler=BatchKeys(sampler, batch_size, drop_last),
        batch_size=None,
        # A training loader's workers persist: a GPU run starts them once, not every epoch.
        # Validation and inference start theirs per pass, so two sets never idle side by
        # side. The loader's own generator seeds only the workers' RNGs (augmentation takes
        # its seed from the sampler), and keeps DataLoader off the global RNG the loop seeds.
        persistent_workers=bool(settings["num_workers"]) and shuffle,
        generator=torch.Generator().manual_seed(0),
        **settings,
    )
    return EpochLoader(loader, sampler)
