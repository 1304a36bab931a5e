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
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from training.artifacts import read_json, state_exists, write_json
from training.asl import export
from training.asl.augment import Augmenter
from training.asl.data import SequenceDataset, make_loader, split_by_participant
from training.asl.dataset import LandmarkDataset, load_dataset
from training.asl.metrics import accuracy_metrics, confusion_summary, predict_logits
from training.asl.model import ModelConfig, SignModel
from training.asl.parquet import DatasetError
from training.asl.spec import TrainSpec, preset_batch
from training.device import seed_everything, select_device
from training.loop import CHECKPOINT_STEM, LoopConfig, fit

Progress = Callable[[dict[str, Any]], None]
CHECKPOINT_DIR = "checkpoints"


def late_dropout_start(epochs: int) -> int:
    """The first epoch with late dropout on: after the first fifth of training."""
    return 1 + epochs // 5


def _resumed_epoch(checkpoints: Path) -> int:
    if not state_exists(checkpoints / CHECKPOINT_STEM):
        return 0
    structure: Any = read_json((checkpoints / CHECKPOINT_STEM).with_suffix(".json"))
    try:
        return int(structure["loop"]["epoch"])
    except (KeyError, TypeError, ValueError):
        return 0


def build_model(spec: TrainSpec, num_classes: int) -> SignModel:
    """The model a spec asks for."""
    config = ModelConfig(
        num_classes=num_classes,
        dim=spec.dim,
        blocks=spec.blocks,
        max_len=spec.max_len,
        use_pose=spec.use_pose,
        drop_path=spec.drop_path,
        dropout=spec.dropout,
    )
    return SignModel(config)


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
) -> dict[str, Any]:
    """Train on the ISLR dataset at ``data_dir`` (folder or zip); artifacts go to ``out_dir``.

    Returns the metrics also written to metrics.json. Progress events are the shared
    loop's (``step``, ``epoch``) plus ``{"event": "reading", "done", "total"}`` while the
    dataset is cached. Raises DatasetError (naming the file) for a malformed dataset and
    ValueError (naming the field) for a bad spec. With ``resume`` a run interrupted after
    an epoch continues from its checkpoint in ``out_dir``.
    """
    started = time.perf_counter()
    settings = TrainSpec.from_dict(spec)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    emit = progress or (lambda event: None)

    data = load_dataset(
        Path(data_dir), cache_dir, progress=lambda done, total: emit({"event": "reading", "done": done, "total": total})
    )
    train_rows, val_rows, held_out = split_by_participant(
        data.participants, settings.validation_fraction, settings.seed
    )
    seed_everything(settings.seed)  # the initial weights are part of a replayable run
    model = build_model(settings, len(data.signs))
    points = model.config.points
    augmenter = (
        Augmenter(points, settings.p_temporal, settings.p_spatial, settings.p_noise, settings.p_masking)
        if settings.use_augmentations
        else None
    )
    target = select_device(device)
    batch, accumulation = preset_batch(settings, capabilities)
    train_set = SequenceDataset(data.subset(train_rows), points, settings.max_len, augmenter)
    val_set = SequenceDataset(data.subset(val_rows), points, settings.max_len)
    train_loader = make_loader(train_set, batch, shuffle=True, device=target, drop_last=len(train_set) > batch)
    val_loader = make_loader(val_set, max(batch, 32), shuffle=False, device=target)

    checkpoints = out_dir / CHECKPOINT_DIR
    epoch_now = {"epoch": (_resumed_epoch(checkpoints) if resume else 0) + 1}
    dropout_from = late_dropout_start(settings.epochs)

    def on_progress(event: dict[str, Any]) -> None:
        if event.get("event") == "epoch":
            epoch_now["epoch"] = int(event["epoch"]) + 1
        emit(event)

    def step_fn(runner: nn.Module, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, Any]]:
        model.late_dropout.active = epoch_now["epoch"] >= dropout_from
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
    )
    if target.type == "cuda":
        torch.backends.cudnn.benchmark = True
    result = fit(model, train_loader, val_loader, step_fn, eval_fn, loop, on_progress, checkpoints, resume=resume)

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
        "val_participants": held_out,
        "num_signs": len(data.signs),
        "batch_size": batch,
        "grad_accumulation": accumulation,
        "device": str(target),
        "history": result.history,
        "seconds": time.perf_counter() - started,
    }
    metrics["meets_min_accuracy"] = metrics["val_top1"] >= settings.min_accuracy
    model.cpu()
    export.save(out_dir, model, data.signs)
    if export_onnx:
        path = export.export_onnx(model, out_dir / export.ONNX_FILE)
        samples = [np.array(data.sequence(int(i))) for i in val_rows[:4]]
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
    mapped = LandmarkDataset(
        data.frames, data.starts, data.lengths, remap[data.labels], data.participants, data.sequence_ids, signs
    )
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
    data = load_dataset(Path(data_dir), cache_dir)
    logits, labels = evaluate_dataset(model, signs, data)
    raw = accuracy_metrics(logits, labels, prefix="")
    return {**raw, "count": int(labels.size), "confusion": confusion_summary(logits, labels, signs)}


CHANCE_ALPHA = 0.01  # guessing clears the floor at most once in 100


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
    tolerance = max(3.0 * math.sqrt(p * (1 - p) / count), 1.0 / count)
    return abs(reported - recomputed) <= tolerance and recomputed >= min_accuracy
