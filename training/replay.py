"""Re-executing segments of a training trace: the platform's side of proof of training.

A segment is checkpoint i → i + 1 of a run's trace (``training.trace``). ``check_segments``
re-runs each segment's steps from its start checkpoint, in fp32, with the data the worker
was sent and the spec's seeds, and compares the weights reached with the committed end
checkpoint. The distance is in units of the segment's mean step: ``‖replayed − committed‖ /
(‖replayed − start‖ / steps)`` over every weight, and the same over the optimizer's first
moments (where the data a step trained on shows most); the larger of the two counts, so 1 means "one step's update away"
whatever the learning rate or the layer sizes (Proof-of-Learning, Jia et al. 2021, uses
such normalised distances). A skipped, shortened or fabricated segment lands about a step
or more away; an honest one, trained in bf16 autocast or on another device, lands within
``TOLERANCE`` (measured by ``bench/prooftrain.py``, written down in docs/kinds.md). Another
device differs from the replay in arithmetic only: the loop re-seeds every generator before
each micro-batch, and a model makes its random masks from keys of the CPU's generator
with an integer hash, the same bits on every device (``training.asl.model.dropout``; the
cube model draws none), so a GPU worker's masks are the replay's.

Each kind says how to build its trainer from a spec and the worker's data (``Build``); the
rest is shared. Checkpoint files are untrusted: each must hash to its leaf before it is
read, is read as safetensors only, size-bounded, and must fit the spec's model.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from training.artifacts import (
    ArtifactError,
    flatten_tensors,
    load_model_tensors,
    read_state_file,
    save_state_file,
    weights_sha256,
)
from training.loop import EvalFn, LoopConfig, Progress, StepFn, replay, steps_per_epoch
from training.plugin import TrainingPlan
from training.trace import Segment, file_sha256, trace_every

# Largest distance, in steps' updates, that an honest segment may land from its committed
# end: bench/prooftrain.py measured honest bf16-trained segments replayed in fp32 at most
# 0.18 (median 0.05), fp32 ones at 0, and a skipped step, a copied segment, training on
# other rows or without lattice steps at 0.37 to 2 (a skipped step: 1.0).
TOLERANCE = 0.5
# A checkpoint holds the weights and at most three tensors per weight (AdamW's moments, or
# RAdam's and the Lookahead slow copy): anything larger is refused unread.
STATE_COPIES = 4
STATE_SLACK_BYTES = 4 * 2**20


@dataclass
class Trainer:
    """What a kind builds from a spec and the worker's data, for training or a replay: the
    model (its untrained weights), the training loader, the step and the loop's settings."""

    model: nn.Module
    train_loader: Iterable[Any]
    step_fn: StepFn
    config: LoopConfig
    on_epoch: Callable[[int], None] | None = None
    # For training (not needed by a replay): validation, and what the run reports.
    val_loader: Iterable[Any] = ()
    eval_fn: EvalFn | None = None
    extras: dict[str, Any] = field(default_factory=dict)


def total_steps(trainer: Trainer) -> int:
    """The optimizer steps a full run of ``trainer`` takes."""
    return steps_per_epoch(trainer.train_loader, trainer.config) * trainer.config.epochs


def plan_of(trainer: Trainer) -> TrainingPlan:
    """The plan a trainer runs: its untrained weights' sha256 and its step counts."""
    per_epoch = steps_per_epoch(trainer.train_loader, trainer.config)
    return TrainingPlan(
        untrained_sha256=weights_sha256(trainer.model),
        steps_per_epoch=per_epoch,
        epochs=trainer.config.epochs,
        early_stopping_patience=trainer.config.early_stopping_patience,
        every=trace_every(per_epoch * trainer.config.epochs),
    )


# fn(spec, worker's data (the file the platform sends, a folder holding it, or None for
# synthetic data), device) -> Trainer. ValueError when the spec or data cannot be used.
Build = Callable[[Mapping[str, Any], Path | None, str], Trainer]


def state_bound(model: nn.Module) -> int:
    """The most bytes a training-state file of ``model`` may take."""
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    return STATE_COPIES * weights + STATE_SLACK_BYTES


def _vector(tensors: Mapping[str, torch.Tensor], like: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """``tensors`` in the order and shapes of ``like`` (zeros where one is missing or does
    not fit), as one float64 vector."""
    parts = []
    for name, ref in sorted(like.items()):
        if not ref.is_floating_point():
            continue
        t = tensors.get(name)
        if isinstance(t, torch.Tensor) and t.shape == ref.shape:
            parts.append(t.detach().double().reshape(-1).cpu())
        else:
            parts.append(torch.zeros(ref.numel(), dtype=torch.float64))
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)


def distance(
    start: Mapping[str, torch.Tensor],
    replayed: Mapping[str, torch.Tensor],
    committed: Mapping[str, torch.Tensor],
    steps: int,
) -> float:
    """``‖replayed − committed‖ / (‖replayed − start‖ / steps)`` over every float tensor."""
    a, r, c = _vector(start, replayed), _vector(replayed, replayed), _vector(committed, replayed)
    moved = float(torch.linalg.vector_norm(r - a)) / max(1, steps)
    gap = float(torch.linalg.vector_norm(r - c))
    if moved == 0.0:
        return 0.0 if gap == 0.0 else math.inf
    return gap / moved


def first_moments(state: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The optimizer's running mean of the gradients (AdamW's and RAdam's ``exp_avg``) in a
    training state: where the data a segment trained on shows most (a step's gradient
    weighs (1 − β₁) in it, against a tenth of that in the weights' step)."""
    tensors = flatten_tensors(state.get("optimizer", {}), "o")
    return {k: v for k, v in tensors.items() if k.endswith(".exp_avg")}


def segment_distance(
    trainer: Trainer,
    segment: Segment,
    device: str = "cpu",
    progress: Progress | None = None,
    mixed_precision: bool = False,
) -> float:
    """How far the committed end of ``segment`` lies from its re-execution, in steps'
    updates. ArtifactError (or ValueError) says why a checkpoint cannot be used."""
    start_leaf, end_leaf = segment.start_leaf, segment.end_leaf
    name = f"checkpoint {start_leaf.index}"
    steps = end_leaf.step - start_leaf.step
    if end_leaf.index != start_leaf.index + 1 or steps < 1:
        raise ArtifactError(f"checkpoints {start_leaf.index} and {end_leaf.index} are not one segment.")
    if start_leaf.index == 0 and weights_sha256(trainer.model) != start_leaf.weights_sha256:
        raise ArtifactError("checkpoint 0 is not the untrained model the spec's seed gives.")
    bound = state_bound(trainer.model)
    for path, leaf in ((segment.start, start_leaf), (segment.end, end_leaf)):
        if path.stat().st_size > bound:
            raise ArtifactError(f"checkpoint {leaf.index} is larger than a training state of this model may be.")
        if file_sha256(path) != leaf.state_sha256:
            raise ArtifactError(f"checkpoint {leaf.index} does not match the sha256 its leaf commits to.")
    start = read_state_file(segment.start, bound)
    end = read_state_file(segment.end, bound)
    for state, leaf in ((start, start_leaf), (end, end_leaf)):
        loop = state.get("loop")
        if not isinstance(loop, dict) or loop.get("global_step") != leaf.step:
            raise ArtifactError(f"checkpoint {leaf.index} was not taken at step {leaf.step}, as its leaf says.")
    model = trainer.model
    end_weights = end.get("model")
    if not isinstance(end_weights, dict):
        raise ArtifactError(f"checkpoint {end_leaf.index} holds no weights.")
    # The committed end goes through the model (strict names and shapes, the leaf's sha256)
    # before the replay loads the start over it.
    load_model_tensors(model, end_weights, source=f"checkpoint {end_leaf.index}")
    if weights_sha256(model) != end_leaf.weights_sha256:
        raise ArtifactError(f"checkpoint {end_leaf.index}'s weights do not match the sha256 its leaf commits to.")
    committed = {k: v.detach().clone() for k, v in model.state_dict().items()}
    reached = replay(
        model,
        trainer.train_loader,
        trainer.step_fn,
        trainer.config,
        start,
        steps,
        source=name,
        device=device,
        on_epoch=trainer.on_epoch,
        progress=progress,
        mixed_precision=mixed_precision,
    )
    model.cpu()
    weights = distance(start["model"], model.state_dict(), committed, steps)
    moments = distance(first_moments(start), first_moments(reached), first_moments(end), steps)
    return max(weights, moments)


def check_segments(
    build: Build,
    spec: Mapping[str, Any],
    data: Path | None,
    segments: Sequence[Segment],
    *,
    device: str = "cpu",
    tolerance: float = TOLERANCE,
) -> list[str]:
    """For each segment, "" when its re-execution lands within ``tolerance`` of its committed
    end, else the reason, as a requester reads it."""
    measured = measure_segments(build, spec, data, segments, device=device, tolerance=tolerance)
    return [_verdict(gap, segment, tolerance) for gap, segment in zip(measured, segments, strict=True)]


def measure_segments(
    build: Build,
    spec: Mapping[str, Any],
    data: Path | None,
    segments: Sequence[Segment],
    *,
    device: str = "cpu",
    tolerance: float = TOLERANCE,
) -> list[float | str]:
    """For each segment, how far its committed end lies from its re-execution, in steps'
    updates (re-executed as ``check_segments`` does, in fp32 and then, for a run the spec
    trains in mixed precision and a segment beyond ``tolerance``, again in that precision,
    the nearer counting), or why it cannot be re-executed. What a verifier node reports
    (docs/proof-of-training.md#delegated-re-execution)."""
    trainer = build(spec, data, device)
    untrained = {k: v.clone() for k, v in trainer.model.state_dict().items()}

    def distance_in(mixed_precision: bool, segment: Segment) -> float:
        trainer.model.load_state_dict(untrained)
        return segment_distance(trainer, segment, device, mixed_precision=mixed_precision)

    measured: list[float | str] = []
    for segment in segments:
        try:
            gap = distance_in(False, segment)
            if not within(gap, tolerance) and trainer.config.mixed_precision:
                gap = min(gap, distance_in(True, segment))
        except (ArtifactError, ValueError, OSError) as exc:
            measured.append(f"cannot be re-executed: {exc}")
            continue
        measured.append(gap)
    return measured


# How far from the committed end a canary's end must lie, in the segment's mean steps. An
# honest re-execution lands within 0.18 of the committed end (bench/prooftrain.py), so at
# least 0.62 from the canary's, beyond TOLERANCE: it fails the canary. A step trained on
# other rows lands about one step's update away (0.44 to 1.8 measured on one-step segments
# of tiny runs, a third of them at 0.8 or more); a longer segment replaces more steps.
CANARY_DISTANCE = 0.8
Draw = Callable[[Sequence[int], int], list[int]]


class _OtherRows:
    """The run's train loader for one epoch of a replay, except that the steps ``replaced``
    (0 = the segment's first) train on the micro-batches of another step of the same epoch:
    the step just before the segment, or, for a segment that opens its epoch, the one just
    after it. What a worker that trained on the wrong rows would have fed its steps."""

    def __init__(self, loader: Iterable[Any], skip: int, steps: int, per_step: int, replaced: set[int]) -> None:
        self.loader, self.skip, self.steps, self.per_step, self.replaced = loader, skip, steps, per_step, replaced

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        batches = iter(self.loader)
        first, per = self.skip * self.per_step, self.per_step
        other: list[Any] = []
        for i in range(first):
            batch = next(batches, None)
            if batch is None:
                return
            if i >= first - per:
                other.append(batch)
            yield batch
        segment = [b for b in (next(batches, None) for _ in range(self.steps * per)) if b is not None]
        if not other:
            other = [b for b in (next(batches, None) for _ in range(per)) if b is not None]
            if len(other) < per:
                raise ValueError("the segment's epoch has no other step to take a batch from.")
        for i, batch in enumerate(segment):
            yield other[i % per] if i // per in self.replaced else batch
        yield from batches


def _with_tensors(template: Any, source: Any) -> Any:
    """``template`` with each tensor replaced by ``source``'s at the same place (cast to the
    template's dtype), where the source holds one of its shape; everything else as it was."""
    if isinstance(template, torch.Tensor):
        if isinstance(source, torch.Tensor) and source.shape == template.shape:
            return source.detach().to(device="cpu", dtype=template.dtype).contiguous()
        return template
    if isinstance(template, dict):
        return {
            k: _with_tensors(v, source.get(k) if isinstance(source, Mapping) else None) for k, v in template.items()
        }
    if isinstance(template, list | tuple):
        picks = source if isinstance(source, list | tuple) and len(source) == len(template) else [None] * len(template)
        return type(template)(_with_tensors(v, s) for v, s in zip(template, picks, strict=True))
    return template


def canary_state(
    build: Build,
    spec: Mapping[str, Any],
    data: Path | None,
    segment: Segment,
    out: Path,
    *,
    device: str = "cpu",
    draw: Draw | None = None,
    least: float = CANARY_DISTANCE,
) -> str:
    """Write to ``out`` a canary end for ``segment``: the segment trained again from its
    start by the run's own code, precision and seeds, except that some of its steps train on
    another step's rows (``draw(steps, k)`` picks which k; the operating system's randomness
    by default): a genuine training state, every weight, moment and counter the consequence
    of the steps before it, that lies at least ``least`` of the segment's mean steps from
    the committed end. One step replaced, then two, four, … until it does (each a
    re-execution of the segment). Everything in the file but the trained tensors (the
    optimizer's settings, the schedule, the scaler, the counters) is the committed end's.
    Returns the sha256 of its weights (``weights_sha256``, as a leaf commits to it).
    ArtifactError when a checkpoint cannot be used; ValueError when no canary lands that far
    (an epoch of one step, a segment whose steps barely move)."""
    import secrets

    pick = draw or (lambda population, k: secrets.SystemRandom().sample(list(population), k))
    trainer = build(spec, data, device)
    untrained = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    a, b = segment.start_leaf, segment.end_leaf
    steps = b.step - a.step
    if b.index != a.index + 1 or steps < 1:
        raise ArtifactError(f"checkpoints {a.index} and {b.index} are not one segment.")
    bound = state_bound(trainer.model)
    for path, leaf in ((segment.start, a), (segment.end, b)):
        if path.stat().st_size > bound or file_sha256(path) != leaf.state_sha256:
            raise ArtifactError(f"checkpoint {leaf.index} is not the one its leaf commits to.")
    start, end = read_state_file(segment.start, bound), read_state_file(segment.end, bound)
    per_epoch = steps_per_epoch(trainer.train_loader, trainer.config)
    skip = a.step % per_epoch
    gap, count = 0.0, 1
    while True:
        replaced = set(pick(range(steps), min(count, steps)))
        trainer.model.load_state_dict(untrained)
        loader = _OtherRows(trainer.train_loader, skip, steps, trainer.config.grad_accumulation, replaced)
        reached = replay(
            trainer.model,
            loader,
            trainer.step_fn,
            trainer.config,
            start,
            steps,
            source=f"checkpoint {a.index}",
            device=device,
            on_epoch=trainer.on_epoch,
            mixed_precision=True,
        )
        trainer.model.cpu()
        weights = distance(start["model"], end["model"], trainer.model.state_dict(), steps)
        moments = distance(first_moments(start), first_moments(end), first_moments(reached), steps)
        gap = max(weights, moments)
        if gap >= least or count >= steps:
            break
        count *= 2
    if not gap >= least:
        raise ValueError(f"no canary of segment {a.index} lands {least:g} steps' updates away (best {gap:.2f}).")
    state = _with_tensors(end, {**reached, "model": trainer.model.state_dict()})
    save_state_file(out, state)
    return weights_sha256(trainer.model)


def within(gap: float, tolerance: float = TOLERANCE) -> bool:
    """Whether a segment whose end lies ``gap`` steps' updates from its re-execution passes."""
    return math.isfinite(gap) and gap <= tolerance


def _verdict(gap: float | str, segment: Segment, tolerance: float) -> str:
    """The requester's reading of one ``measure_segments`` figure. Re-executing in fp32 and
    then, beyond the tolerance, in the run's mixed precision matters: at the cube defaults
    fp32 alone puts 11 of 282 honest bf16-trained segments past 0.5 (up to 0.70; 1.47 in
    another run, late in the schedule where a step's update is small), which fails most
    honest tasks once 42 are drawn; the bf16 re-execution on the same CPU lands them at 0."""
    a, b = segment.start_leaf, segment.end_leaf
    where = f"segment {a.index} (steps {a.step}→{b.step})"
    if isinstance(gap, str):
        return f"{where} {gap}"
    if within(gap, tolerance):
        return ""
    away = f"{gap:.2f} of a step's update" if math.isfinite(gap) else "infinitely far"
    return f"{where} does not re-execute: its end is {away} away; tolerance {tolerance:g}."
