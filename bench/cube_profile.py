"""Where a cube training step spends the GPU: kernels per step, GPU-busy time, the top kernels,
and wall time, eager and replayed as CUDA graphs (``training.cube.graphed``).

    python3 bench/cube_profile.py [--edges 8,37] [--steps 10]

A tool for the GPU work of issue 24 §5, not a benchmark with targets: ``bench/cube.py
--device cuda`` reports the step times against them. Needs a CUDA device. The last line is
one JSON object with each variant's figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from training.cube.config import CubeConfig
from training.cube.graphed import CapturedCube
from training.cube.losses import DEFAULT_WEIGHTS, total_loss
from training.cube.model import CubeModel

BATCH = 8
PROFILED_STEPS = 3


def variant(edge: int, checkpointing: bool | None, graphs: bool, steps: int) -> dict[str, Any]:
    """Profile ``PROFILED_STEPS`` steps after warm-up, then time ``steps`` more."""
    torch.manual_seed(0)
    config = CubeConfig(lattice_edge=edge, activation_checkpointing=checkpointing)
    model = CubeModel(config).cuda()
    model.set_batch_size(BATCH)
    x = torch.randn(BATCH, config.teacher_dim, device="cuda")
    captured = CapturedCube(model, enabled=graphs)

    def step() -> None:
        loss, _ = total_loss(captured(model, x), x, DEFAULT_WEIGHTS)
        model.zero_grad(set_to_none=True)
        loss.backward()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(PROFILED_STEPS):
            step()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    busy_ms = sum(getattr(e, "device_time", 0.0) for e in kernels) / PROFILED_STEPS / 1000
    averages = sorted(prof.key_averages(), key=lambda e: -getattr(e, "self_device_time_total", 0.0))
    top = [
        {
            "kernel": e.key[:100],
            "ms_per_step": round(getattr(e, "self_device_time_total", 0.0) / PROFILED_STEPS / 1000, 3),
            "calls_per_step": round(e.count / PROFILED_STEPS, 1),
        }
        for e in averages[:12]
    ]
    torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return {
        "edge": edge,
        "activation_checkpointing": model.lattice.checkpointing,
        "cuda_graphs": captured.replays > 0,
        "kernels_per_step": round(len(kernels) / PROFILED_STEPS),
        "gpu_busy_ms_per_step": round(busy_ms, 3),
        "wall_ms_per_step": round(1000 * (time.perf_counter() - started) / steps, 3),
        "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3),
        "top": top,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edges", default="8,37", help="lattice edges, comma separated")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per variant")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device")
    results = []
    for edge in (int(e) for e in args.edges.split(",")):
        for checkpointing, graphs in ((None, False), (None, True), (False, True)):
            try:
                result = variant(edge, checkpointing, graphs, args.steps)
            except Exception as exc:
                result = {"edge": edge, "cuda_graphs": graphs, "error": repr(exc)[:500]}
            results.append(result)
            print(json.dumps({k: v for k, v in result.items() if k != "top"}), flush=True)
            for row in result.get("top", []):
                print(f"    {row['ms_per_step']:8.3f} ms  ×{row['calls_per_step']:<7} {row['kernel']}", flush=True)
            torch.cuda.empty_cache()
    print(json.dumps({"bench": "cube_profile", "device_name": torch.cuda.get_device_name(0), "variants": results}))


if __name__ == "__main__":
    main()
