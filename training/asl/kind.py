"""The ASL kinds: asl_training (an isolated sign recogniser trained on ISLR-format landmark
sequences) and asl_inference (the top signs for uploaded sequences)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from training import plugin
from training.asl.spec import AslInferenceSpec, AslTrainingSpec, TrainSpec, preset_batch
from training.plugin import GIB, WEIGHTS, DatasetProblem, Progress, Resources, Spec, Upload, micro, numbers
from training.specs import default

MODEL_FILES = (WEIGHTS, "config.json", "labels.json")


def _training_flops(spec: Spec) -> float:
    dim = int(spec["dim"])
    per_frame = spec["blocks"] * (3 * 2 * 2 * dim * dim * 2 + 12 * dim * dim)
    # An AWP epoch's steps take two forward and backward passes.
    epochs = spec["epochs"] + AslTrainingSpec.from_dict(dict(spec)).awp_epochs
    return 3.0 * per_frame * spec["max_len"] * 20_000 * epochs


def _training_resources(spec: Spec) -> Resources:
    dim = int(spec["dim"])
    activations = spec["batch_size"] * spec["max_len"] * dim * spec["blocks"] * 4 * 40
    return Resources(memory_bytes=max(activations + 512 * 1024**2, GIB))


def prepare(spec: Spec, source: Path | None, out_dir: Path, secret_seed: bytes) -> tuple[Path | None, Path]:
    """The platform's held-out split (training.asl.split.prepare): two sharded folders."""
    from training.asl.split import prepare as split

    return split(spec, source, out_dir, secret_seed)


def ingest(spec: Spec, folder: Path, listed: Sequence[plugin.Listed], fetch: plugin.FetchListed) -> None:
    """The node's download of the worker share, each shard read into the dataset's cache and
    deleted as it arrives (training.asl.ingest)."""
    from training.asl.ingest import ingest as read_in

    read_in(spec, folder, listed, fetch)


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
    worker saw it: not a zip, one that expands too far, a train.csv that is missing,
    malformed or names missing or oversized files, fewer participants than the split needs
    (the archive's directory and train.csv only, so a dataset of any size is checked in the
    time train.csv takes; a damaged sequence file still shows at the split, as a failure
    with a full refund)."""
    from training.asl.dataset import read_index
    from training.asl.split import check_sizes, heldout_participants, open_upload

    def split_would_take(path: Path) -> None:
        with open_upload(path) as archive:
            entries, _signs = read_index(archive)
            check_sizes(archive, entries)
        heldout_participants([entry.participant_id for entry in entries], bytes(32))

    _archive(upload, "islr-index", split_would_take)


def _gpu_capabilities() -> dict[str, Any]:
    """What the ASL batch presets read: this node's GPU memory (none on CPU)."""
    import torch

    if not torch.cuda.is_available():
        return {}
    return {"gpu_memory_bytes": int(torch.cuda.get_device_properties(0).total_memory)}


def train(job: dict[str, Any], workdir: Path, out_dir: Path, progress: Progress) -> dict[str, Any]:
    """Train with training.asl.run on the downloaded (held-out-free) data, the sharded folder
    ``dataset.shards`` (ingested into its cache as it downloaded, ``ingest``) or a zip;
    claim val_top1."""
    from training.asl.run import run as train_asl

    if not job.get("dataset"):
        raise RuntimeError("asl_training needs an ISLR dataset.")

    validation: dict[str, float] = {}

    def report(event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "epoch":
            # The latest validation figures ride along with every later step, so they chart
            # even when the reporter coalesces the epoch event away.
            validation.update(numbers(event.get("val", {})))
        elif kind != "step":
            return
        total = max(int(event["total_steps"]), 1)
        metrics = dict(validation)
        if kind == "step":
            metrics.update({"loss": float(event["loss"]), "lr": float(event["lr"])})
            metrics.update(numbers(event.get("metrics", {})))
        progress(min(int(event["step"]), total), total, metrics)

    data = workdir / f"dataset.{job['dataset']['format']}"
    metrics = train_asl(
        job["spec"],
        data,
        out_dir,
        report,
        capabilities=_gpu_capabilities(),
        cache_dir=workdir / "cache",
        resume=False,
        trace_dir=plugin.trace_dir(workdir),
    )
    return {
        "val_top1_micro": micro(metrics["val_top1"]),
        "val_top5_micro": micro(metrics["val_top5"]),
        "train_sequences": int(metrics["train_sequences"]),
        "val_sequences": int(metrics["val_sequences"]),
        "micros": micro(metrics["seconds"]),
    }


def replay(spec: Spec, data: Path | None, segments: Any, *, device: str = "cpu") -> list[str]:
    """Re-execute challenged segments of a run's trace (training.asl.run.replay_segments)."""
    from training.asl.run import replay_segments

    return replay_segments(spec, data, segments, device=device)


def measure(spec: Spec, data: Path | None, segments: Any, *, device: str = "cpu") -> list[float | str]:
    """How far each segment's end lies from its re-execution (training.asl.run.measure_segments)."""
    from training.asl.run import measure_segments

    return measure_segments(spec, data, segments, device=device)


def canary(spec: Spec, data: Path | None, segment: Any, out: Path, *, device: str = "cpu") -> str:
    """A canary end for a segment (training.asl.run.canary_segment)."""
    from training.asl.run import canary_segment

    return canary_segment(spec, data, segment, out, device=device)


def node_spec(spec: Spec, capabilities: Mapping[str, Any]) -> Spec:
    """The spec as a node with ``capabilities`` trains it: a ``batch_size`` of 0 is the
    micro-batch its registered GPU memory presets (``preset_batch``). The node is sent that
    batch, and the platform plans and re-executes its run with it, not with the preset of
    the platform's own machine (a GPU of 24 GB or more presets a larger batch than the CPU)."""
    if spec.get("batch_size"):
        return spec
    batch, _ = preset_batch(TrainSpec.from_dict(dict(spec)), dict(capabilities))
    return {**spec, "batch_size": batch}


def plan(spec: Spec, data: Path | None) -> plugin.TrainingPlan:
    """What a run must start from and span (training.asl.run.training_plan)."""
    from training.asl.run import training_plan

    return training_plan(spec, data)


ASL_TRAINING = plugin.training_kind(
    name="asl_training",
    label="ASL recognition training",
    description="Train an isolated sign recogniser on ISLR-format landmark sequences.",
    spec=AslTrainingSpec,
    datasets=plugin.Datasets(("zip",), check=check_training_dataset, prepare=prepare, ingest=ingest),
    # The worker downloads the split's sharded folder file by file.
    features=lambda spec: (plugin.SHARDED_DATASETS,),
    node_spec=node_spec,
    model_files=MODEL_FILES,
    train=train,
    resources=_training_resources,
    flops=_training_flops,
    replay=replay,
    plan=plan,
    measure=measure,
    canary=canary,
)


def check_inference_dataset(spec: Spec, upload: Upload, source: Spec | None) -> None:
    """Refuse an archive of inference inputs the worker's predict would refuse before reading
    a sequence: not a zip, no sequence files, a train.csv naming missing files (the archive's
    directory and train.csv only). A .parquet dataset is one sequence, its format sniffed."""
    from training.asl.infer import count_inputs

    if upload.format == "zip":
        _archive(upload, "islr-inputs", count_inputs)


def predict(
    job: dict[str, Any], workdir: Path, inputs: Path, model: Path, progress: Progress
) -> tuple[Path, dict[str, Any]]:
    """Predict the top signs of each uploaded sequence with the source task's model."""
    from training.asl.infer import PREDICTIONS_FILE
    from training.asl.infer import predict as top_signs

    t0 = time.monotonic()
    out_dir = workdir / "predictions"
    summary = top_signs(
        model,
        inputs,
        out_dir,
        top_k=int(job["spec"].get("top_k", default(AslInferenceSpec, "top_k"))),
        progress=lambda event: progress(int(event["done"]), max(int(event["total"]), 1), {}),
    )
    return out_dir / PREDICTIONS_FILE, {"sequences": int(summary["sequences"]), "micros": micro(time.monotonic() - t0)}


ASL_INFERENCE = plugin.inference_kind(
    name="asl_inference",
    label="ASL recognition inference",
    description="Predict the top signs for uploaded landmark sequences with a trained model.",
    spec=AslInferenceSpec,
    datasets=plugin.Datasets(("zip", "parquet"), check=check_inference_dataset),
    source=ASL_TRAINING,
    inputs="landmark sequences",
    predict=predict,
    output="predictions.csv",
)
