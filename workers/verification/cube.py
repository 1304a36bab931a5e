"""Verifiers of the cube kinds (platform side, on the trusted ``platform`` queue).

cube_training: the model's config must be the spec's (so the worker cannot swap in a
cheaper model or loss weights), the signed result_hash must be the sha256 of
model.safetensors, the training must be proven (``base.training_proof_problem``), the
reported ``val_loss_micro`` must be the model's loss on the worker's own validation rows
(recomputed from the same data and spec), and the loss on the held-out split no worker
received must be at least
``CUBE_MIN_LOSS_REDUCTION_PCT`` (20 %) below the untrained model's, and below that of
predicting the mean row for every input (what a model that skipped its lattice reaches). cube_inference: the
outputs' hash, every value finite, then k rows chosen with a platform secret recomputed
with the source task's verified model.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from django.conf import settings

from training.cube.spec import CubeInferenceSpec, CubeTrainingSpec
from training.specs import default
from workers.assignments import proof
from workers.models import Assignment
from workers.verification import base
from workers.verification.base import Verdict, copy_dataset, heldout_data, read_small_json

# A reported val_loss is the model's on the worker's validation rows, recomputed in fp32:
# only float summation order may differ (another device, another batch kernel).
CLAIM_RELATIVE_TOLERANCE = 1e-3

# The model fields that change what is computed (activation checkpointing does not).
MODEL_FIELDS = ("teacher_dim", "lattice_edge", "state_size", "steps", "gate", "top_k", "mode")


def expected_config(spec: dict[str, Any]) -> dict[str, Any]:
    """What config.json must say for a model trained on ``spec``."""
    from training.cube.config import CubeConfig
    from training.cube.losses import weights_from_spec
    from training.cube.run import training_spec

    full = training_spec(spec)
    config = CubeConfig.from_dict(full).to_dict()
    return {
        "architecture": "CubeModel",
        **{k: v for k, v in config.items() if k != "activation_checkpointing"},
        "loss_weights": weights_from_spec(full),
        "batch_size": int(full["batch_size"]),
    }


def config_problem(spec: dict[str, Any], path: Path) -> str:
    """Why the submitted config.json is not the spec's model ("" when it is)."""
    raw = read_small_json(path)
    if not isinstance(raw, dict):
        return "config.json is not a JSON object."
    wanted = expected_config(spec)
    wrong = sorted(k for k, v in wanted.items() if raw.get(k) != v)
    return f"config.json does not match the spec: {', '.join(wrong)}." if wrong else ""


def _untrained_loss(spec: dict[str, Any], inputs: np.ndarray, targets: np.ndarray | None) -> float:
    """The held-out loss of the spec's model at its seeded initialisation."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from training.cube.config import CubeConfig
    from training.cube.losses import weights_from_spec
    from training.cube.model import CubeModel
    from training.cube.run import evaluate, training_spec

    full = training_spec(spec)
    torch.manual_seed(full["seed"])
    model = CubeModel(CubeConfig.from_dict(full)).eval()
    x = torch.from_numpy(inputs)
    rows = TensorDataset(x, torch.from_numpy(targets) if targets is not None else x)
    loader = DataLoader(rows, batch_size=int(full["batch_size"]), shuffle=False)
    return float(evaluate(model, loader, weights_from_spec(full))["val_loss"])


@base.verifies("cube_training")
@base.training_claim("val_loss_micro")
def verify_cube_training(assignment: Assignment, model_dir: Path, reported: float) -> Verdict:
    """Recompute the submitted model's loss on the held-out split and compare it with the claim."""
    from training.artifacts import ArtifactError
    from training.cube.run import validation_loss, verify
    from training.cube.split import load_heldout

    task = assignment.task
    problem = config_problem(task.spec, model_dir / "config.json")
    if problem:
        return Verdict(False, problem)
    # The claim is the model's loss on the worker's own validation rows, which the platform
    # recomputes exactly from the same data and spec; the held-out rows then set the bar.
    try:
        with base.worker_data(task) as data:
            claimed = validation_loss(task.spec, data, model_dir)
    except ArtifactError as exc:
        return Verdict(False, str(exc))
    if not math.isclose(claimed, reported, rel_tol=CLAIM_RELATIVE_TOLERANCE, abs_tol=1e-6):
        return Verdict(
            False, f"val_loss on the worker's validation rows {claimed:.6g} differs from reported {reported:.6g}."
        )
    with heldout_data(task) as held_out:
        inputs, targets = load_heldout(held_out)
    outcome = verify(
        model_dir, inputs, targets, {"val_loss": reported}, relative_tolerance=0.0, absolute_tolerance=math.inf
    )
    if not outcome["accepted"]:
        return Verdict(False, str(outcome["reason"]))
    recomputed = float(outcome["recomputed"]["val_loss"])
    untrained = _untrained_loss(task.spec, inputs, targets)
    constant = _constant_loss(task.spec, inputs, targets)
    metrics = {
        "heldout_val_loss": round(recomputed, 6),
        "reported_val_loss": round(reported, 6),
        "untrained_val_loss": round(untrained, 6),
        "constant_val_loss": round(constant, 6),
        "heldout_rows": int(inputs.shape[0]),
        "required_loss_reduction_pct": required_loss_reduction(task.spec),
    }
    if isinstance(outcome["recomputed"].get("val_cosine"), float):
        metrics["heldout_cosine"] = round(outcome["recomputed"]["val_cosine"], 6)

    # The claim was true (checked above): a model that learned too little is not paid,
    # but its worker is not penalised (the spec may allow no more: see Verdict).
    checks = _checks(recomputed, untrained, constant, required_loss_reduction(task.spec))
    return base.quality_verdict(metrics, (c.words for c in checks if not c.met))


@base.verifies("cube_inference")
@base.spot_check(CubeInferenceSpec, "outputs.npy")
def verify_cube_inference(
    assignment: Assignment, path: Path, model: Callable[[], Path], samples: int, seed: int
) -> Verdict:
    """Recompute k secretly chosen rows of outputs.npy with the source task's model."""
    from training.cube.data import CubeDataError, first_non_finite_row, load_array
    from training.cube.run import verify_inference

    try:
        # Mapped, not read: only the header is parsed here, and only the sampled rows are
        # ever paged in, so a 2 GiB upload costs no memory before its shape is checked.
        outputs = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        return Verdict(False, f"outputs.npy is not a readable array ({exc}).")
    if outputs.dtype.kind != "f":
        return Verdict(False, f"outputs.npy has dtype {outputs.dtype}, not a float type.")
    model_dir = model()
    with tempfile.TemporaryDirectory(prefix="proofwork-verify-") as tmp:
        try:
            inputs = load_array(copy_dataset(assignment.task, Path(tmp)), "embeddings")
        except CubeDataError as exc:
            return Verdict(False, str(exc))
    if outputs.shape != inputs.shape:
        return Verdict(False, f"outputs.npy has shape {list(outputs.shape)}, expected {list(inputs.shape)}.")
    # The model maps finite rows to finite rows, so this is checked on every row, not only
    # on the sampled ones: a cheap pass over the mapped file, a block at a time.
    bad_row = first_non_finite_row(outputs)
    if bad_row is not None:
        return Verdict(False, f"outputs.npy holds NaN or infinite values (first in row {bad_row}).")
    outcome = verify_inference(model_dir, inputs, outputs, samples=samples, seed=seed)
    if not outcome["accepted"]:
        reason = outcome.get("reason") or f"recomputed rows differ (max abs error {outcome['max_abs_error']:.3g})."
        return Verdict(False, str(reason))
    return Verdict(True, "", {"rows_checked": len(outcome["rows"]), "max_abs_error": outcome["max_abs_error"]})


def _constant_loss(spec: dict[str, Any], inputs: np.ndarray, targets: np.ndarray | None) -> float:
    """The held-out loss of predicting the mean row whatever the input (training.cube.run)."""
    from training.cube.losses import weights_from_spec
    from training.cube.run import constant_baseline, training_spec

    full = training_spec(spec)
    return constant_baseline(inputs, targets, weights_from_spec(full), int(full["batch_size"]))


def required_loss_reduction(spec: dict[str, Any]) -> int:
    """The percent by which a trained model's held-out loss must undercut the untrained
    model's: the spec's ``min_loss_reduction``, or the platform's floor
    (``CUBE_MIN_LOSS_REDUCTION_PCT``) where that is higher. The requester may ask for more
    than the floor, never for less."""
    asked = int(spec.get("min_loss_reduction", default(CubeTrainingSpec, "min_loss_reduction")))
    return max(settings.CUBE_MIN_LOSS_REDUCTION_PCT, asked)


@base.states_bar("cube_training")
def cube_training_bar(spec: dict[str, Any]) -> list[str]:
    """What a cube_training result must meet, with the numbers ``verify_cube_training`` uses."""
    required = required_loss_reduction(spec)
    asked = int(spec.get("min_loss_reduction", default(CubeTrainingSpec, "min_loss_reduction")))
    whose = (
        "your min loss reduction"
        if asked >= settings.CUBE_MIN_LOSS_REDUCTION_PCT
        else f"the platform's minimum; your min loss reduction is {asked}%"
    )
    bar = [
        f"Held-out loss at least {required}% below the untrained model's ({whose}), on a split of your data"
        " that no worker sees.",
        "Held-out loss below that of predicting the mean row for every input.",
        f"Reported validation loss within {CLAIM_RELATIVE_TOLERANCE:.1%} of the platform's recomputation.",
    ]
    if proof.proves_training("cube_training"):
        bar.append("Training proven: random segments of the committed checkpoints are re-executed.")
    bar.append("The held-out cosine to the teacher is reported with the result; it is not a bar.")
    return bar


@base.states_bar("cube_inference")
def cube_inference_bar(spec: dict[str, Any]) -> list[str]:
    """What a cube_inference result must meet, with the numbers ``verify_cube_inference`` uses."""
    from training.cube.run import INFERENCE_TOLERANCE

    samples = base.verify_samples(CubeInferenceSpec, spec)
    return [
        "One output row per input row, every value finite.",
        f"{samples} row{'s' if samples != 1 else ''}, chosen with a platform secret, recomputed with the source"
        f" task's model: each value within {INFERENCE_TOLERANCE:g} × the largest recomputed value (at least 1).",
    ]


def _checks(recomputed: float, untrained: float, constant: float, required: int) -> list[base.Check]:
    """The bars a true claim of held-out loss ``recomputed`` must meet: beating the untrained
    model's ``untrained`` by ``required`` percent, and beating ``constant``, a prediction
    that ignores the input (as a model trained without its lattice steps does: its output
    face never hears of the input)."""
    removed = 1 - recomputed / untrained if untrained > 0 else 0.0
    beats_untrained = recomputed < untrained
    removes_enough = not (untrained > 0 and recomputed > untrained * (1 - required / 100))
    beats_constant = recomputed < constant
    return [
        base.Check(
            "held-out val_loss against the untrained model",
            f"{recomputed:.6g}",
            f"below {untrained:.6g}",
            beats_untrained,
            f"held-out val_loss {recomputed:.6g} is below the untrained model's ({untrained:.6g})."
            if beats_untrained
            else f"held-out val_loss {recomputed:.6g} is no better than untrained ({untrained:.6g}).",
        ),
        base.Check(
            "share of the untrained model's loss removed by training",
            f"{removed:.0%}",
            f"at least {required}%",
            removes_enough,
            f"held-out val_loss {recomputed:.6g} is {removed:.0%} below the untrained model's"
            f" ({untrained:.6g}); training had to remove at least {required}%."
            if removes_enough
            else f"held-out val_loss {recomputed:.6g} is only {removed:.0%} below the untrained model's"
            f" ({untrained:.6g}); training must remove at least {required}%.",
        ),
        base.Check(
            "held-out val_loss against predicting the mean row",
            f"{recomputed:.6g}",
            f"below {constant:.6g}",
            beats_constant,
            f"held-out val_loss {recomputed:.6g} is below predicting the mean row for every input"
            f" ({constant:.6g}): the output depends on the input."
            if beats_constant
            else f"held-out val_loss {recomputed:.6g} is no better than predicting the mean row for every"
            f" input ({constant:.6g}): the output does not depend on the input.",
        ),
    ]


@base.bars("cube_training")
def cube_training_bars(metrics: dict[str, Any]) -> list[base.Check]:
    """The bars of a cube_training verdict, from the numbers it recorded."""
    return _checks(
        float(metrics["heldout_val_loss"]),
        float(metrics["untrained_val_loss"]),
        float(metrics["constant_val_loss"]),
        int(metrics["required_loss_reduction_pct"]),
    )
