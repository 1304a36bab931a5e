"""A toy trained kind that proves its training as cube and ASL do (``training.trace``): it
fits one number to the spec's target by a fixed-rate step, checkpoints its whole state every
``every`` steps into ``ckpt-NNNNN.safetensors``, commits to the chain in trace.json and its
signed proof, and replays a segment exactly. Small enough to run a hundred times in a test,
so the platform's challenge protocol is tested on its own, whatever a real trainer costs."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file, save, save_file

from training.plugin import (
    METRICS,
    WEIGHTS,
    Kind,
    Outcome,
    Progress,
    Resources,
    Spec,
    TrainingPlan,
    micro,
    sha256_file,
)
from training.specs import param
from training.trace import TRACE_FILE, Leaf, Segment, Trace, checkpoint_name, file_sha256

RATE = 0.5


@dataclass(frozen=True)
class FitSpec:
    """Fit x to target in ``steps`` steps of x += RATE·(target − x)."""

    steps: int = param(12, "Optimizer steps.", lo=1, hi=1000)
    every: int = param(3, "Steps between checkpoints.", lo=1, hi=100)
    target: int = param(1000, "The number to fit.", lo=1, hi=10**6)


def step(x: float, target: int) -> float:
    return x + RATE * (target - x)


def loss(x: float, target: int) -> float:
    return ((target - x) / target) ** 2


def weights_bytes(x: float) -> bytes:
    """model.safetensors for weight ``x``."""
    return save({"x": np.array([x], dtype=np.float64)})


def write_checkpoint(path: Path, x: float, at: int) -> None:
    save_file({"x": np.array([x], dtype=np.float64), "step": np.array([at], dtype=np.int64)}, str(path))


def read_checkpoint(path: Path) -> tuple[float, int]:
    tensors = load_file(str(path))
    return float(tensors["x"][0]), int(tensors["step"][0])


def train(
    spec: Spec, out: Path, *, skip_every: int = 0, skip_in: tuple[int, ...] = ()
) -> tuple[Trace, dict[str, Path], float]:
    """Train into ``out``: the trace, the checkpoint files and the final weight. A dishonest
    run passes ``skip_every``: it does only every other step of each such segment, and
    claims the full count; ``skip_in`` (segment indexes) skips every step of those segments:
    each ends where it started, a segment fabricated by copying its start forward."""
    target, every, steps = int(spec["target"]), int(spec["every"]), int(spec["steps"])
    x, done = 0.0, 0
    leaves: list[Leaf] = []
    files: dict[str, Path] = {}
    since: list[float] = []

    def checkpoint(epoch: int) -> None:
        name = checkpoint_name(len(leaves))
        write_checkpoint(out / name, x, done)
        files[name] = out / name
        leaves.append(
            Leaf(
                index=len(leaves),
                step=done,
                epoch=epoch,
                loss_micro=micro(sum(since) / len(since)) if since else 0,
                state_sha256=file_sha256(out / name),
                weights_sha256=hashlib.sha256(weights_bytes(x)).hexdigest(),
            )
        )
        since.clear()

    checkpoint(0)
    while done < steps:
        done += 1
        if (done - 1) // every not in skip_in and not (skip_every and done % 2 == 0):
            x = step(x, target)
        since.append(loss(x, target))
        if done % every == 0 or done == steps:
            checkpoint(1)
    return Trace(every=every, leaves=tuple(leaves)), files, x


def run(job: dict[str, Any], workdir: Path, progress: Progress) -> Outcome:
    spec = job["spec"]
    out = workdir / "model"
    out.mkdir()
    trace, checkpoints, x = train(spec, out)
    (out / WEIGHTS).write_bytes(weights_bytes(x))
    (out / METRICS).write_text(json.dumps({"loss": loss(x, int(spec["target"]))}))
    trace.write(out / TRACE_FILE)
    progress(1, 1, {})
    return Outcome(
        result_hash=sha256_file(out / WEIGHTS),
        proof={"loss_micro": micro(loss(x, int(spec["target"]))), "trace": trace.commitment()},
        artifacts={name: out / name for name in (WEIGHTS, METRICS, TRACE_FILE)},
        checkpoints=checkpoints,
    )


def _replay_one(spec: Spec, segment: Segment) -> str:
    first, last = segment.start_leaf, segment.end_leaf
    where = f"segment {first.index} (steps {first.step}→{last.step})"
    x, at = read_checkpoint(segment.start)
    if at != first.step:
        return f"{where}: its first checkpoint says step {at}, its leaf {first.step}."
    for _ in range(last.step - first.step):
        x = step(x, int(spec["target"]))
    claimed, _ = read_checkpoint(segment.end)
    if abs(claimed - x) > 1e-9 * max(1.0, abs(x)):
        return f"{where}: re-executed, x is {x:.6g}; the committed checkpoint holds {claimed:.6g}."
    return ""


def replay(spec: Spec, data: Path | None, segments: Sequence[Segment], *, device: str = "cpu") -> list[str]:
    """Re-execute each segment from its first checkpoint: why it misses its last ("" when it lands)."""
    return [_replay_one(spec, segment) for segment in segments]


def _measure_one(spec: Spec, segment: Segment) -> float | str:
    first, last = segment.start_leaf, segment.end_leaf
    if file_sha256(segment.start) != first.state_sha256 or file_sha256(segment.end) != last.state_sha256:
        return "a checkpoint does not match the sha256 its leaf commits to."
    x, _ = read_checkpoint(segment.start)
    claimed, _ = read_checkpoint(segment.end)
    if hashlib.sha256(weights_bytes(claimed)).hexdigest() != last.weights_sha256:
        return "the end's weights do not match the sha256 its leaf commits to."
    start, steps = x, last.step - first.step
    for _ in range(steps):
        x = step(x, int(spec["target"]))
    moved = abs(x - start) / max(1, steps)
    gap = abs(claimed - x)
    return 0.0 if gap <= 1e-9 * max(1.0, abs(x)) else (gap / moved if moved else float("inf"))


def measure(spec: Spec, data: Path | None, segments: Sequence[Segment], *, device: str = "cpu") -> list[float | str]:
    """Each segment's distance in steps' updates, as ``training.replay.measure_segments`` gives it."""
    return [_measure_one(spec, segment) for segment in segments]


def canary(spec: Spec, data: Path | None, segment: Segment, out: Path, *, device: str = "cpu") -> str:
    """The segment re-executed, its end then moved back two mean steps towards the start: two
    steps' updates from where an honest re-execution lands (``training.replay.canary_state``
    makes a real kind's by training on other rows)."""
    a, _ = read_checkpoint(segment.start)
    _, at = read_checkpoint(segment.end)
    steps = segment.end_leaf.step - segment.start_leaf.step
    x = a
    for _ in range(steps):
        x = step(x, int(spec["target"]))
    moved = x - 2.0 / max(1, steps) * (x - a)
    write_checkpoint(out, moved, at)
    return hashlib.sha256(weights_bytes(moved)).hexdigest()


def plan(spec: Spec, data: Path | None) -> TrainingPlan:
    """One epoch of ``steps`` steps from x = 0, a checkpoint every ``every``."""
    return TrainingPlan(
        untrained_sha256=hashlib.sha256(weights_bytes(0.0)).hexdigest(),
        steps_per_epoch=int(spec["steps"]),
        epochs=1,
        early_stopping_patience=0,
        every=int(spec["every"]),
    )


def _resources(spec: Spec) -> Resources:
    return Resources(memory_bytes=1 << 20, gpu_preferred=False)


def _flops(spec: Spec) -> float:
    return float(spec["steps"])


FIT = Kind(
    name="toy_fit",
    label="Toy fit",
    description="Fit one number, proving every step.",
    spec=FitSpec,
    resources=_resources,
    flops=_flops,
    run=run,
    artifacts=(WEIGHTS, METRICS, TRACE_FILE),
    model_files=(WEIGHTS,),
    replay=replay,
    plan=plan,
    measure=measure,
    canary=canary,
)
