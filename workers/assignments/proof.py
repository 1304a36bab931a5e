"""The platform's side of a trained kind's proof of training, up to its verification.

A kind whose plug-in hands back ``trace.json`` (``training.trace``) proves its training.
Its node uploads the model, its metrics and trace.json, then signs a ComputeResult whose
proof carries ``trace``: the Merkle root over the run's checkpoints, how often it took one
and how many there are. Only then does the platform pick the segments (checkpoint i → i + 1)
it will re-execute: HMAC under ``settings.TRACE_SECRET`` over that root, so the node learns
them after it is bound to the whole chain and could not have known them before. The result
answers with the checkpoints it must upload (both ends of each picked segment); each must
hash to its leaf of the uploaded trace.json. The assignment stays running meanwhile, so a
node that never answers expires at its deadline or heartbeat timeout as any running job
does; the upload of the last one moves it to submitted and asks for its verification
(``workers.assignments.jobs``), which re-executes the segments
(``workers.verification.base.training_claim``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.files.storage import default_storage
from rest_framework.exceptions import ValidationError

from marketplace.kinds import KINDS
from training.trace import (
    MAX_LEAVES,
    TRACE_FILE,
    TRACE_VERSION,
    Trace,
    TraceError,
    challenge,
    checkpoint_name,
    file_sha256,
    read_trace,
    segments_needed,
)
from workers.assignments import uploads
from workers.models import Assignment

log = logging.getLogger(__name__)

OLD_AGENT = "This node's agent does not prove its training; update it."
_HEX = frozenset("0123456789abcdef")


def proves_training(kind: str) -> bool:
    """Whether results of ``kind`` carry a proof of training (its plug-in hands back trace.json)."""
    return kind in KINDS and TRACE_FILE in KINDS[kind].artifacts


def commitment(proof: Any) -> dict[str, Any]:
    """The signed proof's ``trace`` commitment, checked for shape; ValidationError naming
    ``compute_result`` with the reason when it is missing or malformed."""
    raw = proof.get("trace") if isinstance(proof, dict) else None
    if raw is None:
        raise ValidationError({"compute_result": [f"{OLD_AGENT} (The signed proof has no trace commitment.)"]})
    problem = _commitment_problem(raw)
    if problem:
        raise ValidationError({"compute_result": [f"proof.trace {problem}"]})
    return dict(raw)


def _commitment_problem(raw: Any) -> str:
    if not isinstance(raw, dict) or set(raw) != {"version", "root", "every", "leaves"}:
        return "must be an object of exactly version, root, every and leaves."
    if raw["version"] != TRACE_VERSION or type(raw["version"]) is not int:
        return f"version must be {TRACE_VERSION}."
    root = raw["root"]
    if not isinstance(root, str) or len(root) != 64 or not set(root) <= _HEX:
        return "root must be 64 lower-case hex characters."
    if type(raw["every"]) is not int or raw["every"] < 1:
        return "every must be an integer ≥ 1."
    if type(raw["leaves"]) is not int or not 2 <= raw["leaves"] <= MAX_LEAVES:
        return f"leaves must be an integer from 2 to {MAX_LEAVES}."
    return ""


def signed_commitment(assignment: Assignment) -> dict[str, Any]:
    """The trace commitment of the assignment's stored, signed result (checked at submission)."""
    return dict(assignment.result["compute_result"]["proof"]["trace"])


def draw(commit: dict[str, Any]) -> list[int]:
    """The segments to re-execute for a commitment: as many as ``segments_needed`` asks for
    the platform's detection goal, picked by HMAC under the platform's secret over the root."""
    segments = int(commit["leaves"]) - 1
    count = segments_needed(segments, settings.TRACE_DETECT, settings.TRACE_BAD_FRACTION)
    return challenge(str(commit["root"]), settings.TRACE_SECRET, segments, count)


def checkpoint_names(segments: list[int]) -> list[str]:
    """The checkpoints a challenge asks for: both ends of each segment, in order."""
    return [checkpoint_name(i) for i in sorted({i + end for i in segments for end in (0, 1)})]


def answer(assignment: Assignment) -> dict[str, Any]:
    """What the node is told after its result: the picked segments and the checkpoint files to upload."""
    return {"segments": list(assignment.challenge), "checkpoints": checkpoint_names(list(assignment.challenge))}


def _stored(assignment: Assignment, name: str) -> Path:
    return Path(default_storage.path(f"{uploads.artifact_dir(assignment.pk)}/{name}"))


def committed_trace(assignment: Assignment) -> Trace:
    """The uploaded trace.json, checked against the signed commitment; TraceError says what
    does not hold, as the requester reads it."""
    path = _stored(assignment, TRACE_FILE)
    if not path.is_file():
        raise TraceError("trace.json was not uploaded.")
    trace = read_trace(path)
    commit = signed_commitment(assignment)
    if len(trace.leaves) != commit["leaves"] or trace.every != commit["every"]:
        raise TraceError(
            f"trace.json lists {len(trace.leaves)} checkpoints every {trace.every} steps; the signed proof says "
            f"{commit['leaves']} every {commit['every']}."
        )
    if trace.root != commit["root"]:
        raise TraceError("trace.json's Merkle root is not the one in the signed proof.")
    return trace


def check_challenged(name: str, signed: bool, segments: list[int]) -> None:
    """400 unless checkpoint ``name`` is one the assignment's challenge asks for."""
    if not signed:
        raise ValidationError(
            {"name": [f"{name}: checkpoints are uploaded only when the platform asks for them, after the result."]}
        )
    wanted = checkpoint_names(segments)
    if name not in wanted:
        raise ValidationError(
            {"name": [f"{name} was not challenged; the platform asks for {', '.join(wanted) or 'none'}."]}
        )


def check_checkpoint(assignment: Assignment, name: str) -> None:
    """The uploaded checkpoint ``name`` must hash to its leaf of the committed trace.json;
    otherwise it is deleted and refused (400 naming it), and the attempt is logged."""
    path = _stored(assignment, name)
    try:
        trace = committed_trace(assignment)
    except TraceError:
        # Its verification rejects a trace.json that does not match its root; nothing to compare with.
        return
    leaf = trace.leaves[int(name[5:10])]
    if file_sha256(path) != leaf.state_sha256:
        path.unlink(missing_ok=True)
        log.warning(
            "attack? assignment %s (worker %s) uploaded %s whose sha256 is not its committed leaf's",
            assignment.pk,
            assignment.worker_id,
            name,
        )
        raise ValidationError(
            {"file": [f"{name} does not hash to the state_sha256 its trace.json leaf commits to; refused."]}
        )


def missing_checkpoints(assignment: Assignment) -> list[str]:
    """The challenged checkpoints not uploaded yet."""
    return [n for n in checkpoint_names(list(assignment.challenge)) if not _stored(assignment, n).is_file()]
