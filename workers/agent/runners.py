"""How the node runs a job: with its kind's plug-in from ``training.kinds``.

What each kind's runner commits to and proves is written beside it, in
``training/<family>/kind.py``; the shared types are ``training.plugin``'s.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from training import kinds
from training.plugin import Outcome, Progress, UnsupportedKind, sha256_file
from workers.agent.transfer import BoundIngest

__all__ = ["Outcome", "Progress", "UnsupportedKind", "ingest", "run", "sha256_file"]


def run(job: dict[str, Any], workdir: Path, progress: Progress) -> Outcome:
    """Run one job with its kind's runner; UnsupportedKind when this node has none."""
    return kinds.run(job, workdir, progress)


def ingest(job: dict[str, Any]) -> BoundIngest | None:
    """How the job's kind takes in a dataset in shards (``Kind.ingest``, bound to the job's
    spec); None when it has no such hook (or this node no such kind): every file is kept."""
    kind = kinds.KINDS.get(str(job.get("kind")))
    if kind is None or kind.ingest is None:
        return None
    return partial(kind.ingest, job.get("spec") or {})
