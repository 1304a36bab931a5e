"""The toy kind's verifier: the signed hash is the artifact's, and the sum is recomputed."""

from __future__ import annotations

from pathlib import Path

from tests.toykind.kind import ARTIFACT, total
from workers.models import Assignment
from workers.verification.base import (
    Verdict,
    check_result_hash,
    quality_verdict,
    read_small_json,
    training_claim,
    verifies,
)


@verifies("toy_sum")
def verify_toy(assignment: Assignment, artifacts: dict[str, Path]) -> Verdict:
    """Accept only the exact sum of the task's spec."""
    path = artifacts[ARTIFACT]
    rejected = check_result_hash(assignment, path)
    if rejected:
        return rejected
    claimed = read_small_json(path)
    expected = total(assignment.task.spec)
    if not isinstance(claimed, dict) or claimed.get("total") != expected:
        return Verdict(False, f"{ARTIFACT} does not hold the sum {expected}.")
    return Verdict(True, "", {"total": expected})


@verifies("toy_fit")
@training_claim("loss_micro")
def verify_toy_fit(assignment: Assignment, model_dir: Path, reported: float) -> Verdict:
    """The fitted number must be within 1 % of the target (after the proof of training holds)."""
    from safetensors.numpy import load_file

    x = float(load_file(str(model_dir / "model.safetensors"))["x"][0])
    target = int(assignment.task.spec["target"])
    return quality_verdict(
        {"x": x}, [f"x is {x:.6g}, not within 1 % of {target}."] if abs(x - target) > target / 100 else []
    )
