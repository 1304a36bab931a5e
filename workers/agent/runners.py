"""Which training/ function runs each kind on the node, and what it hands back.

A runner commits to its result by content hash: ``result_hash`` is the sha256 (hex) of
the artifact bytes the platform will verify (the product matrix's Merkle root for
synthetic, ``model.safetensors`` for cube and ASL training, ``outputs.npy`` for cube
inference, ``predictions.csv`` for ASL inference).
The proof is signed canonical JSON, so it carries integers only: losses in micro-units,
durations in microseconds.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Progress = Callable[[int, int, dict[str, float]], None]
# ``job["fetch"]``: the node's authenticated download, (server-relative url, destination) → None.
Fetch = Callable[[str, Path], None]

MICRO = 1_000_000
CUBE_MODEL_FILES = ("model.safetensors", "config.json")


@dataclass(frozen=True)
class Outcome:
    """A finished job: the committed result hash, a proof object, and artifact files."""

    result_hash: str
    proof: dict[str, Any]
    artifacts: dict[str, Path]


class UnsupportedKind(Exception):
    pass


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def micro(value: Any) -> int:
    """A float metric as signed-JSON-safe integer micro-units."""
    return round(float(value) * MICRO)


def run_synthetic(job: dict[str, Any], workdir: Path, progress: Progress) -> Outcome:
    from training.poc import runner as poc

    def report(event: dict[str, Any]) -> None:
        progress(int(event.get("step", 0)), int(event.get("total", 1)), {})

    out = poc.run(job["spec"], job["seed"], workdir, progress=report)
    return Outcome(
        result_hash=out["result_hash"],
        # Signed JSON carries integers only: MFLOP/s and microseconds.
        proof={"mflops": round(float(out["gflops"]) * 1000), "micros": round(float(out["seconds"]) * 1e6)},
        artifacts={"product.safetensors": workdir / out["artifact"]},
    )


def _cube_data_dir(job: dict[str, Any], workdir: Path) -> Path:
    """The downloaded dataset where training.cube.data looks for it (``embeddings.<format>``)."""
    data_dir = workdir / "data"
    data_dir.mkdir(exist_ok=True)
    if job.get("dataset"):
        fmt = job["dataset"]["format"]
        (workdir / f"dataset.{fmt}").rename(data_dir / f"embeddings.{fmt}")
    return data_dir


def run_cube_training(job: dict[str, Any], workdir: Path, progress: Progress) -> Outcome:
    """Train with training.cube.run; commit to sha256(model.safetensors), claim val_loss."""
    import training.cube as cube

    def report(event: dict[str, Any]) -> None:
        if event.get("event") != "step":
            return
        metrics = {"loss": float(event["loss"]), "lr": float(event["lr"])}
        metrics.update({k: float(v) for k, v in event.get("metrics", {}).items() if isinstance(v, int | float)})
        progress(int(event["step"]), int(event["total_steps"]), metrics)

    out_dir = workdir / "model"
    metrics = cube.run(job["spec"], _cube_data_dir(job, workdir), out_dir, progress=report)
    proof: dict[str, Any] = {
        "val_loss_micro": micro(metrics["val_loss"]),
        "steps": int(metrics["steps"]),
        "train_rows": int(metrics["train_rows"]),
        "micros": micro(metrics["seconds"]),
    }
    if isinstance(metrics.get("cosine"), int | float):
        proof["cosine_micro"] = micro(metrics["cosine"])
    return Outcome(
        result_hash=sha256_file(out_dir / "model.safetensors"),
        proof=proof,
        artifacts={name: out_dir / name for name in ("model.safetensors", "config.json", "metrics.json")},
    )


def run_cube_inference(job: dict[str, Any], workdir: Path, progress: Progress) -> Outcome:
    """Fetch the source task's model, embed the uploaded rows, commit to sha256(outputs.npy)."""
    import numpy as np

    import training.cube as cube
    from training.cube.data import load_array

    fetch: Fetch | None = job.get("fetch")
    if fetch is None:
        raise RuntimeError("cube_inference needs the node's authenticated download (job['fetch']).")
    if not job.get("dataset"):
        raise RuntimeError("cube_inference needs a dataset of input embeddings.")
    model_dir = workdir / "source-model"
    model_dir.mkdir()
    for name in CUBE_MODEL_FILES:
        fetch(f"/api/v1/assignments/{job['id']}/model/{name}/", model_dir / name)
    inputs = load_array(workdir / f"dataset.{job['dataset']['format']}", "embeddings")
    t0 = time.monotonic()
    progress(0, 1, {})
    outputs = cube.infer(model_dir, inputs, batch_size=int(job["spec"].get("batch_size", 64)))
    path = workdir / "outputs.npy"
    np.save(path, outputs)
    progress(1, 1, {})
    return Outcome(
        result_hash=sha256_file(path),
        proof={"rows": int(outputs.shape[0]), "micros": micro(time.monotonic() - t0)},
        artifacts={"outputs.npy": path},
    )


ASL_MODEL_FILES = ("model.safetensors", "config.json", "labels.json")


def _gpu_capabilities() -> dict[str, Any]:
    """What the ASL batch presets read: this node's GPU memory (none on CPU)."""
    import torch

    if not torch.cuda.is_available():
        return {}
    return {"gpu_memory_bytes": int(torch.cuda.get_device_properties(0).total_memory)}


def run_asl_training(job: dict[str, Any], workdir: Path, progress: Progress) -> Outcome:
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
        artifacts={name: out_dir / name for name in (*ASL_MODEL_FILES, "metrics.json")},
    )


def run_asl_inference(job: dict[str, Any], workdir: Path, progress: Progress) -> Outcome:
    """Fetch the source task's model, predict the top signs, commit to sha256(predictions.csv)."""
    from training.asl.infer import PREDICTIONS_FILE, predict

    fetch: Fetch | None = job.get("fetch")
    if fetch is None:
        raise RuntimeError("asl_inference needs the node's authenticated download (job['fetch']).")
    if not job.get("dataset"):
        raise RuntimeError("asl_inference needs a dataset of landmark sequences.")
    model_dir = workdir / "source-model"
    model_dir.mkdir()
    for name in ASL_MODEL_FILES:
        fetch(f"/api/v1/assignments/{job['id']}/model/{name}/", model_dir / name)
    t0 = time.monotonic()
    out_dir = workdir / "predictions"
    summary = predict(
        model_dir,
        workdir / f"dataset.{job['dataset']['format']}",
        out_dir,
        top_k=int(job["spec"].get("top_k", 5)),
        progress=lambda event: progress(int(event["done"]), max(int(event["total"]), 1), {}),
    )
    path = out_dir / PREDICTIONS_FILE
    return Outcome(
        result_hash=sha256_file(path),
        proof={"sequences": int(summary["sequences"]), "micros": micro(time.monotonic() - t0)},
        artifacts={PREDICTIONS_FILE: path},
    )


RUNNERS: dict[str, Callable[[dict[str, Any], Path, Progress], Outcome]] = {
    "synthetic": run_synthetic,
    "cube_training": run_cube_training,
    "cube_inference": run_cube_inference,
    "asl_training": run_asl_training,
    "asl_inference": run_asl_inference,
}


def run(job: dict[str, Any], workdir: Path, progress: Progress) -> Outcome:
    runner = RUNNERS.get(job["kind"])
    if runner is None:
        raise UnsupportedKind(f"This agent cannot run {job['kind']} tasks yet.")
    return runner(job, workdir, progress)
