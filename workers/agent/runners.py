"""How the node runs a job: with its kind's plug-in from ``training.kinds``.

What each kind's runner commits to and proves is written beside it, in
``training/<family>/kind.py``; the shared types are ``training.plugin``'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from training import kinds
from training.plugin import Outcome, Progress, UnsupportedKind, sha256_file

__all__ = ["Outcome", "Progress", "UnsupportedKind", "run", "sha256_file"]


def run(job: dict[str, Any], workdir: Path, progress: Progress) -> Outcome:
    """Run one job with its kind's runner; UnsupportedKind when this node has none."""
    return kinds.run(job, workdir, progress)
