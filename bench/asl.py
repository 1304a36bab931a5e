"""ASL benchmark: the reader's sequences/s, and training samples/s at dim 192 for the model
alone and end to end (cache → augmentation in the loader → training), in the steady state.

Run: .venv/bin/python bench/asl.py [--sequences 800] [--threads 2] [--batch 12] [--device cuda]

A real run reads its dataset once into the cache and then trains for many epochs from it, so
the figures are split the same way:

- **first read**: parquet → cache, sequences/s (target ≥ 500 on two cores);
- **augmentation**: µs a sample, of a padded batch of ``--batch`` at once (as the loader
  does) and of each sample alone;
- **start-up**: from the start of training to its first step (loader workers starting,
  their first batches, the first kernels), in seconds;
- **steady state**: samples/s over the epochs after the first, for the model alone (the
  same training on batches augmented in advance, so the input pipeline costs nothing) and
  end to end (the trainer's own loader augmenting as it goes). Their ratio says whether the
  input pipeline keeps up: target ≥ 0.8 on two CPU cores at batch 12, ≥ 0.9 on a GPU at
  batch 128 (``--device cuda --batch 128``).

Each epoch visits the generated sequences ``--repeat`` times (each visit augmented afresh),
so that an epoch is long enough for its boundary not to dominate, as in a real dataset of
tens of thousands of sequences. On CUDA the model trains on the GPU (fp16 autocast unless
--fp32) while reading and augmentation stay on the CPU. The last line is one JSON object
with the figures and targets.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from torch.utils.data import Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from training.asl.augment import Augmenter
from training.asl.data import SequenceDataset, loader_settings, make_loader, pad
from training.asl.dataset import load_dataset
from training.asl.model import ModelConfig, SignModel
from training.asl.synthetic import generate
from training.device import autocast_dtype, select_device
from training.loop import LoopConfig, fit

READER_TARGET = 500.0
E2E_TARGET_CPU = 0.8
E2E_TARGET_CUDA = 0.9
SHORT_DTYPE = {torch.bfloat16: "bf16", None: "fp32"}


def step_fn(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, Any]]:
    logits = model(batch["x"], batch["lengths"]).float()
    return F.cross_entropy(logits, batch["y"], label_smoothing=0.1), {}


def no_eval(model: torch.nn.Module, loader: Any) -> dict[str, float]:
    return {"val_loss": 0.0}


class Repeated(Dataset[dict[str, Any]]):
    """``dataset`` visited ``times`` times per epoch, each visit with its own augmentation seed."""

    def __init__(self, dataset: SequenceDataset, times: int) -> None:
        self.dataset, self.times, self.size = dataset, times, len(dataset)

    def __len__(self) -> int:
        return self.size * self.times

    def inner(self, key: int | tuple[int, int]) -> tuple[int, int]:
        """The wrapped dataset's key for ``key``."""
        seed, i = key if isinstance(key, tuple) else (0, key)
        return seed * self.times + i // self.size, i % self.size

    def __getitem__(self, key: int | tuple[int, int]) -> dict[str, Any]:
        return self.dataset[self.inner(key)]

    def batch(self, keys: Sequence[int | tuple[int, int]]) -> dict[str, torch.Tensor]:
        return self.dataset.batch([self.inner(key) for key in keys])


def augmentation_us_per_sample(dataset: SequenceDataset, batch: int, batches: int) -> tuple[float, float]:
    """Microseconds per sample that augmentation takes (median over ``batches`` batches of
    ``batch`` sequences): of a padded batch at once, as the loader does, and of each
    sample alone."""
    augmenter = cast(Augmenter, dataset.augmenter)
    together, alone = [], []
    for k in range(batches):
        keys = [(k, (k * batch + j) % len(dataset)) for j in range(batch)]
        raw = [dataset.raw(i) for _, i in keys]
        x, lengths = pad(raw)
        started = time.perf_counter()
        augmenter.batch(x, lengths, [np.random.default_rng(key) for key in keys])
        together.append((time.perf_counter() - started) / batch)
        started = time.perf_counter()
        for key, seq in zip(keys, raw, strict=True):
            augmenter(seq, np.random.default_rng(key))
        alone.append((time.perf_counter() - started) / batch)
    return 1e6 * statistics.median(together), 1e6 * statistics.median(alone)


class StepClock:
    """The time of each optimizer step, from the loop's progress events."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.steps: list[tuple[int, float]] = []  # (epoch, time)

    def __call__(self, event: dict[str, Any]) -> None:
        if event.get("event") == "step":
            self.steps.append((int(event["epoch"]), time.perf_counter()))

    def startup_s(self) -> float:
        """From the start of training to the end of its first step."""
        return self.steps[0][1] - self.started

    def steady_samples_per_s(self, batch: int) -> float:
        """Samples/s over every epoch after the first: from the first epoch's last step to the end."""
        first = self.steps[0][0]
        boundary = max(i for i, (epoch, _) in enumerate(self.steps) if epoch == first)
        steps = len(self.steps) - 1 - boundary
        if steps <= 0:
            raise SystemExit("the steady state needs at least two epochs (--epochs)")
        return steps * batch / (self.steps[-1][1] - self.steps[boundary][1])


def train(loader: Any, classes: int, epochs: int, args: argparse.Namespace) -> StepClock:
    torch.manual_seed(0)
    model = SignModel(ModelConfig(num_classes=classes, dim=192, blocks=2, max_len=384))
    config = LoopConfig(epochs=epochs, mixed_precision=not args.fp32, restore_best=False, device=args.device, seed=0)
    clock = StepClock()
    fit(model, loader, [], step_fn, no_eval, config, progress=clock)
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    return clock


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sequences", type=int, default=800, help="synthetic sequences (20 signs × 8 participants × n)"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads and reader threads")
    parser.add_argument("--batch", type=int, default=12)
    parser.add_argument("--epochs", type=int, default=3, help="epochs per measurement; all but the first are timed")
    parser.add_argument("--repeat", type=int, default=1, help="visits of each sequence per epoch")
    parser.add_argument("--rounds", type=int, default=2, help="measurements of each kind, interleaved (median)")
    parser.add_argument("--fp32", action="store_true", help="train without autocast (bf16 on CPU, fp16 on CUDA)")
    parser.add_argument("--device", default="cpu", help="where the model trains: cpu (default) or cuda")
    parser.add_argument("--loader-workers", type=int, default=None, help="override the DataLoader workers")
    parser.add_argument("--repeats", type=int, default=3, help="reader measurements per thread count (median)")
    args = parser.parse_args()
    try:
        device = select_device(args.device)
    except ValueError as exc:
        parser.error(str(exc))
    if args.epochs < 2:
        parser.error("--epochs must be at least 2: the first epoch is start-up, the rest the steady state")
    torch.set_num_threads(args.threads)
    per = max(1, args.sequences // 160)
    with tempfile.TemporaryDirectory(prefix="asl-bench-") as tmp:
        root = Path(tmp)
        started = time.perf_counter()
        archive = generate(root / "data.zip", n_signs=20, n_participants=8, per_participant=per,
                           min_frames=10, max_frames=80, as_zip=True)  # fmt: skip
        generate_s = time.perf_counter() - started
        print(f"generated {160 * per} sequences in {generate_s:.1f} s", flush=True)
        points = ModelConfig(num_classes=20).points  # the cache holds the model's points

        reader: dict[int, float] = {}
        for workers in sorted({1, args.threads}):
            rates = []
            for repeat in range(args.repeats):
                started = time.perf_counter()
                data = load_dataset(archive, root / f"cache{workers}-{repeat}", points=points, workers=workers)
                rates.append(len(data) / (time.perf_counter() - started))
            reader[workers] = statistics.median(rates)
            print(f"first read, {workers} thread(s): {reader[workers]:.0f} sequences/s", flush=True)

        classes = len(data.signs)
        live = Repeated(SequenceDataset(data, points, 384, Augmenter(points)), args.repeat)
        steps_per_epoch = len(live) // args.batch
        # Model alone: batches augmented in advance (resampling changes lengths, so
        # un-augmented batches would be a different workload), a few dozen visited per epoch.
        prepared = min(steps_per_epoch, 32)
        order = torch.randperm(len(live), generator=torch.Generator().manual_seed(1)).tolist()
        ready = [live.batch([(0, order[i * args.batch + j]) for j in range(args.batch)]) for i in range(prepared)]
        augment_us, augment_alone_us = augmentation_us_per_sample(live.dataset, args.batch, min(prepared, 16))
        print(
            f"augmentation: {augment_us:.0f} µs a sample in batches of {args.batch}, {augment_alone_us:.0f} alone",
            flush=True,
        )
        alone_epochs = max(args.epochs, 1 + -(-steps_per_epoch * (args.epochs - 1) // prepared))

        def model_alone() -> float:
            clock = train(ready, classes, alone_epochs, args)
            return clock.steady_samples_per_s(args.batch)

        startups: list[float] = []

        def end_to_end() -> float:
            loader = make_loader(
                live,
                args.batch,
                shuffle=True,
                device=device,
                drop_last=True,
                num_workers=args.loader_workers,
            )
            clock = train(loader, classes, args.epochs, args)
            startups.append(clock.startup_s())
            return clock.steady_samples_per_s(args.batch)

        train(ready[: min(4, prepared)], classes, 2, args)  # warm-up: allocator, kernels, caches
        # Interleaved, because load from elsewhere on the machine drifts during the run.
        alone_runs, e2e_runs = [], []
        for _ in range(args.rounds):
            alone_runs.append(model_alone())
            print(f"model alone, steady state: {alone_runs[-1]:.1f} samples/s", flush=True)
            e2e_runs.append(end_to_end())
            print(f"end to end, steady state: {e2e_runs[-1]:.1f} samples/s (start-up {startups[-1]:.2f} s)", flush=True)
        alone, e2e = statistics.median(alone_runs), statistics.median(e2e_runs)
        mean_frames = float(data.lengths.mean())

    best_reader = max(reader.values())
    ratio = e2e / alone
    cuda = device.type == "cuda"
    target = E2E_TARGET_CUDA if cuda else E2E_TARGET_CPU
    workers = loader_settings(device)["num_workers"] if args.loader_workers is None else args.loader_workers
    print(
        json.dumps(
            {
                "bench": "asl",
                "device": args.device,
                "device_name": torch.cuda.get_device_name(0) if cuda else "cpu",
                "cpu_cores": len(os.sched_getaffinity(0)),
                "threads": args.threads,
                "batch": args.batch,
                "sequences": 160 * per,
                "epoch_samples": steps_per_epoch * args.batch,
                "generate_s": round(generate_s, 1),
                "reader_seq_per_s": round(best_reader, 1),
                "reader_seq_per_s_1thread": round(reader[1], 1),
                "reader_frames_per_s": round(best_reader * mean_frames),
                "mean_frames": round(mean_frames, 1),
                "reader_target": READER_TARGET,
                "reader_ok": best_reader >= READER_TARGET,
                "augment_us_per_sample": round(augment_us, 1),
                "augment_us_per_sample_alone": round(augment_alone_us, 1),
                "startup_s": round(statistics.median(startups), 3),
                "model_alone_samples_per_s": round(alone, 1),
                "end_to_end_samples_per_s": round(e2e, 1),
                "end_to_end_ratio": round(ratio, 3),
                "end_to_end_target": target,
                "end_to_end_ok": ratio >= target,
                "dim": 192,
                "mixed_precision": "fp32" if args.fp32 else SHORT_DTYPE[autocast_dtype(device)],
                "loader_workers": workers,
            }
        )
    )


if __name__ == "__main__":
    main()
