"""The cube kinds: cube_training (a 3D cellular network trained on teacher embeddings) and
cube_inference (embedding uploaded rows with a trained model)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from training import plugin
from training.cube.spec import CubeInferenceSpec, CubeTrainingSpec
from training.plugin import GIB, WEIGHTS, DatasetProblem, Progress, Resources, Spec, Upload, micro, numbers
from training.specs import default

MODEL_FILES = (WEIGHTS, "config.json")
# An upload of embeddings: either format training.cube.data reads.
EMBEDDINGS = ("npy", "safetensors")
OUTPUTS = "outputs.npy"


def _cells(spec: Spec) -> int:
    return int(spec["lattice_edge"]) ** 3


def _steps(spec: Spec) -> int:
    """The lattice steps a run of ``spec`` really takes (0 asks for T_min(S))."""
    from training.cube.neighbours import reach_steps

    return int(spec["steps"]) or reach_steps(int(spec["lattice_edge"]))


def check_training_spec(spec: Spec) -> dict[str, str]:
    """Refuse a lattice too shallow for its size: with fewer than T_min(S) steps some
    output-face cell never sees some input-face cell, so the model need not use its lattice."""
    from training.cube.neighbours import reach_steps

    steps, edge = int(spec["steps"]), int(spec["lattice_edge"])
    least = reach_steps(edge)
    if 0 < steps < least:
        return {
            "steps": f"{steps} steps leave part of the output face of a {edge}³ lattice unreached by the"
            f" input face: at least {least} are needed (or 0 for exactly {least})."
        }
    return {}


def _training_flops(spec: Spec) -> float:
    # Per sample per step every cell mixes ~3 experts over ~64 neighbours of width state².
    per_sample = _cells(spec) * _steps(spec) * 3 * 64 * spec["state_size"] ** 2 * 2
    samples = max(spec.get("synthetic_samples", 0), 1024)
    return 3.0 * per_sample * samples * spec["epochs"]


def _training_resources(spec: Spec) -> Resources:
    # Activations kept for backward: cells × state × steps × batch × bytes, ×8 for experts.
    activations = _cells(spec) * spec["state_size"] * _steps(spec) * spec["batch_size"] * 4 * 8
    return Resources(memory_bytes=max(activations + 256 * 1024**2, GIB // 2))


def _needs_dataset(spec: Spec) -> bool:
    return bool(spec["synthetic_samples"] == 0)


def prepare(spec: Spec, source: Path | None, out_dir: Path, secret_seed: bytes) -> tuple[Path | None, Path]:
    """The platform's held-out split (training.cube.split.prepare)."""
    from training.cube.split import prepare as split

    return split(spec, source, out_dir, secret_seed)


def _embeddings(
    upload: Upload, width: int, *, min_rows: int = 1, taker: str = "the source model", tensor: str = "embeddings"
) -> int:
    """Refuse embeddings ``taker`` cannot take: [N ≥ min_rows, width] finite floats (a
    safetensors file's ``tensor``). The number of rows."""
    what = upload.name if tensor == "embeddings" else f"{upload.name} ({tensor})"
    try:
        shape, dtype = upload.shape(tensor)
    except ValueError as exc:
        raise DatasetProblem(f"{what}: {exc}.") from None
    if len(shape) != 2 or shape[0] < 1 or shape[1] != width:
        raise DatasetProblem(f"{what}: shape {shape}, but {taker} takes rows of teacher_dim {width}.")
    if shape[0] < min_rows:
        raise DatasetProblem(f"{what}: {shape[0]} rows; at least {min_rows} are needed (some are held out).")
    if dtype != "float":
        raise DatasetProblem(f"{what}: dtype {dtype} is not a float type.")
    _finite(upload, tensor)
    return int(shape[0])


def _finite(upload: Upload, tensor: str = "embeddings") -> None:
    """Refuse inputs holding a NaN or an infinity: every worker would fail on them (and lose
    reputation for the requester's data). One pass over the mapped file, a block at a time,
    remembered by the content hash (a refused file too)."""
    from training.cube.data import first_non_finite_row

    def row() -> int:
        found = first_non_finite_row(upload.array(tensor))
        return -1 if found is None else int(found)

    bad = upload.remember(f"dataset-finite-row:{upload.sha256}:{tensor}", row)
    if bad >= 0:
        what = upload.name if tensor == "embeddings" else f"{upload.name} ({tensor})"
        raise DatasetProblem(f"{what}: row {bad} holds NaN or infinite values.")


def check_training_dataset(spec: Spec, upload: Upload, source: Spec | None) -> None:
    """Refuse an upload the platform's held-out split would refuse after the task was funded
    (``training.cube.split.read_upload``): a shape other than [N, teacher_dim], too few rows
    to hold some out, non-float or non-finite values, or a dialogue-mode upload without
    targets of the same shape and kind."""
    from training.cube.split import MIN_ROWS

    width = int(spec.get("teacher_dim", default(CubeTrainingSpec, "teacher_dim")))
    rows = _embeddings(upload, width, min_rows=MIN_ROWS, taker="this spec")
    if spec.get("mode") != "dialogue":
        return
    if upload.format != "safetensors":
        raise DatasetProblem(
            f"{upload.name}: dialogue mode needs paired targets; upload one .safetensors file"
            " with 'embeddings' and 'targets' tensors."
        )
    targets = _embeddings(upload, width, min_rows=MIN_ROWS, taker="this spec", tensor="targets")
    if targets != rows:
        raise DatasetProblem(f"{upload.name}: {targets} target rows but {rows} embedding rows.")


def _data_dir(job: dict[str, Any], workdir: Path) -> Path:
    """The downloaded dataset where training.cube.data looks for it (``embeddings.<format>``)."""
    data_dir = workdir / "data"
    data_dir.mkdir(exist_ok=True)
    if job.get("dataset"):
        fmt = job["dataset"]["format"]
        (workdir / f"dataset.{fmt}").rename(data_dir / f"embeddings.{fmt}")
    return data_dir


# The held-out metrics a cube job reports as it trains (training.cube.run.evaluate's names).
CHARTED_VALIDATION = ("val_loss", "val_reconstruction", "val_similarity", "val_diversity", "val_cosine")


def train(job: dict[str, Any], workdir: Path, out_dir: Path, progress: Progress) -> dict[str, Any]:
    """Train with training.cube.run; claim val_loss."""
    import training.cube as cube

    validation: dict[str, float] = {}

    def report(event: dict[str, Any]) -> None:
        if event.get("event") == "epoch":
            # The latest held-out figures of the terms that say how good the model is ride
            # along with every later step (so each charts beside its training twin even when
            # the reporter coalesces the epoch event away); the shares and gates are
            # diagnostics of training alone, and with them a report would pass the node
            # socket's 32 metrics.
            val = numbers(event.get("val", {}))
            validation.update({key: val[key] for key in CHARTED_VALIDATION if key in val})
            return
        if event.get("event") != "step":
            return
        metrics = {**validation, "loss": float(event["loss"]), "lr": float(event["lr"])}
        metrics.update(numbers(event.get("metrics", {})))
        progress(int(event["step"]), int(event["total_steps"]), metrics)

    metrics = cube.run(
        job["spec"], _data_dir(job, workdir), out_dir, progress=report, trace_dir=plugin.trace_dir(workdir)
    )
    proof: dict[str, Any] = {
        "val_loss_micro": micro(metrics["val_loss"]),
        "steps": int(metrics["steps"]),
        "train_rows": int(metrics["train_rows"]),
        "micros": micro(metrics["seconds"]),
    }
    if isinstance(metrics.get("cosine"), int | float):
        proof["cosine_micro"] = micro(metrics["cosine"])
    return proof


def replay(spec: Spec, data: Path | None, segments: Any, *, device: str = "cpu") -> list[str]:
    """Re-execute challenged segments of a run's trace (training.cube.run.replay_segments)."""
    from training.cube.run import replay_segments

    return replay_segments(spec, data, segments, device=device)


def measure(spec: Spec, data: Path | None, segments: Any, *, device: str = "cpu") -> list[float | str]:
    """How far each segment's end lies from its re-execution (training.cube.run.measure_segments)."""
    from training.cube.run import measure_segments

    return measure_segments(spec, data, segments, device=device)


def canary(spec: Spec, data: Path | None, segment: Any, out: Path, *, device: str = "cpu") -> str:
    """A canary end for a segment (training.cube.run.canary_segment)."""
    from training.cube.run import canary_segment

    return canary_segment(spec, data, segment, out, device=device)


def plan(spec: Spec, data: Path | None) -> plugin.TrainingPlan:
    """What a run must start from and span (training.cube.run.training_plan)."""
    from training.cube.run import training_plan

    return training_plan(spec, data)


CUBE_TRAINING = plugin.training_kind(
    name="cube_training",
    label="Cube training",
    description="Train a 3D cellular neural network on teacher embeddings.",
    spec=CubeTrainingSpec,
    datasets=plugin.Datasets(EMBEDDINGS, _needs_dataset, check_training_dataset, prepare),
    model_files=MODEL_FILES,
    train=train,
    resources=_training_resources,
    flops=_training_flops,
    check_spec=check_training_spec,
    replay=replay,
    plan=plan,
    measure=measure,
    canary=canary,
)


def check_inference_dataset(spec: Spec, upload: Upload, source: Spec | None) -> None:
    """Refuse inputs the source model cannot embed (its teacher_dim)."""
    _embeddings(upload, int((source or {}).get("teacher_dim", default(CubeTrainingSpec, "teacher_dim"))))


def embed(
    job: dict[str, Any], workdir: Path, inputs: Path, model: Path, progress: Progress
) -> tuple[Path, dict[str, Any]]:
    """Embed the uploaded rows with the source task's model into outputs.npy."""
    import numpy as np

    import training.cube as cube
    from training.cube.data import load_array

    rows = load_array(inputs, "embeddings")
    t0 = time.monotonic()
    progress(0, 1, {})
    outputs = cube.infer(
        model, rows, batch_size=int(job["spec"].get("batch_size", default(CubeInferenceSpec, "batch_size")))
    )
    path = workdir / OUTPUTS
    np.save(path, outputs)
    progress(1, 1, {})
    return path, {"rows": int(outputs.shape[0]), "micros": micro(time.monotonic() - t0)}


CUBE_INFERENCE = plugin.inference_kind(
    name="cube_inference",
    label="Cube inference",
    description="Embed uploaded teacher embeddings with a trained cube model.",
    spec=CubeInferenceSpec,
    datasets=plugin.Datasets(EMBEDDINGS, check=check_inference_dataset),
    source=CUBE_TRAINING,
    inputs="input embeddings",
    predict=embed,
    output=OUTPUTS,
)
