"""The toy kind's verifier: the signed hash is the artifact's, and the sum is recomputed."""

from __future__ import annotations

from pathlib import Path

from tests.toykind.kind import ARTIFACT, total
from workers.models import Assignment
from workers.verification.base import Verdict, check_result_hash, read_small_json, verifies


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
