"""Run a kind's verifier on a submitted assignment, on the trusted platform queue.

One module per kind family (``synthetic``, ``cube``, ``asl``), each on the shared outline
in ``base``; ``marketplace.kinds`` names each kind's verifier by dotted path.
"""

from __future__ import annotations

from pathlib import Path

from django.core.files.storage import default_storage
from django.utils.module_loading import import_string

from marketplace.kinds import KINDS
from workers.assignments.jobs import artifact_path
from workers.models import Assignment
from workers.verification.base import PlatformFault, Verdict

__all__ = ["PlatformFault", "Verdict", "verify"]


def verify(assignment: Assignment) -> Verdict:
    """Judge a submitted result with its kind's verifier. Never runs worker code."""
    kind = KINDS[assignment.task.kind]
    if kind.verifier is None:
        return Verdict(False, f"No verifier for {kind.name}.")
    verifier = import_string(kind.verifier)
    artifacts = {name: Path(default_storage.path(artifact_path(assignment, name))) for name in kind.artifacts}
    result: Verdict = verifier(assignment, artifacts)
    return result
