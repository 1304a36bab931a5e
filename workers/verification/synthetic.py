"""The synthetic kind's verifier: the Merkle root of C against result_hash, then
Freivalds' check (``training.poc.verifier``), and the node's speed as the platform timed it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from training.poc.spec import SyntheticSpec
from training.specs import default
from workers.models import Assignment
from workers.verification.base import PlatformFault, Verdict, states_bar, verifies

# Failure codes of ``training.poc.verifier.verify`` that describe the platform's own data.
PLATFORM_CODES = frozenset({"spec", "seed"})


@verifies("synthetic")
def verify_synthetic(assignment: Assignment, artifacts: dict[str, Path]) -> Verdict:
    """Synthetic: Merkle root of C against result_hash, then Freivalds' check."""
    from training.poc import verifier as poc

    compute_result = assignment.result["compute_result"]
    seed = {
        "block_hash": assignment.seed_block_hash,
        "worker_address": assignment.worker.address,
        "task_id": str(assignment.task_id),
    }
    outcome = poc.verify(assignment.task.spec, seed, artifacts["product.safetensors"], compute_result["result_hash"])
    if not outcome.ok and outcome.code in PLATFORM_CODES:
        # The task's stored spec or the assignment's seed material: the platform's records.
        raise PlatformFault(f"task {assignment.task_id}: {outcome.reason}")
    proof = compute_result.get("proof") or {}
    metrics: dict[str, Any] = {"verify_seconds": round(outcome.seconds, 4)}
    if isinstance(proof, dict) and type(proof.get("mflops")) is int and proof["mflops"] >= 0:
        metrics["reported_gflops"] = proof["mflops"] / 1000
    gflops = achieved_gflops(assignment)
    if gflops is not None:
        metrics["gflops"] = gflops
    return Verdict(outcome.ok, outcome.reason, metrics)


@states_bar("synthetic")
def synthetic_bar(spec: dict[str, Any]) -> list[str]:
    """What a synthetic result must meet, with the numbers ``verify_synthetic`` uses."""
    from training.poc.spec import parse_spec
    from training.poc.verifier import SECURITY_BITS, rounds_for

    rounds = rounds_for(parse_spec(spec))
    return [
        "Exact match: every product equal to A·B, integer for integer.",
        f"Checked with Freivalds' check in exact integers ({rounds} random vector{'s' if rounds != 1 else ''}):"
        f" a wrong product passes with probability at most 2^−{SECURITY_BITS}.",
        "The products' Merkle root must be the signed result hash.",
    ]


def achieved_gflops(assignment: Assignment) -> float | None:
    """The verified benchmark: the task's multiply-adds over the time from the offer to
    the result, both timestamps the platform's own. A lower bound of the node's speed
    (it includes generating, hashing and uploading) that no node can inflate, unlike the
    figure it reports (kept as ``reported_gflops``)."""
    spec = assignment.task.spec if isinstance(assignment.task.spec, dict) else {}
    n, count = spec.get("n"), spec.get("count", default(SyntheticSpec, "count"))
    if type(n) is not int or type(count) is not int or assignment.submitted_at is None:
        return None
    seconds = (assignment.submitted_at - assignment.created_at).total_seconds()
    if seconds <= 0:
        return None
    return round(2 * n**3 * count / seconds / 1e9, 3)
