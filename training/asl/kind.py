"""The ASL kinds: asl_training (an isolated sign recogniser trained on ISLR-format landmark
sequences) and asl_inference (the top signs for uploaded sequences)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from training.asl.spec import AslInferenceSpec, AslTrainingSpec
from training.plugin import (
    GIB,
    DatasetProblem,
    Kind,
    Outcome,
    Progress,
    Resources,
    Spec,
    Upload,
    always,
    inference_flops,
    inference_resources,
    micro,
    model_dir,
    sha256_file,
)
from training.specs import default

MODEL_FILES = ("model.safetensors", "config.json", "labels.json")


def _training_flops(spec: Spec) -> float:
    dim = int(spec["dim"])
    per_frame = spec["blocks"] * (3 * 2 * 2 * dim * dim * 2 + 12 * dim * dim)
    return 3.0 * per_frame * spec["max_len"] * 20_000 * spec["epochs"]


def _training_resources(spec: Spec) -> Resources:
    dim = int(spec["dim"])
    activations = spec["batch_size"] * spec["max_len"] * dim * spec["blocks"] * 4 * 40
    return Resources(memory_bytes=max(activations + 512 * 1024**2, GIB))


def prepare(spec: Spec, source: Path | None, out_dir: Path) -> tuple[Path | None, Path]:
    """The platform's held-out split (training.asl.split.prepare)."""
    from training.asl.split import prepare as split

    return split(spec, source, out_dir)


def _archive(upload: Upload, check: str, read: Callable[[Path], object]) -> None:
    """Run ``read`` on the upload's file; its DatasetError is a DatasetProblem naming the
    upload. The verdict is remembered either way (a large train.csv takes seconds to read)."""
    from training.asl.parquet import DatasetError

    def problem() -> str:
        try:
            read(upload.path)
        except DatasetError as exc:
            return str(exc)
        return ""

    found = upload.remember(f"{check}-problem:{upload.id}:{upload.sha256}", problem)
    if found:
        # Errors name the archive by its stored name; the requester knows it by theirs.
        where = found.replace(upload.path.name, upload.name, 1)
        where = where if where.startswith(f"{upload.name}: ") else f"{upload.name}: {where}"
        raise DatasetProblem(f"{where}.")


def check_training_dataset(spec: Spec, upload: Upload, source: Spec | None) -> None:
    """Refuse an ISLR training archive the platform's held-out split would refuse before any
    worker saw it: not a zip, a train.csv that is missing, malformed or names missing files,
    fewer participants than the split needs (the archive's directory and train.csv only; a
    damaged sequence file still shows at the split, as a failure with a full refund)."""
    from training.asl.dataset import read_index
    from training.asl.source import Source
    from training.asl.split import heldout_participants

    def split_would_take(path: Path) -> None:
        with Source(path, max_bytes=max(1, path.stat().st_size)) as archive:
            entries, _signs = read_index(archive)
        heldout_participants([entry.participant_id for entry in entries], seed=0)

    _archive(upload, "islr-index", split_would_take)


def check_inference_dataset(spec: Spec, upload: Upload, source: Spec | None) -> None:
    """Refuse an archive of inference inputs the worker's predict would refuse before reading
    a sequence: not a zip, no sequence files, a train.csv naming missing files (the archive's
    directory and train.csv only). A .parquet dataset is one sequence, its format sniffed."""
    from training.asl.infer import count_inputs

    if upload.format == "zip":
        _archive(upload, "islr-inputs", count_inputs)


def _gpu_capabilities() -> dict[str, Any]:
    """What the ASL batch presets read: this node's GPU memory (none on CPU)."""
    import torch

    if not torch.cuda.is_available():
        return {}
    return {"gpu_memory_bytes": int(torch.cuda.get_device_properties(0).total_memory)}


def run_training(job: dict[str, Any], workdir: Path, progress: Progress) -> Outcome:
    """Train with training.asl.run on the downloaded (held-out-free) zip; claim val_top1."""
    from training.asl.run import run as train

    if not job.get("dataset"):
        raise RuntimeError("asl_training needs an ISLR dataset.")

    validation: dict[str, float] = {}

    def report(event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "epoch":
            # The latest validation figures ride along with every later step, so they chart
            # even when the reporter coalesces the epoch event away.
            validation.update({k: float(v) for k, v in event.get("val", {}).items() if isinstance(v, int | float)})
        elif kind != "step":
            return
        total = max(int(event["total_steps"]), 1)
        metrics = dict(validation)
        if kind == "step":
            metrics.update({"loss": float(event["loss"]), "lr": float(event["lr"])})
            metrics.update({k: float(v) for k, v in event.get("metrics", {}).items() if isinstance(v, int | float)})
        progress(min(int(event["step"]), total), total, metrics)

    out_dir = workdir / "model"
    data = workdir / f"dataset.{job['dataset']['format']}"
    metrics = train(
        job["spec"], data, out_dir, report, capabilities=_gpu_capabilities(), cache_dir=workdir / "cache", resume=False
    )
    proof = {
        "val_top1_micro": micro(metrics["val_top1"]),
        "val_top5_micro": micro(metrics["val_top5"]),
        "train_sequences": int(metrics["train_sequences"]),
        "val_sequences": int(metrics["val_sequences"]),
        "micros": micro(metrics["seconds"]),
    }
    return Outcome(
        result_hash=sha256_file(out_dir / "model.safetensors"),
        proof=proof,
        artifacts={name: out_dir / name for name in ASL_TRAINING.artifacts},
    )


def run_inference(job: dict[str, Any], workdir: Path, progress: Progress) -> Outcome:
    """Fetch the source task's model, predict the top signs, commit to sha256(predictions.csv)."""
    from training.asl.infer import PREDICTIONS_FILE, predict

    if job.get("fetch") is None:
        raise RuntimeError("asl_inference needs the node's authenticated download (job['fetch']).")
    if not job.get("dataset"):
        raise RuntimeError("asl_inference needs a dataset of landmark sequences.")
    folder = model_dir(job, workdir, MODEL_FILES)
    t0 = time.monotonic()
    out_dir = workdir / "predictions"
    summary = predict(
        folder,
        workdir / f"dataset.{job['dataset']['format']}",
        out_dir,
        top_k=int(job["spec"].get("top_k", default(AslInferenceSpec, "top_k"))),
        progress=lambda event: progress(int(event["done"]), max(int(event["total"]), 1), {}),
    )
    path = out_dir / PREDICTIONS_FILE
    return Outcome(
        result_hash=sha256_file(path),
        proof={"sequences": int(summary["sequences"]), "micros": micro(time.monotonic() - t0)},
        artifacts={PREDICTIONS_FILE: path},
    )


ASL_TRAINING = Kind(
    name="asl_training",
    label="ASL recognition training",
    description="Train an isolated sign recogniser on ISLR-format landmark sequences.",
    spec=AslTrainingSpec,
    resources=_training_resources,
    flops=_training_flops,
    run=run_training,
    artifacts=(*MODEL_FILES, "metrics.json"),
    dataset_formats=("zip",),
    dataset_required=always,
    model_files=MODEL_FILES,
    prepare=prepare,
    check_dataset=check_training_dataset,
)

ASL_INFERENCE = Kind(
    name="asl_inference",
    label="ASL recognition inference",
    description="Predict the top signs for uploaded landmark sequences with a trained model.",
    spec=AslInferenceSpec,
    resources=inference_resources,
    flops=inference_flops,
    run=run_inference,
    artifacts=("predictions.csv",),
    dataset_formats=("zip", "parquet"),
    dataset_required=always,
    source_kind="asl_training",
    check_dataset=check_inference_dataset,
)
