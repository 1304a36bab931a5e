"""Run a kind's verifier on a submitted assignment, on the trusted platform queue.

The synthetic kind's verifier lives here; the trained kinds' in ``workers.verify_cube``
and ``workers.verify_asl``, on the helpers below. Nothing a worker uploaded is ever
imported or unpickled: safetensors, JSON, CSV and ``.npy`` without pickles only.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.files.storage import default_storage
from django.utils.module_loading import import_string

from marketplace.kinds import KINDS
from marketplace.models import Task
from workers.jobs import artifact_path
from workers.models import Assignment

MAX_CONFIG_BYTES = 1024 * 1024


class PlatformFault(Exception):
    """The platform cannot judge the result (its own data is missing or broken).

    Not the worker's fault, so never a rejection: the verification fails loudly and is
    asked for again later (``jobs.resend_stalled_verifications``).
    """


# Failure codes of ``training.poc.verifier.verify`` that describe the platform's own data.
PLATFORM_CODES = frozenset({"spec", "seed"})


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    # A rejection costs the worker reputation at once, except when its claim was true and
    # the model only fell short of the task's quality bar (min_accuracy, beating chance or
    # the untrained model): the requester's spec or data may make the bar unreachable for
    # an honest run (a learning rate of 1e-7, one epoch), and that is not the worker's
    # fault. Such a result costs less, and only once another provider's result on the
    # task meets the bar (settlement.SHORT_PENALTY); its provider is not offered the task
    # again. Not paid either way; the job goes to another worker.
    penalise: bool = True


def verify(assignment: Assignment) -> Verdict:
    """Judge a submitted result with its kind's verifier. Never runs worker code."""
    kind = KINDS[assignment.task.kind]
    if kind.verifier is None:
        return Verdict(False, f"No verifier for {kind.name}.")
    verifier = import_string(kind.verifier)
    artifacts = {name: Path(default_storage.path(artifact_path(assignment, name))) for name in kind.artifacts}
    return verifier(assignment, artifacts)


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


def achieved_gflops(assignment: Assignment) -> float | None:
    """The verified benchmark: the task's multiply-adds over the time from the offer to
    the result, both timestamps the platform's own. A lower bound of the node's speed
    (it includes generating, hashing and uploading) that no node can inflate, unlike the
    figure it reports (kept as ``reported_gflops``)."""
    spec = assignment.task.spec if isinstance(assignment.task.spec, dict) else {}
    n, count = spec.get("n"), spec.get("count", 1)
    if type(n) is not int or type(count) is not int or assignment.submitted_at is None:
        return None
    seconds = (assignment.submitted_at - assignment.created_at).total_seconds()
    if seconds <= 0:
        return None
    return round(2 * n**3 * count / seconds / 1e9, 3)


# --- Helpers of the trained kinds' verifiers ---------------------------------------------


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_result_hash(assignment: Assignment, path: Path) -> Verdict | None:
    """A rejection unless the signed result_hash is the sha256 of the uploaded artifact."""
    claimed = assignment.result["compute_result"]["result_hash"]
    if sha256_file(path) != claimed:
        return Verdict(False, f"result_hash is not the sha256 of the uploaded {path.name}.")
    return None


def proof_micro(assignment: Assignment, key: str) -> float | None:
    """A ``*_micro`` integer of the signed proof as a float, or None when absent or not an integer."""
    proof = assignment.result["compute_result"].get("proof")
    value = proof.get(key) if isinstance(proof, dict) else None
    return value / 1_000_000 if type(value) is int else None


def read_small_json(path: Path) -> Any:
    """A worker's JSON artifact, refused above MAX_CONFIG_BYTES; None when unreadable."""
    if path.stat().st_size > MAX_CONFIG_BYTES:
        return None
    try:
        return json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError):
        return None


def spot_check_seed(assignment: Assignment) -> int:
    """Which rows to recompute: keyed by a platform secret, so the worker cannot predict them."""
    message = f"{assignment.pk}:{assignment.result['compute_result']['result_hash']}".encode()
    return int.from_bytes(hmac.new(settings.SECRET_KEY.encode(), message, hashlib.sha256).digest()[:8], "big")


def source_model_dir(task: Task) -> Path | None:
    """The folder of the accepted model an inference task ran (its source task's artifacts)."""
    accepted = (
        Assignment.objects.filter(task_id=task.spec.get("source_task"), state=Assignment.State.ACCEPTED)
        .order_by("settled_at")
        .first()
    )
    if accepted is None:
        return None
    return Path(default_storage.path(artifact_path(accepted, "model.safetensors"))).parent


def copy_dataset(task: Task, folder: Path, stem: str = "inputs") -> Path:
    """The task's uploaded dataset copied to ``folder`` under a name with its format's suffix."""
    assert task.dataset is not None
    target = Path(folder) / f"{stem}.{task.dataset.format}"
    with task.dataset.file.open("rb") as upload, target.open("wb") as out:
        shutil.copyfileobj(upload, out, 1 << 20)
    return target
