"""Entry points for the asl_training kind: ``run`` trains, ``verify`` re-measures a checkpoint.

``run`` is what a provider node calls (``training.<kind>.run``): it reads the dataset
(cached once), splits it by participant, trains through the shared loop, and writes
model.safetensors, config.json, labels.json and metrics.json into ``out_dir``. ``verify``
is what the platform calls on a held-out dataset it never sent: it rebuilds the model from
those artifacts and recomputes top-1 / top-5 accuracy, in full precision and independent of
batch composition, so the same files always give the same figures.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from training.artifacts import weights_sha256, write_json
from training.asl import export
from training.asl.augment import Augmenter
from training.asl.data import SequenceDataset, make_loader, split_by_participant
from training.asl.dataset import LandmarkDataset, load_dataset, read_dataset_index, reading_on_demand
from training.asl.landmarks import selected_landmarks
from training.asl.metrics import accuracy_metrics, confusion_summary, predict_logits
from training.asl.model import ModelConfig, SignModel
from training.asl.parquet import DatasetError
from training.asl.spec import TrainSpec, preset_batch
from training.device import seed_everything, select_device
from training.loop import LoopConfig, fit
from training.plugin import DataUnreadable, TrainingPlan
from training.portable import portable_init
from training.replay import Build, Trainer, canary_state, check_segments, plan_of, total_steps
from training.replay import measure_segments as measure
from training.trace import Segment, trace_every

Progress = Callable[[dict[str, Any]], None]
CHECKPOINT_DIR = "checkpoints"


def model_config(spec: TrainSpec, num_classes: int) -> ModelConfig:
    """The model configuration a spec asks for (what config.json of its model must say)."""
    return ModelConfig(
        num_classes=num_classes,
        dim=spec.dim,
        blocks=spec.blocks,
        max_len=spec.max_len,
        use_pose=spec.use_pose,
        drop_path=spec.drop_path,
        dropout=spec.dropout,
        mlp_expand=spec.mlp_expand,
        normalisation=spec.normalisation,
    )


def build_model(spec: TrainSpec, num_classes: int) -> SignModel:
    """The model a spec asks for."""
    return SignModel(model_config(spec, num_classes))


def augmenter(spec: TrainSpec, points: list[int]) -> Augmenter | None:
    """The training split's augmentation policy a spec asks for (None: augmentations off)."""
    if not spec.use_augmentations:
        return None
    return Augmenter(
        points,
        spec.p_temporal,
        spec.p_spatial,
        spec.p_noise,
        spec.p_masking,
        p_flip=spec.p_flip,
        rotate_degrees=spec.rotate_degrees,
        p_spatial_mask=spec.p_spatial_mask,
        interpolation=spec.resample_interpolation,
        crop=spec.max_len if spec.random_crop else 0,
    )


def trainer(
    spec: Mapping[str, Any],
    data: Path | None,
    device: str | None = None,
    *,
    capabilities: dict[str, Any] | None = None,
    cache_dir: Path | None = None,
    max_steps_per_epoch: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Trainer:
    """The untrained model, loaders, step and loop settings a spec and the worker's ISLR
    dataset (folder or zip) give: what ``run`` trains and what a replay of its trace
    re-executes. Late dropout switches on per epoch (``on_epoch``), AWP with the loop's
    ``awp_from_epoch``, both at the late phase's first epoch."""
    settings, location = _settings(spec, data)
    # The cache holds only the model's points, in its order.
    loaded = load_dataset(location, cache_dir, points=selected_landmarks(settings.use_pose), progress=progress)
    return trainer_on(settings, loaded, device, capabilities=capabilities, max_steps_per_epoch=max_steps_per_epoch)


def _settings(spec: Mapping[str, Any], data: Path | None) -> tuple[TrainSpec, Path]:
    """The spec's settings and the dataset's location; DatasetError without a dataset."""
    if data is None:
        raise DatasetError("dataset", "asl_training needs an ISLR dataset")
    return TrainSpec.from_dict(dict(spec)), Path(data)


def index_trainer(spec: Mapping[str, Any], data: Path | None) -> Trainer:
    """``trainer(spec, data, "cpu")`` built from the dataset's index alone
    (``read_dataset_index``): the same untrained model, split, loaders and loop settings,
    hence the same plan, without decoding a sequence or writing a cache. Its loaders'
    batches cannot be read (a RuntimeError names the sequence)."""
    settings, location = _settings(spec, data)
    index = read_dataset_index(location, points=selected_landmarks(settings.use_pose))
    return trainer_on(settings, index, "cpu")


def trainer_on(
    settings: TrainSpec,
    loaded: LandmarkDataset,
    device: str | None = None,
    *,
    capabilities: dict[str, Any] | None = None,
    max_steps_per_epoch: int | None = None,
) -> Trainer:
    """``trainer`` of ``settings`` over the dataset ``loaded`` (holding the model's points)."""
    train_rows, val_rows, held_out = split_by_participant(
        loaded.participants, settings.validation_fraction, settings.seed
    )
    seed_everything(settings.seed)  # the initial weights are part of a replayable run
    model = portable_init(build_model(settings, len(loaded.signs)), settings.seed)  # the same bits everywhere
    points = model.config.points
    target = select_device(device)
    batch, accumulation = preset_batch(settings, capabilities)
    train_set = SequenceDataset(loaded.subset(train_rows), points, settings.max_len, augmenter(settings, points))
    val_set = SequenceDataset(loaded.subset(val_rows), points, settings.max_len)
    train_loader = make_loader(train_set, batch, shuffle=True, device=target, drop_last=len(train_set) > batch)
    val_loader = make_loader(val_set, max(batch, 32), shuffle=False, device=target)
    late_from = settings.late_epoch

    def on_epoch(epoch: int) -> None:
        model.late_dropout.active = epoch >= late_from

    def step_fn(runner: nn.Module, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, Any]]:
        logits = runner(batch["x"], batch["lengths"]).float()
        loss = F.cross_entropy(logits, batch["y"], label_smoothing=settings.label_smoothing)
        return loss, {"top1": (logits.argmax(1) == batch["y"]).float().mean()}

    def eval_fn(runner: nn.Module, loader: Iterable[Any]) -> dict[str, float]:
        logits, labels = predict_logits(runner, loader)
        return accuracy_metrics(logits, labels)

    loop = LoopConfig(
        epochs=settings.epochs,
        optimizer=settings.optimizer,  # type: ignore[arg-type]
        lr=settings.learning_rate,
        weight_decay=settings.weight_decay,
        schedule=settings.schedule,  # type: ignore[arg-type]
        grad_clip=1.0,
        grad_accumulation=accumulation,
        mixed_precision=settings.mixed_precision,
        compile=settings.compile,
        early_stopping_patience=settings.early_stopping_patience,
        monitor="val_top1",
        monitor_mode="max",
        seed=settings.seed,
        device=str(target),
        max_steps_per_epoch=max_steps_per_epoch,
        awp_lambda=settings.awp_lambda,
        awp_from_epoch=late_from,
    )
    extras = {
        "data": loaded,
        "train_rows": train_rows,
        "val_rows": val_rows,
        "held_out": held_out,
        "batch": batch,
        "accumulation": accumulation,
    }
    return Trainer(model, train_loader, step_fn, loop, on_epoch, val_loader, eval_fn, extras)


@contextmanager
def decoding_on_demand(spec: Mapping[str, Any], data: Path | None) -> Iterator[Build]:
    """A ``Build`` of ``trainer``'s trainer over the worker's dataset read on demand
    (``reading_on_demand``), for as long as the block lasts: the same model, split and
    loaders, whose batches decode only their own sequences when they are built. What a
    re-execution of a few segments reads, in place of a cache of every sequence: a segment
    past an epoch's start builds none of the batches before it (``EpochLoader.iter_from``).
    A sequence that cannot be decoded raises ``SequenceUnreadable``, not a verdict."""
    settings, location = _settings(spec, data)
    with reading_on_demand(location, points=selected_landmarks(settings.use_pose)) as loaded:

        def build(spec: Mapping[str, Any], data: Path | None, device: str) -> Trainer:
            return trainer_on(_settings(spec, data)[0], loaded, device)

        yield build


@contextmanager
def replaying(spec: Mapping[str, Any], data: Path | None, segments: Sequence[Segment] | None) -> Iterator[Build]:
    """The ``Build`` a re-execution of ``segments`` uses. The worker's dataset is read on
    demand (``decoding_on_demand``) when the segments' steps read fewer sequences than the
    share holds: each replayed step reads its micro-batches, twice when a mixed-precision
    segment is re-executed again. Otherwise a cache of the share is built once
    (``trainer``), and every step then reads from it. With ``segments`` None (a canary,
    whose steps on other rows read from the epoch's first batch) it is the cache."""
    if segments is not None:
        index = index_trainer(spec, data)
        steps = sum(max(0, s.end_leaf.step - s.start_leaf.step) for s in segments)
        reads = 2 * steps * int(index.extras["batch"]) * int(index.extras["accumulation"])
        if reads <= len(index.extras["data"]):
            with decoding_on_demand(spec, data) as build:
                yield build
            return
    with tempfile.TemporaryDirectory(prefix="asl-replay-") as cache:

        def build(spec: Mapping[str, Any], data: Path | None, device: str) -> Trainer:
            try:
                return trainer(spec, data, device, cache_dir=Path(cache))
            except DatasetError as exc:  # the platform's copy of the share, as on demand
                raise DataUnreadable(str(exc)) from exc

        yield build


def measure_segments(
    spec: Mapping[str, Any], data: Path | None, segments: Sequence[Segment], *, device: str = "cpu"
) -> list[float | str]:
    """``training.replay.measure_segments`` for an asl_training run: per segment, its distance or why not."""
    with replaying(spec, data, segments) as build:
        return measure(build, spec, data, segments, device=device)


def canary_segment(
    spec: Mapping[str, Any], data: Path | None, segment: Segment, out: Path, *, device: str = "cpu"
) -> str:
    """``training.replay.canary_state`` for an asl_training run: write a canary end, return its weights' sha256."""
    with replaying(spec, data, None) as build:
        return canary_state(build, spec, data, segment, out, device=device)


def replay_segments(
    spec: Mapping[str, Any], data: Path | None, segments: Sequence[Segment], *, device: str = "cpu"
) -> list[str]:
    """``training.replay.check_segments`` for an asl_training run: "" or the reason, per segment."""
    with replaying(spec, data, segments) as build:
        return check_segments(build, spec, data, segments, device=device)


def untrained_weights(spec: Mapping[str, Any], data: Path | None) -> str:
    """The sha256 of the weights a run of ``spec`` on ``data`` starts from (its checkpoint 0),
    from the dataset's index alone (``index_trainer``)."""
    return weights_sha256(index_trainer(spec, data).model)


def training_plan(spec: Mapping[str, Any], data: Path | None) -> TrainingPlan:
    """What a run of ``spec`` on the worker's ``data`` starts from and how many steps it
    takes, from the dataset's index alone (``index_trainer``): no sequence is decoded."""
    return plan_of(index_trainer(spec, data))


def run(
    spec: dict[str, Any],
    data_dir: Path,
    out_dir: Path,
    progress: Progress | None = None,
    *,
    capabilities: dict[str, Any] | None = None,
    cache_dir: Path | None = None,
    device: str | None = None,
    resume: bool = True,
    export_onnx: bool = False,
    max_steps_per_epoch: int | None = None,
    trace_dir: Path | None = None,
) -> dict[str, Any]:
    """Train on the ISLR dataset at ``data_dir`` (folder or zip); artifacts go to ``out_dir``.

    Returns the metrics also written to metrics.json. Progress events are the shared
    loop's (``step``, ``epoch``) plus ``{"event": "reading", "done", "total"}`` while the
    dataset is cached. Raises DatasetError (naming the file) for a malformed dataset and
    ValueError (naming the field) for a bad spec. With ``resume`` a run interrupted after
    an epoch continues from its checkpoint in ``out_dir``. With ``trace_dir`` the run
    writes its training trace there (``training.trace``; the metrics' ``trace`` is its
    commitment).
    """
    started = time.perf_counter()
    settings = TrainSpec.from_dict(spec)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    emit = progress or (lambda event: None)
    built = trainer(
        spec,
        Path(data_dir),
        device,
        capabilities=capabilities,
        cache_dir=cache_dir,
        max_steps_per_epoch=max_steps_per_epoch,
        progress=lambda done, total: emit({"event": "reading", "done": done, "total": total}),
    )
    model, val_loader, data = cast(SignModel, built.model), built.val_loader, built.extras["data"]
    train_rows, val_rows = built.extras["train_rows"], built.extras["val_rows"]
    target = select_device(built.config.device)
    loop = built.config
    if trace_dir is not None:
        loop = replace(loop, trace_every=trace_every(total_steps(built)))
    if target.type == "cuda":
        torch.backends.cudnn.benchmark = True
    assert built.eval_fn is not None
    result = fit(
        model,
        built.train_loader,
        val_loader,
        built.step_fn,
        built.eval_fn,
        loop,
        progress,
        out_dir / CHECKPOINT_DIR,
        resume=resume,
        trace_dir=trace_dir,
        on_epoch=built.on_epoch,
    )

    model.eval()
    logits, labels = predict_logits(model, val_loader)
    metrics: dict[str, Any] = {
        **accuracy_metrics(logits, labels),
        "confusion": confusion_summary(logits, labels, data.signs),
        "epochs_run": result.epochs_run,
        "best_epoch": result.best_epoch,
        "stopped_early": result.stopped_early,
        "train_sequences": len(train_rows),
        "val_sequences": len(val_rows),
        "val_participants": built.extras["held_out"],
        "num_signs": len(data.signs),
        "batch_size": built.extras["batch"],
        "grad_accumulation": built.extras["accumulation"],
        "device": str(target),
        "history": result.history,
        "seconds": time.perf_counter() - started,
    }
    if result.trace is not None:
        metrics["trace"] = result.trace.commitment()
    metrics["meets_min_accuracy"] = metrics["val_top1"] >= settings.min_accuracy
    model.cpu()
    export.save(out_dir, model, data.signs)
    if export_onnx:
        path = export.export_onnx(model, out_dir / export.ONNX_FILE)
        samples = [data.landmarks(int(i)) for i in val_rows[:4]]
        metrics["onnx_max_abs_diff"] = export.onnx_parity(model, path, samples)
    write_json(out_dir / "metrics.json", metrics)
    return metrics


def evaluate_dataset(
    model: SignModel, signs: list[str], data: LandmarkDataset, batch_size: int = 64
) -> tuple[np.ndarray, np.ndarray]:
    """Logits of ``model`` on every sequence of ``data``, labels mapped to the model's signs."""
    index = {s: i for i, s in enumerate(signs)}
    unknown = sorted(set(data.signs) - set(index))
    if unknown:
        raise DatasetError("train.csv", f"signs the model does not know: {', '.join(unknown[:5])}")
    remap = np.array([index[s] for s in data.signs], dtype=np.int64)
    mapped = replace(data, labels=remap[data.labels], signs=signs)
    loader = make_loader(
        SequenceDataset(mapped, model.config.points, model.config.max_len),
        batch_size,
        shuffle=False,
        device=next(model.parameters()).device,
    )
    return predict_logits(model, loader)


def verify(
    model_dir: Path, data_dir: Path, *, cache_dir: Path | None = None, device: str | None = "cpu"
) -> dict[str, Any]:
    """Recompute held-out accuracy of the model in ``model_dir`` on the dataset at ``data_dir``.

    Returns ``{"top1", "top5", "loss", "count", "confusion"}``. Deterministic: eval mode,
    full precision, and a model whose output for a sequence does not depend on its batch.
    """
    model, signs = export.load(model_dir, select_device(device))
    data = load_dataset(Path(data_dir), cache_dir, points=model.config.points)
    logits, labels = evaluate_dataset(model, signs, data)
    raw = accuracy_metrics(logits, labels, prefix="")
    return {**raw, "count": int(labels.size), "confusion": confusion_summary(logits, labels, signs)}


CHANCE_ALPHA = 0.01  # guessing clears the floor at most once in 100
# How far a reported accuracy may be from the recomputed one, in binomial standard errors.
CLAIM_STANDARD_ERRORS = 3.0


def chance_floor(classes: int, count: int) -> float:
    """The held-out top-1 accuracy a model must reach to show it learned anything: the
    fewest right answers out of ``count`` sequences that guessing among ``classes`` signs
    reaches with probability at most 1 % (the exact binomial tail, not a normal
    approximation, which lets guessing through 3 % of the time on 10 sequences of 5
    signs), as a fraction. 1 when even a perfect score is likelier than that."""
    if classes <= 1 or count <= 0:
        return 0.0
    log_p, log_q = -math.log(classes), math.log1p(-1.0 / classes)
    log_n = math.lgamma(count + 1)
    tail = 0.0  # P(at least k right by guessing), summed from the top, smallest terms first
    for k in range(count, -1, -1):
        tail += math.exp(log_n - math.lgamma(k + 1) - math.lgamma(count - k + 1) + k * log_p + (count - k) * log_q)
        if tail > CHANCE_ALPHA:
            return min((k + 1) / count, 1.0)
    return 0.0  # not reached: the whole tail is 1


def accepts(reported: float, recomputed: float, count: int, min_accuracy: float = 0.0) -> bool:
    """Whether a reported accuracy is close enough to the platform's recomputed one.

    The tolerance is three binomial standard errors of the held-out set (at least one
    sequence's worth), since the worker reports its own validation split, not this one.
    """
    if count <= 0:
        return False
    p = min(max(recomputed, 1.0 / count), 1.0 - 1.0 / count) if count > 1 else 0.5
    tolerance = max(CLAIM_STANDARD_ERRORS * math.sqrt(p * (1 - p) / count), 1.0 / count)
    return abs(reported - recomputed) <= tolerance and recomputed >= min_accuracy
