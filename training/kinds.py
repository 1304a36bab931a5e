"""Every kind of task, by name: one plug-in each (``training.plugin.Kind``), collected here.

The provider node runs a job with its kind's ``run``; the platform (``marketplace.kinds``)
adds pricing, validation and the verifier to each. Adding a kind is one ``kind.py`` in its
folder of ``training/``, listed below, and one module in ``workers/verification/`` whose
verifier registers itself under the kind's name; the platform names no kind.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from training.asl.kind import ASL_INFERENCE, ASL_TRAINING
from training.cube.kind import CUBE_INFERENCE, CUBE_TRAINING
from training.plugin import Kind, Outcome, Progress, UnsupportedKind
from training.poc.kind import SYNTHETIC

# Every kind, by name, in the order the platform lists them.
KINDS: dict[str, Kind] = {
    kind.name: kind for kind in (SYNTHETIC, CUBE_TRAINING, CUBE_INFERENCE, ASL_TRAINING, ASL_INFERENCE)
}


def get(name: str) -> Kind:
    """The kind called ``name``; UnsupportedKind when there is none."""
    kind = KINDS.get(name)
    if kind is None:
        raise UnsupportedKind(f"This agent cannot run {name} tasks yet.")
    return kind


def run(job: dict[str, Any], workdir: Path, progress: Progress) -> Outcome:
    """Run one job with its kind's runner."""
    return get(job["kind"]).run(job, workdir, progress)
