"""ASL benchmark: the reader's sequences/s, and training samples/s at dim 192 for the model
alone and end to end (reading, augmentation and training together), on the CPU by default.

Run: .venv/bin/python bench/asl.py [--sequences 800] [--threads 2] [--device cuda]
Targets on two cores: reader >= 500 sequences/s; end to end >= 80 % of model alone.
On CUDA the model trains on the GPU (fp16 autocast unless --fp32) while reading and
augmentation stay on the CPU, so the ratio shows whether the input pipeline keeps up.
The last line is one JSON object with the headline figures and targets.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from training.asl.augment import Augmenter
from training.asl.data import SequenceDataset, collate, loader_settings, make_loader
from training.asl.dataset import load_dataset
from training.asl.model import ModelConfig, SignModel
from training.asl.synthetic import generate
from training.device import autocast_dtype, select_device
from training.loop import LoopConfig, fit

READER_TARGET = 500.0
E2E_TARGET = 0.8
SHORT_DTYPE = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def step_fn(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, Any]]:
    logits = model(batch["x"], batch["lengths"]).float()
    return F.cross_entropy(logits, batch["y"], label_smoothing=0.1), {}


def no_eval(model: torch.nn.Module, loader: Any) -> dict[str, float]:
    return {"val_loss": 0.0}


def train_seconds(loader: Any, classes: int, batches: int, args: argparse.Namespace) -> float:
    torch.manual_seed(0)
    model = SignModel(ModelConfig(num_classes=classes, dim=192, blocks=2, max_len=384))
    config = LoopConfig(
        epochs=1,
        grad_accumulation=4,
        mixed_precision=not args.fp32,
        max_steps_per_epoch=batches // 4,
        restore_best=False,
        device=args.device,
    )
    started = time.perf_counter()
    fit(model, loader, [], step_fn, no_eval, config)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sequences", type=int, default=800, help="synthetic sequences (20 signs × 8 participants × n)"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=12)
    parser.add_argument("--fp32", action="store_true", help="train without autocast (bf16 on CPU, fp16 on CUDA)")
    parser.add_argument("--device", default="cpu", help="where the model trains: cpu (default) or cuda")
    parser.add_argument("--loader-workers", type=int, default=None, help="override the DataLoader workers")
    parser.add_argument("--repeats", type=int, default=3, help="reader measurements per thread count (median)")
    args = parser.parse_args()
    try:
        device = select_device(args.device)
    except ValueError as exc:
        parser.error(str(exc))
    torch.set_num_threads(args.threads)
    per = max(1, args.sequences // 160)
    with tempfile.TemporaryDirectory(prefix="asl-bench-") as tmp:
        root = Path(tmp)
        started = time.perf_counter()
        archive = generate(root / "data.zip", n_signs=20, n_participants=8, per_participant=per,
                           min_frames=10, max_frames=80, as_zip=True)  # fmt: skip
        print(f"generated {160 * per} sequences in {time.perf_counter() - started:.1f} s", flush=True)
        points = ModelConfig(num_classes=20).points  # the cache holds the model's points

        reader: dict[int, float] = {}
        for workers in (1, args.threads):
            rates = []
            for repeat in range(args.repeats):
                started = time.perf_counter()
                data = load_dataset(archive, root / f"cache{workers}-{repeat}", points=points, workers=workers)
                rates.append(len(data) / (time.perf_counter() - started))
            reader[workers] = statistics.median(rates)
            print(f"reader, {workers} thread(s): {reader[workers]:.0f} sequences/s", flush=True)

        # Model alone: the same training on augmented batches prepared in advance (resampling
        # changes lengths, so un-augmented batches would be a different workload).
        augmented = SequenceDataset(data, points, 384, Augmenter(points))
        batches = (len(data) // args.batch) // 4 * 4
        torch.manual_seed(1)
        order = torch.randperm(len(data)).tolist()
        ready = [collate([augmented[order[i * args.batch + j]] for j in range(args.batch)]) for i in range(batches)]
        train_seconds(ready[:8], len(data.signs), 8, args)  # warm-up: allocator, kernels, caches

        def model_alone() -> float:
            return batches * args.batch / train_seconds(ready, len(data.signs), batches, args)

        def end_to_end(round_: int) -> float:
            # parquet → cache → augmented DataLoader → the same training, timed together.
            started = time.perf_counter()
            fresh = load_dataset(archive, root / f"cache-e2e-{round_}", points=points, workers=args.threads)
            read_s = time.perf_counter() - started
            live = SequenceDataset(fresh, points, 384, Augmenter(points))
            loader = make_loader(
                live,
                args.batch,
                shuffle=True,
                device=device,
                drop_last=True,
                num_workers=args.loader_workers,
            )
            rate = batches * args.batch / (read_s + train_seconds(loader, len(fresh.signs), batches, args))
            print(f"end to end (read {read_s:.2f} s + augment + train): {rate:.1f} samples/s", flush=True)
            return rate

        # Interleaved, because load from elsewhere on the machine drifts during the run.
        alone_runs, e2e_runs = [], []
        for round_ in range(2):
            alone_runs.append(model_alone())
            print(f"model alone (dim 192, batch {args.batch}×4): {alone_runs[-1]:.1f} samples/s", flush=True)
            e2e_runs.append(end_to_end(round_))
        alone_runs.append(model_alone())
        print(f"model alone (dim 192, batch {args.batch}×4): {alone_runs[-1]:.1f} samples/s", flush=True)
        alone, e2e = statistics.median(alone_runs), statistics.median(e2e_runs)

    best_reader = max(reader.values())
    mean_frames = float(data.lengths.mean())
    ratio = e2e / alone
    print(
        json.dumps(
            {
                "bench": "asl",
                "threads": args.threads,
                "sequences": 160 * per,
                "reader_seq_per_s": round(best_reader, 1),
                "reader_seq_per_s_1thread": round(reader[1], 1),
                "reader_frames_per_s": round(best_reader * mean_frames),
                "mean_frames": round(mean_frames, 1),
                "reader_target": READER_TARGET,
                "reader_ok": best_reader >= READER_TARGET,
                "model_alone_samples_per_s": round(alone, 2),
                "end_to_end_samples_per_s": round(e2e, 2),
                "end_to_end_ratio": round(ratio, 3),
                "end_to_end_target": E2E_TARGET,
                "end_to_end_ok": ratio >= E2E_TARGET,
                "dim": 192,
                "device": args.device,
                "mixed_precision": "fp32" if args.fp32 else SHORT_DTYPE[autocast_dtype(device)],
                "loader_workers": (
                    loader_settings(device)["num_workers"] if args.loader_workers is None else args.loader_workers
                ),
            }
        )
    )


if __name__ == "__main__":
    main()
