"""Entry points of the cube kinds: ``run`` trains (provider side), ``verify`` re-evaluates
(platform side), ``infer`` / ``verify_inference`` serve a trained model.

Spec field names and defaults are those of ``training.cube.spec`` (the platform validates;
this module only fills defaults).

Artifacts written by ``run`` into ``out_dir`` (Hugging Face layout): ``model.safetensors``,
``config.json`` (the model's constructor arguments and loss weights), ``README.md`` (model
card), ``metrics.json``; resumable checkpoints under ``out_dir/checkpoints``.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from training import stop
from training.artifacts import ArtifactError, export_hf, load_model_weights, read_json, weights_sha256, write_json
from training.cube.config import CubeConfig, CubeConfigError, check_capacity
from training.cube.data import CubeDataError, load_dataset, split_indices, synthetic_embeddings, validate_embeddings
from training.cube.graphed import CapturedCube, cuda_graphs_allowed
from training.cube.lattice import LatticeOutput
from training.cube.losses import total_loss, weights_from_spec
from training.cube.model import CubeModel, CubeOutput
from training.cube.spec import RETIRED_TRAINING_FIELDS, CubeInferenceSpec, CubeTrainingSpec
from training.device import pin_memory, select_device
from training.loop import FitResult, LoopConfig, fit
from training.plugin import TrainingPlan
from training.portable import portable_init
from training.replay import Trainer, canary_state, check_segments, plan_of, total_steps
from training.replay import measure_segments as measure
from training.specs import defaults
from training.trace import Segment, trace_every

Progress = Callable[[dict[str, Any]], None]

DEFAULT_TRAINING_SPEC: dict[str, Any] = defaults(CubeTrainingSpec)
DEFAULT_INFERENCE_SPEC: dict[str, Any] = defaults(CubeInferenceSpec)
VALIDATION_FRACTION = 0.1
VERIFY_RELATIVE_TOLERANCE = 0.2
VERIFY_ABSOLUTE_TOLERANCE = 1e-3


def training_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """``spec`` over the defaults, without the retired loss weights of older tasks; other
    unknown keys are refused, as the serializer does."""
    current = {k: v for k, v in spec.items() if k not in RETIRED_TRAINING_FIELDS}
    unknown = sorted(set(current) - set(DEFAULT_TRAINING_SPEC))
    if unknown:
        raise CubeConfigError(f"Unknown cube_training field(s): {', '.join(unknown)}.")
    return {**DEFAULT_TRAINING_SPEC, **current}


def _config(spec: Mapping[str, Any]) -> CubeConfig:
    return CubeConfig.from_dict(dict(spec))


def _loader(
    inputs: np.ndarray, targets: np.ndarray | None, batch_size: int, shuffle: bool, device: torch.device
) -> DataLoader:
    x = torch.from_numpy(inputs)
    y = torch.from_numpy(targets) if targets is not None else x
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=shuffle, pin_memory=pin_memory(device))


def _rows(array: np.ndarray | None, rows: np.ndarray) -> np.ndarray | None:
    return array[rows] if array is not None else None


def evaluate(model: CubeModel, loader: Iterable[Any], weights: Mapping[str, float]) -> dict[str, float]:
    """Mean loss terms over ``loader`` (weighted by batch size), as ``val_loss``, ``val_<term>``, ``val_cosine``."""
    device = next(model.parameters()).device
    sums: dict[str, float] = {}
    rows = 0
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss, metrics = total_loss(model(x), y, weights)
            n = x.shape[0]
            sums["val_loss"] = sums.get("val_loss", 0.0) + float(loss) * n
            for key, value in metrics.items():
                sums[f"val_{key}"] = sums.get(f"val_{key}", 0.0) + value * n
            rows += n
    model.train(was_training)
    return {k: v / max(1, rows) for k, v in sums.items()}


def constant_baseline(
    inputs: np.ndarray, targets: np.ndarray | None, weights: Mapping[str, float], batch_size: int
) -> float:
    """The held-out loss of the best prediction that ignores its input, the mean target row
    for every row, batched as ``evaluate`` batches: what a model whose output face never
    hears of the input face (a lattice skipped) can at best reach."""
    y = torch.from_numpy(targets if targets is not None else inputs).float()
    mean = y.mean(dim=0, keepdim=True)
    total, rows = 0.0, 0
    for start in range(0, y.shape[0], batch_size):
        batch = y[start : start + batch_size]
        prediction = mean.expand_as(batch)
        still = LatticeOutput(state=prediction[None], initial=prediction[None])
        loss, _ = total_loss(CubeOutput(prediction, still), batch, weights)
        total += float(loss) * batch.shape[0]
        rows += batch.shape[0]
    return total / max(1, rows)


def _training_rows(
    spec: Mapping[str, Any], config: CubeConfig, data: Path | None
) -> tuple[np.ndarray, np.ndarray | None]:
    """The worker's rows: from ``data`` (a folder ``training.cube.data`` reads, or the one
    file the platform sends, read as the node reads it), else synthetic stream 0 of the
    spec's seed."""
    dataset = None
    if data is not None and Path(data).is_file():
        with tempfile.TemporaryDirectory(prefix="cube-data-") as folder:
            (Path(folder) / f"embeddings{Path(data).suffix}").symlink_to(Path(data).resolve())
            dataset = load_dataset(Path(folder), config.teacher_dim, config.mode)
    elif data is not None:
        dataset = load_dataset(Path(data), config.teacher_dim, config.mode)
    if dataset is None:
        if spec["synthetic_samples"] <= 0:
            raise CubeDataError("No embeddings in the dataset and synthetic_samples is 0: upload embeddings.")
        dataset = synthetic_embeddings(spec["synthetic_samples"], config.teacher_dim, spec["seed"], config.mode)
    return dataset


def trainer(
    spec: Mapping[str, Any],
    data: Path | None,
    device: str | None = None,
    *,
    max_steps_per_epoch: int | None = None,
    validation: bool = False,
) -> Trainer:
    """The untrained model, loaders, step and loop settings a spec and the worker's data
    give: what ``run`` trains and what a replay of its trace re-executes. With
    ``validation`` the trainer also holds the validation loader and its evaluation."""
    spec = training_spec(spec)
    config = _config(spec)
    batch_size = int(spec["batch_size"])
    inputs, targets = _training_rows(spec, config, data)
    train_idx, val_idx = split_indices(inputs.shape[0], VALIDATION_FRACTION, spec["seed"])
    dev = select_device(device)
    torch.manual_seed(spec["seed"])
    model = portable_init(CubeModel(config), spec["seed"])  # the same bits on every machine
    model.set_batch_size(batch_size)
    weights = weights_from_spec(spec)
    train_loader = _loader(inputs[train_idx], _rows(targets, train_idx), batch_size, True, dev)

    # On CUDA the forward and backward passes replay as CUDA graphs (not under torch.compile,
    # which makes its own).
    captured = CapturedCube(model, enabled=dev.type == "cuda" and not spec["compile"] and cuda_graphs_allowed())

    def step_fn(m: torch.nn.Module, batch: Any) -> tuple[torch.Tensor, dict[str, float]]:
        x, y = batch
        return total_loss(captured(m, x), y, weights)

    loop_config = LoopConfig(
        epochs=spec["epochs"],
        lr=spec["learning_rate"],
        weight_decay=spec["weight_decay"],
        schedule="cosine",
        warmup_steps=spec["warmup_steps"],
        grad_clip=spec["grad_clip"],
        grad_accumulation=spec["grad_accumulation"],
        mixed_precision=spec["mixed_precision"],
        compile=spec["compile"],
        early_stopping_patience=spec["early_stopping_patience"],
        seed=spec["seed"],
        device=str(dev),
        max_steps_per_epoch=max_steps_per_epoch,
    )
    out = Trainer(model, train_loader, step_fn, loop_config)
    if validation:
        out.val_loader = _loader(inputs[val_idx], _rows(targets, val_idx), batch_size, False, dev)
        out.eval_fn = lambda m, loader: evaluate(model, loader, weights)
        out.extras = {"weights": weights, "train_rows": len(train_idx), "validation_rows": len(val_idx)}
    return out


def replay_segments(
    spec: Mapping[str, Any], data: Path | None, segments: Sequence[Segment], *, device: str = "cpu"
) -> list[str]:
    """``training.replay.check_segments`` for a cube_training run: "" or the reason, per segment."""
    return check_segments(lambda s, d, dev: trainer(s, d, dev), spec, data, segments, device=device)


def measure_segments(
    spec: Mapping[str, Any], data: Path | None, segments: Sequence[Segment], *, device: str = "cpu"
) -> list[float | str]:
    """``training.replay.measure_segments`` for a cube_training run: per segment, its distance or why not."""
    return measure(lambda s, d, dev: trainer(s, d, dev), spec, data, segments, device=device)


def canary_segment(
    spec: Mapping[str, Any], data: Path | None, segment: Segment, out: Path, *, device: str = "cpu"
) -> str:
    """``training.replay.canary_state`` for a cube_training run: write a canary end, return its weights' sha256."""
    return canary_state(lambda s, d, dev: trainer(s, d, dev), spec, data, segment, out, device=device)


def untrained_weights(spec: Mapping[str, Any], data: Path | None) -> str:
    """The sha256 of the weights a run of ``spec`` starts from (its checkpoint 0)."""
    return weights_sha256(trainer(spec, data, "cpu").model)


def validation_loss(spec: Mapping[str, Any], data: Path | None, model_dir: Path) -> float:
    """The loss of the model in ``model_dir`` on the validation rows a run of ``spec`` on the
    worker's ``data`` holds back (the figure the run reports as ``val_loss``), in fp32 on CPU.
    ArtifactError when the weights do not fit the spec's model."""
    built = trainer(spec, data, "cpu", validation=True)
    load_model_weights(built.model, model_dir)
    assert built.eval_fn is not None  # validation=True
    return float(built.eval_fn(built.model.eval(), built.val_loader)["val_loss"])


def training_plan(spec: Mapping[str, Any], data: Path | None) -> TrainingPlan:
    """What a run of ``spec`` on the worker's ``data`` starts from and how many steps it takes."""
    built = trainer(spec, data, "cpu")
    return plan_of(built)


def run(
    spec: Mapping[str, Any],
    data_dir: Path,
    out_dir: Path,
    progress: Progress | None = None,
    *,
    device: str | None = None,
    capacity_bytes: int | None = None,
    resume: bool = False,
    max_steps_per_epoch: int | None = None,
    trace_dir: Path | None = None,
) -> dict[str, Any]:
    """Train a cube model and write its artifacts into ``out_dir``; return the metrics.

    Data comes from ``data_dir`` (see ``training.cube.data``), or, when it holds none and
    ``synthetic_samples`` > 0, from the synthetic generator (stream 0). ``progress`` gets
    every step and epoch event of ``training.loop.fit``. With ``trace_dir`` the run writes
    its training trace there, a checkpoint every ``training.trace.trace_every(steps)``
    steps (the metrics' ``trace`` is its commitment). Raises CubeConfigError (bad spec,
    memory estimate above ``capacity_bytes``), CubeDataError (bad data) or
    training.loop.NonFiniteLossError.
    """
    spec = training_spec(spec)
    config = _config(spec)
    batch_size = int(spec["batch_size"])
    estimate = check_capacity(config, batch_size, capacity_bytes)
    built = trainer(spec, Path(data_dir), device, max_steps_per_epoch=max_steps_per_epoch, validation=True)
    model, weights = cast(CubeModel, built.model), built.extras["weights"]
    assert built.eval_fn is not None  # validation=True
    dev = select_device(built.config.device)
    initial = evaluate(model.to(dev), built.val_loader, weights)
    loop_config = built.config
    if trace_dir is not None:
        loop_config = replace(loop_config, trace_every=trace_every(total_steps(built)))
    out_dir = Path(out_dir)
    result: FitResult = fit(
        model,
        built.train_loader,
        built.val_loader,
        built.step_fn,
        built.eval_fn,
        loop_config,
        progress=progress,
        checkpoint_dir=out_dir / "checkpoints",
        resume=resume,
        trace_dir=trace_dir,
    )
    best = result.best_metrics
    params = sum(p.numel() for p in model.parameters())
    metrics: dict[str, Any] = {
        **best,
        "cosine": best.get("val_cosine"),
        "initial_val_loss": initial["val_loss"],
        "best_epoch": result.best_epoch,
        "epochs_run": result.epochs_run,
        "steps": result.global_step,
        "stopped_early": result.stopped_early,
        "parameters": params,
        "train_rows": built.extras["train_rows"],
        "validation_rows": built.extras["validation_rows"],
        "memory_estimate_bytes": estimate,
        "seconds": result.seconds,
        "device": str(dev),
        "history": result.history,
    }
    if result.trace is not None:
        metrics["trace"] = result.trace.commitment()
    model_config = {**config.to_dict(), "architecture": "CubeModel", "loss_weights": weights, "batch_size": batch_size}
    export_hf(
        out_dir,
        model.cpu(),
        model_config,
        title=f"Cube model {config.lattice_edge}³ ({config.mode})",
        description=(
            "A 3-D cellular neural network trained on teacher embeddings by Proofwork: the embedding is "
            f"mapped onto the input face of a {config.lattice_edge}³ lattice of {config.state_size}-wide cells, "
            f"updated for {config.steps} steps by a gated mixture of local, functional and distant experts, "
            "and read back from the opposite face."
        ),
        metrics={k: v for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)},
        tags=["proofwork", "cube", config.mode],
    )
    write_json(out_dir / "metrics.json", metrics)
    return metrics


def load_model(model_dir: Path) -> tuple[CubeModel, dict[str, Any]]:
    """Rebuild a model from ``config.json`` + ``model.safetensors``; ArtifactError when they do not fit."""
    raw = read_json(Path(model_dir) / "config.json")
    if not isinstance(raw, dict) or raw.get("architecture") != "CubeModel":
        raise ArtifactError("config.json does not describe a CubeModel.")
    try:
        config = CubeConfig.from_dict(raw)
    except (CubeConfigError, TypeError) as exc:
        raise ArtifactError(f"config.json: {exc}") from exc
    model = CubeModel(config)
    load_model_weights(model, Path(model_dir))
    model.eval()
    return model, raw


def verify(
    model_dir: Path,
    inputs: np.ndarray,
    targets: np.ndarray | None,
    reported: Mapping[str, Any],
    *,
    relative_tolerance: float = VERIFY_RELATIVE_TOLERANCE,
    absolute_tolerance: float = VERIFY_ABSOLUTE_TOLERANCE,
) -> dict[str, Any]:
    """Recompute the submitted model's validation loss on a held-out split the worker never saw.

    Accepted when ``|recomputed − reported val_loss| ≤ relative_tolerance·max(both) +
    absolute_tolerance``. Never raises for a bad submission: the reason is in the result.
    The loss weights and batch size are the ones recorded in the model's config.json.
    """
    try:
        model, raw = load_model(model_dir)
        reported_loss = float(reported["val_loss"])
    except (ArtifactError, KeyError, TypeError, ValueError) as exc:
        return {"accepted": False, "reason": str(exc)}
    if not math.isfinite(reported_loss):
        return {"accepted": False, "reason": "reported val_loss is not finite."}
    try:
        x = validate_embeddings(inputs, model.config.teacher_dim, "held-out inputs")
        y = validate_embeddings(targets, model.config.teacher_dim, "held-out targets") if targets is not None else None
    except CubeDataError as exc:
        return {"accepted": False, "reason": str(exc)}
    weights = {k: float(v) for k, v in raw.get("loss_weights", {}).items()}
    weights = {**weights_from_spec({}), **weights}
    batch_size = int(raw.get("batch_size", DEFAULT_TRAINING_SPEC["batch_size"]))
    recomputed = evaluate(model, _loader(x, y, batch_size, False, torch.device("cpu")), weights)
    loss = recomputed["val_loss"]
    allowed = relative_tolerance * max(abs(loss), abs(reported_loss)) + absolute_tolerance
    accepted = math.isfinite(loss) and abs(loss - reported_loss) <= allowed
    return {
        "accepted": accepted,
        "reason": "" if accepted else f"held-out val_loss {loss:.6g} differs from reported {reported_loss:.6g}",
        "recomputed": recomputed,
        "reported_val_loss": reported_loss,
        "tolerance": allowed,
    }


def heldout_synthetic(
    spec: Mapping[str, Any], secret_seed: bytes, samples: int = 256
) -> tuple[np.ndarray, np.ndarray | None]:
    """The platform's held-out rows for a synthetic run: the spec's structure, with samples
    drawn from the platform's ``secret_seed`` (no stream of the spec's seed reaches them)."""
    full = training_spec(spec)
    return synthetic_embeddings(samples, full["teacher_dim"], full["seed"], full["mode"], samples_seed=secret_seed)


def infer(model_dir: Path, inputs: np.ndarray, batch_size: int = 64) -> np.ndarray:
    """Output embeddings ``[N, teacher_dim]`` (float32) of a trained model, computed in fp32 on CPU."""
    model, _ = load_model(model_dir)
    # One row is enough: a task may embed a single vector, and the verifier recomputes as
    # few as one sampled row (verify_samples=1).
    x = torch.from_numpy(validate_embeddings(inputs, model.config.teacher_dim, "inputs", min_rows=1))
    outputs = []
    with torch.no_grad():
        for start in range(0, x.shape[0], batch_size):
            stop.check()
            outputs.append(model(x[start : start + batch_size]).prediction)
    return torch.cat(outputs).numpy()


# How far a submitted output row may be from the recomputed one, relative to the largest
# recomputed value (at least 1): float summation order differs between devices.
INFERENCE_TOLERANCE = 1e-4


def verify_inference(
    model_dir: Path,
    inputs: np.ndarray,
    outputs: np.ndarray,
    samples: int,
    seed: int,
    atol: float = INFERENCE_TOLERANCE,
) -> dict[str, Any]:
    """Recompute ``samples`` rows chosen by ``seed`` and compare them with the submitted outputs.

    Rows are recomputed one at a time, so the result does not depend on how the worker batched
    them (the model has no cross-row interaction at inference).
    """
    if not isinstance(outputs, np.ndarray) or outputs.shape != inputs.shape:
        got = list(outputs.shape) if isinstance(outputs, np.ndarray) else type(outputs).__name__
        return {"accepted": False, "reason": f"outputs have shape {got}, expected {list(inputs.shape)}"}
    rows = np.random.default_rng(seed).choice(inputs.shape[0], size=min(samples, inputs.shape[0]), replace=False)
    expected = infer(model_dir, inputs[np.sort(rows)], batch_size=1)
    error = float(np.max(np.abs(expected - outputs[np.sort(rows)])))
    accepted = bool(np.isfinite(error) and error <= atol * max(1.0, float(np.max(np.abs(expected)))))
    return {"accepted": accepted, "rows": np.sort(rows).tolist(), "max_abs_error": error}
