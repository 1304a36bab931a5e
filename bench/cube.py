"""Cube trainer benchmark: seconds per training step, peak memory and parameters at 8³, 16³, 37³,
and the same step of the per-cell Python-loop reference at 8³, with the speed-up ratio.

    .venv/bin/python bench/cube.py [--threads 2] [--repeats 10] [--reference-batch 8] [--device cpu]

Each lattice size runs in its own subprocess so that peak memory (ru_maxrss on CPU,
torch.cuda.max_memory_allocated on CUDA) belongs to that size alone. A step is forward +
backward of the full loss (six terms) on a batch of 8 with the spec's defaults
(teacher_dim 768, state_size 32, 5 steps, soft gate), fp32. The spec's default
``mixed_precision: true`` makes the trainer run the forward pass under autocast (bf16 on CPU;
the lattice steps themselves stay fp32): that step is timed too, on the smaller lattices
(``step_s_<edge>_mixed_precision``). The last line is one JSON object with the headline
figures and the targets. Timings on a shared machine are distorted by whatever else runs: the
load average is printed with them.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

BATCH = 8
EDGES = (8, 16, 37)
TARGET_SPEEDUP = 100.0
TARGET_STEP_8_S = 0.050
TARGET_PEAK_37_BYTES = 8 * 2**30
# On an H100-class GPU (issue 24 §5): the step at 8³ and at 37³.
TARGET_CUDA_STEP_8_S = 0.010
TARGET_CUDA_STEP_37_S = 0.060
MIXED_PRECISION_MAX_EDGE = 16  # above this, timing the second variant takes minutes


def _rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def measure(
    edge: int, repeats: int, device_name: str, reference_batch: int, mixed: bool, checkpointing: str = "auto"
) -> dict[str, Any]:
    """Run inside the subprocess: time ``repeats`` steps (after warm-up) at ``edge``³, in fp32 and,
    with ``mixed``, under the trainer's mixed-precision autocast. On CUDA the step replays CUDA
    graphs as the trainer's does (``training.cube.graphed``); the eager step is timed too."""
    import torch

    from training.cube.config import CubeConfig
    from training.cube.graphed import CapturedCube
    from training.cube.losses import DEFAULT_WEIGHTS, total_loss
    from training.cube.model import CubeModel
    from training.cube.reference import reference_forward
    from training.device import autocast, keep_freed_memory

    device = torch.device(device_name)
    if device.type == "cpu":
        keep_freed_memory()  # as training.loop.fit does for every CPU run
    torch.manual_seed(0)
    forced = {"auto": None, "on": True, "off": False}[checkpointing]
    config = CubeConfig(lattice_edge=edge, activation_checkpointing=forced)
    model = CubeModel(config).to(device)
    model.set_batch_size(BATCH)
    x = torch.randn(BATCH, config.teacher_dim, device=device)
    captured = CapturedCube(model, enabled=device.type == "cuda")

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    def step(mixed_precision: bool = False) -> None:
        # As training.loop does it: the forward pass (and loss) under autocast, backward outside.
        with autocast(device, mixed_precision):
            output = captured(model, x)
            loss, _ = total_loss(output, x, DEFAULT_WEIGHTS)
        model.zero_grad(set_to_none=True)
        loss.backward()
        sync()

    def timed(mixed_precision: bool) -> list[float]:
        step(mixed_precision)  # warm-up: builds the neighbour bands, allocator pools
        step(mixed_precision)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            step(mixed_precision)
            times.append(time.perf_counter() - start)
        return times

    rss_before = _rss_bytes()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = timed(mixed_precision=False)
    result: dict[str, Any] = {
        "edge": edge,
        "cells": edge**3,
        "parameters": sum(p.numel() for p in model.parameters()),
        "step_s_median": statistics.median(times),
        "step_s_min": min(times),
        "repeats": repeats,
        "activation_checkpointing": model.lattice.checkpointing,
        "peak_rss_bytes": _rss_bytes(),
        "rss_before_training_bytes": rss_before,
    }
    if device.type == "cuda":
        result["peak_cuda_bytes"] = torch.cuda.max_memory_allocated(device)
    if mixed:
        result["step_s_median_mixed_precision"] = statistics.median(timed(mixed_precision=True))
    if captured.replays:
        result["cuda_graphs"] = True
        captured.enabled = False
        result["step_s_median_eager"] = statistics.median(timed(mixed_precision=False))

    if reference_batch:
        # The same model, the same loss, the lattice stepped one cell and one batch item at a time.
        # The per-cell loop is a CPU reference: on a GPU run it is timed on a CPU copy.
        if device.type != "cpu":
            model, device = model.cpu(), torch.device("cpu")
        xr = x[:reference_batch].cpu()
        with torch.no_grad():
            agree = (model(xr).prediction - reference_forward(model, xr).prediction).abs().max().item()
        start = time.perf_counter()
        loss, _ = total_loss(reference_forward(model, xr), xr, DEFAULT_WEIGHTS)
        model.zero_grad(set_to_none=True)
        loss.backward()
        sync()
        elapsed = time.perf_counter() - start
        result["reference"] = {
            "batch": reference_batch,
            "step_s": elapsed,
            # The loop is over batch items: its cost is linear in the batch.
            "step_s_at_batch_8": elapsed * BATCH / reference_batch,
            "max_abs_difference_from_vectorized": agree,
        }
    return result


def _run_child(edge: int, args: argparse.Namespace, reference_batch: int) -> dict[str, Any]:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        str(edge),
        "--repeats",
        str(args.repeats if edge < 37 else max(2, args.repeats // 4)),
        "--device",
        args.device,
        "--threads",
        str(args.threads),
        "--reference-batch",
        str(reference_batch),
        *(["--mixed"] if edge <= MIXED_PRECISION_MAX_EDGE or args.device != "cpu" else []),
        "--activation-checkpointing",
        args.activation_checkpointing,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
    if done.returncode != 0:
        return {"edge": edge, "error": (done.stderr or done.stdout).strip().splitlines()[-1:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    """Parse arguments, run every size in a subprocess, print a table and the JSON summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    parser.add_argument("--repeats", type=int, default=10, help="timed steps per size after 2 warm-up steps")
    parser.add_argument(
        "--reference-batch",
        type=int,
        default=8,
        help="batch for the per-cell reference at 8³ (smaller is faster; the time is scaled to batch 8)",
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--edges", default=",".join(map(str, EDGES)), help="lattice edges, comma separated")
    parser.add_argument(
        "--activation-checkpointing",
        choices=("auto", "on", "off"),
        default="auto",
        help="recompute lattice steps in backward: auto (the trainer's rule), on or off",
    )
    parser.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--mixed", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    if args.child:
        figures = measure(
            args.child, args.repeats, args.device, args.reference_batch, args.mixed, args.activation_checkpointing
        )
        print(json.dumps(figures))
        return

    load_before = os.getloadavg()
    results = []
    for edge in (int(e) for e in args.edges.split(",")):
        reference = args.reference_batch if edge == 8 else 0
        print(f"measuring {edge}³ ...", file=sys.stderr, flush=True)
        results.append(_run_child(edge, args, reference))
    load_after = os.getloadavg()

    peak_label = "peak CUDA GiB" if args.device.startswith("cuda") else "peak RSS GiB"
    print(f"cube trainer, batch {BATCH}, forward+backward, {args.threads} thread(s), device {args.device}")
    print(f"load average before/after: {load_before[0]:.2f} / {load_after[0]:.2f} (other work on this machine)")
    print(
        f"{'lattice':>8} {'params':>10} {'step s (median)':>16} {'step s (min)':>13} {peak_label:>13} "
        f"{'mixed precision s (median)':>27}"
    )
    by_edge = {r["edge"]: r for r in results}
    for r in results:
        if "error" in r:
            print(f"{r['edge']:>6}³  error: {r['error']}")
            continue
        peak = r.get("peak_cuda_bytes", r["peak_rss_bytes"]) / 2**30
        mixed = r.get("step_s_median_mixed_precision")
        print(
            f"{r['edge']:>6}³ {r['parameters']:>10,} {r['step_s_median']:>16.4f} {r['step_s_min']:>13.4f} {peak:>13.2f} "
            f"{'-' if mixed is None else f'{mixed:.4f}':>27}"
        )
    summary: dict[str, Any] = {"threads": args.threads, "device": args.device, "load_average": load_before[0]}
    for edge, r in by_edge.items():
        if "error" not in r:
            summary[f"step_s_{edge}"] = round(r["step_s_median"], 5)
            summary[f"params_{edge}"] = r["parameters"]
            summary[f"peak_gib_{edge}"] = round(r.get("peak_cuda_bytes", r["peak_rss_bytes"]) / 2**30, 3)
            if "step_s_median_mixed_precision" in r:
                summary[f"step_s_{edge}_mixed_precision"] = round(r["step_s_median_mixed_precision"], 5)
            if "step_s_median_eager" in r:
                summary[f"step_s_{edge}_eager"] = round(r["step_s_median_eager"], 5)
            summary[f"activation_checkpointing_{edge}"] = r["activation_checkpointing"]
    ref = by_edge.get(8, {}).get("reference")
    if ref:
        speedup = ref["step_s_at_batch_8"] / by_edge[8]["step_s_median"]
        print(
            f"per-cell reference at 8³: {ref['step_s']:.2f} s for batch {ref['batch']} "
            f"→ {ref['step_s_at_batch_8']:.2f} s at batch 8; speed-up {speedup:.0f}× "
            f"(outputs agree to {ref['max_abs_difference_from_vectorized']:.1e})"
        )
        summary["reference_step_s_8"] = round(ref["step_s_at_batch_8"], 3)
        summary["reference_batch_measured"] = ref["batch"]
        summary["speedup_8"] = round(speedup, 1)
    cuda = args.device.startswith("cuda")
    if cuda:
        summary["device_name"] = torch.cuda.get_device_name(0)
        summary["targets"] = {"step_s_8_max": TARGET_CUDA_STEP_8_S, "step_s_37_max": TARGET_CUDA_STEP_37_S}
        checks = {
            "step_8": ("step_s_8", lambda v: v <= TARGET_CUDA_STEP_8_S),
            "step_37": ("step_s_37", lambda v: v <= TARGET_CUDA_STEP_37_S),
        }
    else:
        summary["targets"] = {
            "speedup_8_min": TARGET_SPEEDUP,
            "step_s_8_max": TARGET_STEP_8_S,
            "peak_gib_37_max": TARGET_PEAK_37_BYTES / 2**30,
        }
        checks = {
            "speedup": ("speedup_8", lambda v: v >= TARGET_SPEEDUP),
            "step_8": ("step_s_8", lambda v: v <= TARGET_STEP_8_S),
            "memory_37": ("peak_gib_37", lambda v: v <= TARGET_PEAK_37_BYTES / 2**30),
        }
    # None where the figure was not measured in this run.
    summary["met"] = {name: (ok(summary[key]) if key in summary else None) for name, (key, ok) in checks.items()}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
