"""Proof-of-training benchmark: does re-executing challenged trace segments catch dishonest
cube training runs, let honest ones through, and cost at most a tenth of the training?

    .venv/bin/python bench/prooftrain.py [--quick] [--draws 100] [--threads N] [--dishonest-steps 200]
    .venv/bin/python bench/prooftrain.py --cost-only [--threads N]

(``--cost-only``: the bf16 run and one challenge's check, about a third of the full run,
for measuring the cost share on an otherwise idle machine.)

At the cube_training defaults (2,048 synthetic samples, batch 8, 10 epochs: 2,310 steps;
``--quick`` shrinks the model, not the step count, so the segment rule is the real one) it
trains an honest run in bf16 autocast (the spec's default) and one in fp32, each with its
training trace, and re-executes every segment of both in fp32 on CPU with the platform's
checker (``training.replay.segment_distance``: hashes, untrusted-file checks, replay,
distance), keeping per segment the distance of the committed end and of the ends a
dishonest worker would have committed from the same start:

- skip (spread): one step of the segment left out (the committed end less the last step's
  update), in a share 0.1 · k of the segments (a tenth of all steps);
- skip (concentrated): whole segments copied (the end is the start), a tenth of them;
- fabricated: every checkpoint interpolated between the untrained and the final weights.

An honest segment beyond the tolerance in fp32 is re-executed again in the run's own mixed
precision and passes when either lands, as the platform does; the derived dishonest ends are
judged against the fp32 re-execution only.

Two more dishonest runs are trained for ``--dishonest-steps`` steps and their segments
re-executed with the platform's ``check_segments`` against the worker's real data:
trained on regenerated held-out rows (synthetic stream 1 of the spec's seed), and trained
with 0 lattice steps (``model(x, steps=0)``). A sample of each derived strategy's forged
checkpoint files also goes through ``check_segments`` and its reason is printed.

Then ``--draws`` challenges per strategy (``training.trace.challenge`` with a fresh secret,
``segments_needed(n, 0.99, 0.1)`` segments) read the cached verdicts: the detection rate per
strategy (sampled, and exactly from the per-segment verdicts: ``exact``), the false-rejection
rate of the honest runs, and the verification cost (the time
``check_segments`` takes on one challenge's segments, hashing included, over the training's
time). The last line is one JSON object with the figures and the targets.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import math
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from training.artifacts import read_state_file, save_state_file, weights_sha256  # noqa: E402
from training.cube.data import synthetic_embeddings  # noqa: E402
from training.cube.losses import total_loss, weights_from_spec  # noqa: E402
from training.cube.run import replay_segments, run, trainer, training_spec  # noqa: E402
from training.loop import fit  # noqa: E402
from training.replay import (  # noqa: E402
    TOLERANCE,
    Trainer,
    distance,
    segment_distance,
    state_bound,
    total_steps,
    within,
)
from training.trace import (  # noqa: E402
    BAD_FRACTION,
    DETECT,
    Leaf,
    Segment,
    challenge,
    checkpoint_name,
    file_sha256,
    read_trace,
    segments_needed,
    trace_every,
)

TARGET_COST = 0.10
TARGET_DETECTION = 0.99
TARGET_FALSE_REJECTION = 0.001
QUICK = {"teacher_dim": 64, "lattice_edge": 4, "state_size": 8, "steps": 3}


class _Enough(Exception):
    """Ends a dishonest run after the steps the benchmark needs."""


def _segments(folder: Path, leaves: tuple[Leaf, ...] | list[Leaf]) -> list[Segment]:
    return [
        Segment(folder / checkpoint_name(a.index), a, folder / checkpoint_name(b.index), b)
        for a, b in itertools.pairwise(leaves)
    ]


def _vector(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().double().clone() for k, v in weights.items()}


def analyse(spec: dict[str, Any], folder: Path, final: dict[str, torch.Tensor]) -> dict[str, list[float]]:
    """Per segment: the distance of the honest end and of each derived dishonest end."""
    trace = read_trace(folder / "trace.json")
    built = trainer(spec, None, "cpu")
    untrained = {k: v.clone() for k, v in built.model.state_dict().items()}
    total = trace.leaves[-1].step
    out: dict[str, list[float]] = {"honest": [], "skip": [], "copied": [], "fabricated": [], "seconds": []}
    for segment in _segments(folder, trace.leaves):
        built.model.load_state_dict(untrained)
        steps: list[dict[str, torch.Tensor]] = []

        def keep(event: dict[str, Any], steps: list[dict[str, torch.Tensor]] = steps) -> None:
            steps.append(_vector(built.model.state_dict()))

        started = time.perf_counter()
        honest = segment_distance(built, segment, progress=keep)
        out["seconds"].append(time.perf_counter() - started)
        if not within(honest) and built.config.mixed_precision:
            # The platform's rule (training.replay._verdict): again in the run's own precision.
            built.model.load_state_dict(untrained)
            honest = min(honest, segment_distance(built, segment, mixed_precision=True))
        bound = state_bound(built.model)
        start = _vector(read_state_file(segment.start, bound)["model"])
        committed = _vector(read_state_file(segment.end, bound)["model"])
        replayed = steps[-1]
        before_last = steps[-2] if len(steps) > 1 else start
        k = len(steps)
        skipped = {n: committed[n] - (replayed[n] - before_last[n]) for n in committed}
        share = segment.end_leaf.step / total
        fabricated = {n: untrained[n].double() + share * (final[n].double() - untrained[n].double()) for n in committed}
        out["honest"].append(honest)
        out["skip"].append(distance(start, replayed, skipped, k))
        out["copied"].append(distance(start, replayed, start, k))
        out["fabricated"].append(distance(start, replayed, fabricated, k))
    return out


def forged(spec: dict[str, Any], folder: Path, work: Path) -> dict[str, str]:
    """Forge one segment's end per derived strategy as real files and leaves, and ask the
    platform's checker: its reason for each."""
    trace = read_trace(folder / "trace.json")
    segment = _segments(folder, trace.leaves)[len(trace.leaves) // 2]
    bound = 10 * state_bound(trainer(spec, None, "cpu").model)
    start, end = read_state_file(segment.start, bound), read_state_file(segment.end, bound)
    variants = {
        "copied": {**end, "model": start["model"]},
        "fabricated": {**end, "model": {k: 0.5 * (start["model"][k] + end["model"][k]) for k in end["model"]}},
    }
    reasons = {}
    for name, state in variants.items():
        path = work / f"forged-{name}.safetensors"
        save_state_file(path, state)
        model = trainer(spec, None, "cpu").model
        model.load_state_dict(state["model"])
        leaf = Leaf(
            index=segment.end_leaf.index,
            step=segment.end_leaf.step,
            epoch=segment.end_leaf.epoch,
            loss_micro=segment.end_leaf.loss_micro,
            state_sha256=file_sha256(path),
            weights_sha256=weights_sha256(model),
        )
        reasons[name] = replay_segments(spec, None, [Segment(segment.start, segment.start_leaf, path, leaf)])[0]
    return reasons


def dishonest_run(spec: dict[str, Any], work: Path, how: str, steps: int) -> list[Segment]:
    """Train ``steps`` steps dishonestly with the trace on; the segments it committed to."""
    data = None
    if how == "heldout":
        data = work / "stream1"
        data.mkdir()
        full = training_spec(spec)
        rows, _ = synthetic_embeddings(full["synthetic_samples"], full["teacher_dim"], full["seed"], stream=1)
        np.save(data / "embeddings.npy", rows)
    built: Trainer = trainer(spec, data, "cpu")
    if how == "zero_steps":
        weights = weights_from_spec(training_spec(spec))

        def step_fn(m: torch.nn.Module, batch: Any) -> tuple[torch.Tensor, dict[str, float]]:
            x, y = batch
            return total_loss(m(x, steps=0), y, weights)

        built.step_fn = step_fn
    folder = work / f"trace-{how}"
    config = replace(built.config, trace_every=trace_every(total_steps(built)))

    def enough(event: dict[str, Any]) -> None:
        if event.get("event") == "step" and event["step"] >= steps:
            raise _Enough

    with contextlib.suppress(_Enough):
        fit(built.model, built.train_loader, [], built.step_fn, _no_eval, config, enough, trace_dir=folder)
    return _segments(folder, _leaves(spec, folder))


def _no_eval(model: torch.nn.Module, loader: Any) -> dict[str, float]:
    return {"val_loss": 0.0}


def _leaves(spec: dict[str, Any], folder: Path) -> list[Leaf]:
    """The leaves of the checkpoints a stopped run left (its trace.json comes at an epoch's end)."""
    model = trainer(spec, None, "cpu").model
    leaves = []
    for index in range(10_000):
        path = folder / checkpoint_name(index)
        if not path.is_file():
            break
        state = read_state_file(path, 10 * state_bound(model))
        model.load_state_dict(state["model"])
        step = int(state["loop"]["global_step"])
        leaves.append(Leaf(index, step, int(state["loop"]["epoch"]), 0, file_sha256(path), weights_sha256(model)))
    return leaves


def simulate(verdicts: list[bool], bad_share: float | None, draws: int, root: str, fail_honest: list[bool]) -> float:
    """The share of ``draws`` challenges that reject: a drawn bad segment whose forged end
    fails, or a drawn good one that fails as honest. ``bad_share`` None: every segment is bad."""
    n = len(verdicts)
    s = segments_needed(n, DETECT, BAD_FRACTION)
    rejected = 0
    for i in range(draws):
        rng = random.Random(i)
        bad = set(range(n)) if bad_share is None else set(rng.sample(range(n), round(bad_share * n)))
        secret = hashlib.sha256(f"bench-secret-{i}".encode()).digest()
        drawn = challenge(root, secret, n, s)
        if any((not verdicts[j]) if j in bad else fail_honest[j] for j in drawn):
            rejected += 1
    return rejected / draws


def exact(verdicts: list[bool], bad_share: float | None, draws: int) -> float:
    """The probability that one challenge rejects, exactly (no challenge drawn), averaged
    over the same ``draws`` bad sets ``simulate`` uses: 1 − C(n − d, s) / C(n, s), d the
    drawn-bad segments whose forged end fails. What ``simulate`` estimates by sampling."""
    n = len(verdicts)
    s = segments_needed(n, DETECT, BAD_FRACTION)
    total = 0.0
    for i in range(draws):
        rng = random.Random(i)
        bad = range(n) if bad_share is None else rng.sample(range(n), round(bad_share * n))
        caught = sum(1 for j in bad if not verdicts[j])
        total += 1.0 - math.comb(n - caught, s) / math.comb(n, s)
    return total / draws


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller model (same step count) for development")
    parser.add_argument("--draws", type=int, default=100)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--dishonest-steps", type=int, default=200)
    parser.add_argument("--samples", type=int, default=0, help="synthetic_samples (0: the spec's default)")
    parser.add_argument("--epochs", type=int, default=0, help="epochs (0: the spec's default)")
    parser.add_argument(
        "--cost-only", action="store_true", help="the bf16 run and one challenge's cost only (no detection figures)"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    spec = training_spec(QUICK if args.quick else {})
    spec.update({k: v for k, v in (("synthetic_samples", args.samples), ("epochs", args.epochs)) if v})
    work = Path(tempfile.mkdtemp(prefix="prooftrain-"))
    figures: dict[str, Any] = {"quick": args.quick, "tolerance": TOLERANCE, "threads": torch.get_num_threads()}
    try:
        runs: dict[str, dict[str, Any]] = {}
        for name, mixed in (("bf16", True), ("fp32", False))[: 1 if args.cost_only else 2]:
            run_spec = {**spec, "mixed_precision": mixed}
            metrics = run(run_spec, work / "none", work / f"out-{name}", trace_dir=work / f"trace-{name}")
            trace = read_trace(work / f"trace-{name}" / "trace.json")
            last = read_state_file(work / f"trace-{name}" / checkpoint_name(trace.leaves[-1].index), 1 << 34)
            final = last["model"]
            print(
                f"{name}: {metrics['steps']} steps in {metrics['seconds']:.1f} s, k = {trace.every}, "
                f"{trace.segments} segments, val_loss {metrics['val_loss']:.4f}"
            )
            started = time.perf_counter()
            analysis = {} if args.cost_only else analyse(run_spec, work / f"trace-{name}", final)
            if not args.cost_only:
                print(f"{name}: every segment re-executed in {time.perf_counter() - started:.1f} s")
            runs[name] = {"metrics": metrics, "trace": trace, "analysis": analysis}
        bf16 = runs["bf16"]
        trace, analysis = bf16["trace"], bf16["analysis"]
        n = trace.segments
        s = segments_needed(n, DETECT, BAD_FRACTION)
        # The platform's real cost: check_segments on one challenge's segments.
        drawn = challenge(trace.root, b"cost", n, s)
        segments = _segments(work / "trace-bf16", trace.leaves)
        started = time.perf_counter()
        reasons = replay_segments(spec, None, [segments[j] for j in drawn])
        check_seconds = time.perf_counter() - started
        cost = check_seconds / bf16["metrics"]["seconds"]
        print(f"one challenge: {s} of {n} segments checked in {check_seconds:.1f} s: cost share {cost:.3f}")
        assert all(r == "" for r in reasons), reasons
        figures.update(
            {
                "steps": bf16["metrics"]["steps"],
                "k": trace.every,
                "segments": n,
                "challenged": s,
                "train_seconds_bf16": bf16["metrics"]["seconds"],
                "check_seconds": check_seconds,
                "cost_share": cost,
                "target_cost_share": TARGET_COST,
            }
        )
        if args.cost_only:
            print(json.dumps(figures))
            return

        honest_fail = {name: [not within(g) for g in runs[name]["analysis"]["honest"]] for name in runs}
        for name in runs:
            gaps = runs[name]["analysis"]["honest"]
            figures[f"honest_{name}_distance_max"] = max(gaps)
            figures[f"honest_{name}_distance_p99"] = float(np.quantile(gaps, 0.99))
            figures[f"honest_{name}_distance_median"] = statistics.median(gaps)
            figures[f"false_rejection_{name}"] = simulate(
                [True] * len(gaps), 0.0, args.draws, runs[name]["trace"].root, honest_fail[name]
            )
        for key in ("skip", "copied", "fabricated"):
            gaps = analysis[key]
            figures[f"{key}_distance_min"] = min(gaps)
            figures[f"{key}_distance_median"] = statistics.median(gaps)
        k = trace.every
        verdict = {key: [within(g) for g in analysis[key]] for key in ("skip", "copied", "fabricated")}
        detection = {
            "skip_spread": simulate(verdict["skip"], min(1.0, 0.1 * k), args.draws, trace.root, honest_fail["bf16"]),
            "skip_concentrated": simulate(verdict["copied"], 0.1, args.draws, trace.root, honest_fail["bf16"]),
            "fabricated": simulate(verdict["fabricated"], None, args.draws, trace.root, honest_fail["bf16"]),
        }
        exact_detection = {
            "skip_spread": exact(verdict["skip"], min(1.0, 0.1 * k), args.draws),
            "skip_concentrated": exact(verdict["copied"], 0.1, args.draws),
            "fabricated": exact(verdict["fabricated"], None, args.draws),
        }
        for name, reason in forged(spec, work / "trace-bf16", work).items():
            print(f"forged {name}: {reason}")
        for how in ("heldout", "zero_steps"):
            (work / how).mkdir()
            segments = dishonest_run(spec, work / how, how, args.dishonest_steps)
            reasons = replay_segments(spec, None, segments)
            print(f"{how}: {sum(1 for r in reasons if r)} of {len(reasons)} segments rejected; e.g. {reasons[-1]}")
            away = [
                r.split("its end is ")[1].split(" ")[0] if "its end is" in r else ("ok" if not r else "x")
                for r in reasons
            ]
            print(f"{how}: per segment {' '.join(away)}")
            detection[how] = simulate([r == "" for r in reasons], None, args.draws, "x" * 64, [False] * len(reasons))
            exact_detection[how] = exact([r == "" for r in reasons], None, args.draws)
            figures[f"{how}_segments_rejected_share"] = sum(1 for r in reasons if r) / len(reasons)
        figures.update(
            {
                **{f"detection_{name}": rate for name, rate in detection.items()},
                **{f"detection_exact_{name}": rate for name, rate in exact_detection.items()},
                "target_detection": TARGET_DETECTION,
                "target_false_rejection": TARGET_FALSE_REJECTION,
            }
        )
        for key, value in figures.items():
            print(f"{key}: {value}")
        print(json.dumps(figures))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
