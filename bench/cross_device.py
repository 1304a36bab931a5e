"""Honest runs trained on another device pass the proof of training (issue 24, Done-when).

    .venv/bin/python bench/cross_device.py                       # node: this CPU on its baseline kernels
    python3 bench/cross_device.py --train-device cuda            # node: the GPU (bench/device_check.sh)

A child process stands in for the provider's node. It trains small cube and ASL runs with
their training traces, in fp32 and in the spec's mixed precision: bf16 autocast on the CPU,
bf16 on a GPU that has it (``training.device``). On the CPU the child uses PyTorch's
baseline kernels (``ATEN_CPU_CAPABILITY=default``), MKL at SSE4.2, oneDNN at SSE4.1 and one
thread: the arithmetic of an older or other CPU. On CUDA it uses the GPU. This process
then does what the platform does. It checks that each run's checkpoint 0 is the seeded
initialisation, bit for bit (``Kind.untrained``). Then it re-executes every segment of
every run on its own CPU with the platform's checker (``training.replay.measure_segments``:
fp32, then the run's own mixed precision for a segment beyond the tolerance).

The figures are each run's largest and median distance, in steps' updates, and its
segments beyond ``TOLERANCE`` (false rejections: every run here is honest). The last line
is one JSON object with the figures and the targets. Training and replay times are
reported apart; neither is a target.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

OTHER_KERNELS = {
    "ATEN_CPU_CAPABILITY": "default",
    "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
    "ONEDNN_MAX_CPU_ISA": "SSE41",
    "OMP_NUM_THREADS": "1",
}
# Small but real: a 5³ lattice reached by its steps, and a one-block ASL model.
CUBE = {
    "teacher_dim": 64,
    "lattice_edge": 5,
    "state_size": 16,
    "steps": 5,
    "epochs": 3,
    "batch_size": 16,
    "warmup_steps": 5,
    "learning_rate": 1e-2,
    "synthetic_samples": 256,
    "seed": 7,
}
ASL = {
    "dim": 192,
    "blocks": 1,
    "max_len": 32,
    "epochs": 3,
    "batch_size": 8,
    "grad_accumulation": 1,
    "learning_rate": 3e-3,
    "validation_fraction": 0.25,
    "late_start": 0.3,
    "seed": 7,
}
PRECISIONS = {"fp32": False, "mixed": True}


def _asl_data(folder: Path) -> Path:
    from training.asl.synthetic import generate

    return generate(folder / "signs.zip", n_signs=6, n_participants=5, per_participant=4, max_frames=32, as_zip=True)


def child(job: dict[str, Any]) -> None:
    """The node: train every run on ``job["device"]`` into ``job["out"]``."""
    import torch

    from training.asl.run import run as asl_run
    from training.cube.run import run as cube_run

    out, device = Path(job["out"]), job["device"]
    data = _asl_data(out)
    times = {}
    for precision, mixed in PRECISIONS.items():
        start = time.perf_counter()
        name = f"cube-{precision}"
        spec = {**CUBE, "mixed_precision": mixed}
        cube_run(spec, out / "none", out / name, device=device, trace_dir=out / name / "trace")
        times[name] = time.perf_counter() - start
        start = time.perf_counter()
        name = f"asl-{precision}"
        spec = {**ASL, "mixed_precision": mixed}
        asl_run(
            spec, data, out / name, device=device, cache_dir=out / "cache", resume=False, trace_dir=out / name / "trace"
        )
        times[name] = time.perf_counter() - start
    where = torch.cuda.get_device_name(0) if device == "cuda" else f"cpu {torch.backends.cpu.get_cpu_capability()}"
    print(json.dumps({"node": where, "threads": torch.get_num_threads(), "train_s": times}))


def _segments(folder: Path) -> list[Any]:
    from training.trace import Segment, checkpoint_name, read_trace

    trace = read_trace(folder / "trace.json")
    return [
        Segment(folder / checkpoint_name(a.index), a, folder / checkpoint_name(b.index), b)
        for a, b in zip(trace.leaves, trace.leaves[1:], strict=False)
    ]


def check(out: Path) -> dict[str, Any]:
    """The platform: checkpoint 0 and every segment of every run, re-executed on this CPU."""
    from training.asl.run import measure_segments as asl_measure
    from training.asl.run import untrained_weights as asl_untrained
    from training.cube.run import measure_segments as cube_measure
    from training.cube.run import untrained_weights as cube_untrained
    from training.replay import TOLERANCE
    from training.trace import read_trace

    data = out / "signs.zip"
    runs: dict[str, Any] = {}
    for kind in ("cube", "asl"):
        for precision, mixed in PRECISIONS.items():
            name = f"{kind}-{precision}"
            spec = {**(CUBE if kind == "cube" else ASL), "mixed_precision": mixed}
            folder = out / name / "trace"
            start = time.perf_counter()
            untrained = cube_untrained(spec, None) if kind == "cube" else asl_untrained(spec, data)
            first = read_trace(folder / "trace.json").leaves[0]
            segments = _segments(folder)
            measured = cube_measure(spec, None, segments) if kind == "cube" else asl_measure(spec, data, segments)
            gaps = [g for g in measured if isinstance(g, float)]
            reasons = [g for g in measured if isinstance(g, str)]
            runs[name] = {
                "segments": len(segments),
                "checkpoint_0_is_the_seeded_init": first.weights_sha256 == untrained,
                "max": round(max(gaps), 4) if gaps else None,
                "median": round(statistics.median(gaps), 4) if gaps else None,
                "rejected": sum(1 for g in gaps if not g <= TOLERANCE) + len(reasons),
                "reasons": reasons[:3],
                "replay_s": round(time.perf_counter() - start, 2),
            }
            print(f"{name}: {runs[name]}", flush=True)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    import torch

    from training.replay import TOLERANCE

    if args.train_device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("cross_device: --train-device cuda, but torch sees no CUDA device.")
    with tempfile.TemporaryDirectory(prefix="cross-device-") as tmp:
        env = dict(os.environ)
        if args.train_device == "cpu":
            env.update(OTHER_KERNELS)
        job = {"out": tmp, "device": args.train_device}
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, __file__, "--child", json.dumps(job)], env=env, capture_output=True, text=True
        )
        if done.returncode != 0:
            raise SystemExit(f"cross_device: the node's training failed:\n{done.stderr[-4000:]}")
        node = json.loads(done.stdout.strip().splitlines()[-1])
        node_s = time.perf_counter() - start
        print(f"node: {node['node']}, {node['threads']} threads, trained in {node_s:.1f} s", flush=True)
        runs = check(Path(tmp))
    gaps = [r["max"] for r in runs.values() if r["max"] is not None]
    figures = {
        "node": node["node"],
        "platform": f"cpu {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads",
        "runs": runs,
        "max_distance": max(gaps) if gaps else None,
        "false_rejections": sum(r["rejected"] for r in runs.values()),
        "segments": sum(r["segments"] for r in runs.values()),
        "untrained_match": all(r["checkpoint_0_is_the_seeded_init"] for r in runs.values()),
        "node_train_s": {k: round(v, 2) for k, v in node["train_s"].items()},
        "targets": {"max_distance": f"<= {TOLERANCE}", "false_rejections": 0, "untrained_match": True},
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
