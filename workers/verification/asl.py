"""Verifiers of the ASL kinds (platform side, on the trusted ``platform`` queue).

asl_training: the model's config must be the spec's over the dataset's signs and its
labels the dataset's, the signed result_hash must be the sha256 of model.safetensors, and
the top-1 accuracy recomputed on the held-out participants no worker received must match
the reported ``val_top1_micro`` (``training.asl.run.accepts``: three binomial standard
errors), reach the spec's ``min_accuracy`` and beat guessing (``chance_floor``: a score guessing
reaches at most once in 100, so an untrained model honestly reported is not paid).
asl_inference: the predictions' hash, every row's width and sequence id, then
k sequences chosen with a platform secret recomputed with the source task's model.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from training.asl.spec import AslInferenceSpec, AslTrainingSpec
from training.specs import default
from workers.assignments import proof
from workers.models import Assignment
from workers.verification import base
from workers.verification.base import Verdict, copy_dataset, heldout_data, read_small_json


def expected_config(spec: dict[str, Any], num_classes: int) -> dict[str, Any]:
    """What config.json must say for a model trained on ``spec`` over ``num_classes`` signs."""
    from training.asl.run import model_config
    from training.asl.spec import TrainSpec

    config = model_config(TrainSpec.from_dict(dict(spec)), num_classes)
    result: dict[str, Any] = json.loads(json.dumps(config.to_dict()))
    return result


def model_problem(spec: dict[str, Any], signs: list[str], model_dir: Path) -> str:
    """Why the submitted config.json / labels.json are not the spec's model ("" when they are)."""
    raw = read_small_json(model_dir / "config.json")
    if not isinstance(raw, dict):
        return "config.json is not a JSON object."
    wanted = expected_config(spec, len(signs))
    wrong = sorted(k for k in set(wanted) | set(raw) if raw.get(k) != wanted.get(k))
    if wrong:
        return f"config.json does not match the spec: {', '.join(wrong)}."
    labels = read_small_json(model_dir / "labels.json")
    if not isinstance(labels, dict) or labels.get("signs") != signs:
        return "labels.json does not list the dataset's signs in its order."
    return ""


@base.verifies("asl_training")
@base.training_claim("val_top1_micro")
def verify_asl_training(assignment: Assignment, model_dir: Path, reported: float) -> Verdict:
    """Recompute held-out top-1 accuracy and compare it with the claim and the required minimum."""
    from training.asl.run import accepts, verify
    from training.asl.split import dataset_signs

    task = assignment.task
    with heldout_data(task) as held_out:
        signs = dataset_signs(held_out)
        problem = model_problem(task.spec, signs, model_dir)
        if problem:
            return Verdict(False, problem)
        with tempfile.TemporaryDirectory(prefix="proofwork-verify-") as cache:
            outcome = verify(model_dir, held_out, cache_dir=Path(cache))
    top1, count = float(outcome["top1"]), int(outcome["count"])
    minimum = required_accuracy(task.spec)
    metrics = {
        "heldout_top1": round(top1, 6),
        "heldout_top5": round(float(outcome["top5"]), 6),
        "reported_top1": round(reported, 6),
        "heldout_sequences": count,
        "min_accuracy": minimum,
        "signs": len(signs),
    }
    if not accepts(reported, top1, count):
        return Verdict(False, f"held-out top-1 accuracy {top1:.4f} differs from reported {reported:.4f}.", metrics)

    checks = _checks(top1, minimum, len(signs), count)
    return base.quality_verdict(metrics, (c.words for c in checks if not c.met))


@base.verifies("asl_inference")
@base.spot_check(AslInferenceSpec, "predictions.csv")
def verify_asl_inference(
    assignment: Assignment, path: Path, model: Callable[[], Path], samples: int, seed: int
) -> Verdict:
    """Recompute k secretly chosen rows of predictions.csv with the source task's model."""
    from training.asl.infer import PredictionsError, read_header, verify_predictions

    model_dir = model()
    labels = read_small_json(model_dir / "labels.json")  # verified with the source task
    signs = labels["signs"] if isinstance(labels, dict) else []
    try:
        # The header only: the rest is streamed, within bounds, by verify_predictions.
        header = read_header(path, len(signs))
    except PredictionsError as exc:
        return Verdict(False, str(exc))
    top_k = min(int(assignment.task.spec.get("top_k", default(AslInferenceSpec, "top_k"))), len(signs))
    if len(header) != 2 + 2 * top_k:
        return Verdict(False, f"predictions.csv must report the top {top_k} signs per sequence.")
    with tempfile.TemporaryDirectory(prefix="proofwork-verify-") as tmp:
        # Under the agent's own name for its download: the path column of a single
        # .parquet sequence is that file's name (training.asl.infer), dataset.parquet.
        inputs = copy_dataset(assignment.task, Path(tmp), stem="dataset")
        outcome = verify_predictions(model_dir, inputs, path, samples=samples, seed=seed)
    if not outcome["ok"]:
        problem = outcome.get("problem") or (
            f"{len(outcome['mismatched'])} of {outcome['checked']} recomputed sequences differ "
            f"(first: {outcome['mismatched'][0]})."
        )
        return Verdict(False, str(problem))
    return Verdict(True, "", {"sequences_checked": int(outcome["checked"])})


def required_accuracy(spec: dict[str, Any]) -> float:
    """The held-out top-1 accuracy the spec asks for (``min_accuracy``)."""
    return float(spec.get("min_accuracy", default(AslTrainingSpec, "min_accuracy")))


@base.states_bar("asl_training")
def asl_training_bar(spec: dict[str, Any]) -> list[str]:
    """What an asl_training result must meet, with the numbers ``verify_asl_training`` uses."""
    from training.asl.run import CHANCE_ALPHA, CLAIM_STANDARD_ERRORS

    minimum = required_accuracy(spec)
    bar = [
        f"Held-out top-1 accuracy at least {minimum:.1%} (your min accuracy), on participants no worker sees."
        if minimum > 0
        else "No minimum accuracy: set min accuracy to ask for one.",
        "Better than guessing: at least the accuracy that guessing among your dataset's signs reaches only"
        f" once in {round(1 / CHANCE_ALPHA)} tries on the held-out sequences.",
        f"Reported accuracy within {CLAIM_STANDARD_ERRORS:g} standard errors of the platform's recomputation.",
    ]
    if proof.proves_training("asl_training"):
        bar.append("Training proven: random segments of the committed checkpoints are re-executed.")
    return bar


@base.states_bar("asl_inference")
def asl_inference_bar(spec: dict[str, Any]) -> list[str]:
    """What an asl_inference result must meet, with the numbers ``verify_asl_inference`` uses."""
    from training.asl.infer import SCORE_TOLERANCE

    samples = base.verify_samples(AslInferenceSpec, spec)
    top_k = int(spec.get("top_k", default(AslInferenceSpec, "top_k")))
    return [
        f"One row per input sequence, naming its top {top_k} signs.",
        f"{samples} sequence{'s' if samples != 1 else ''}, chosen with a platform secret, recomputed with the"
        f" source task's model: the same signs in the same order, each score within {SCORE_TOLERANCE:g}.",
    ]


def _checks(top1: float, minimum: float, signs: int, count: int) -> list[base.Check]:
    """The bars a true claim of held-out accuracy ``top1`` must meet: the spec's
    ``minimum``, and beating guessing among ``signs`` signs on ``count`` sequences (an
    untrained model, honestly reported, guesses: it is not paid for, whatever the minimum)."""
    from training.asl.run import chance_floor

    floor = chance_floor(signs, count)
    meets_minimum = top1 >= minimum
    beats_chance = top1 >= floor - 1e-9
    return [
        base.Check(
            "held-out top-1 accuracy",
            f"{top1:.4f}",
            f"at least {minimum:.4f} (the spec's min_accuracy)",
            meets_minimum,
            f"held-out top-1 accuracy {top1:.4f} meets the required {minimum:.4f}."
            if meets_minimum
            else f"held-out top-1 accuracy {top1:.4f} is below the required {minimum:.4f}.",
        ),
        base.Check(
            "held-out top-1 accuracy against guessing",
            f"{top1:.4f}",
            f"at least {floor:.4f} ({signs} signs, {count} sequences)",
            beats_chance,
            f"held-out top-1 accuracy {top1:.4f} beats guessing among {signs} signs on {count} sequences ({floor:.4f})."
            if beats_chance
            else f"held-out top-1 accuracy {top1:.4f} is no better than guessing among {signs} signs"
            f" on {count} sequences: at least {floor:.4f} is needed.",
        ),
    ]


@base.bars("asl_training")
def asl_training_bars(metrics: dict[str, Any]) -> list[base.Check]:
    """The bars of an asl_training verdict, from the numbers it recorded."""
    return _checks(
        float(metrics["heldout_top1"]),
        float(metrics["min_accuracy"]),
        int(metrics["signs"]),
        int(metrics["heldout_sequences"]),
    )
