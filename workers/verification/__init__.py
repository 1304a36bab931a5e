"""Run a kind's verifier on a submitted assignment, on the trusted platform queue.

One module per kind family (``synthetic``, ``cube``, ``asl``), each on the shared outline
in ``base``, registers the verifier of each of its kinds with ``@verifies("<kind>")``.
``load`` imports every module of this package, so a new family's module needs no other
line; the workers app hands the registry to ``marketplace.kinds`` at ready().
"""

from __future__ import annotations

import pkgutil
from importlib import import_module
from pathlib import Path

from django.core.files.storage import default_storage

from marketplace.kinds import KINDS
from workers.assignments.jobs import artifact_path
from workers.models import Assignment
from workers.verification.base import STATED_BARS, VERIFIERS, PlatformFault, Verdict, Verifier, verifies

__all__ = ["STATED_BARS", "VERIFIERS", "PlatformFault", "Verdict", "Verifier", "load", "verifies", "verify"]


def load() -> dict[str, Verifier]:
    """Every verifier, by kind name: the registry once each module of this package is
    imported (which also fills ``STATED_BARS``, the kinds' quality bars)."""
    for module in pkgutil.iter_modules(__path__):
        import_module(f"{__name__}.{module.name}")
    return VERIFIERS


def verify(assignment: Assignment) -> Verdict:
    """Judge a submitted result with its kind's verifier. Never runs worker code."""
    kind = KINDS[assignment.task.kind]
    if kind.verifier is None:
        return Verdict(False, f"No verifier for {kind.name}.")
    artifacts = {name: Path(default_storage.path(artifact_path(assignment, name))) for name in kind.artifacts}
    result: Verdict = kind.verifier(assignment, artifacts)
    return result
