"""The toy kind's plug-in: sum the first ``count`` integers, each raised to ``power``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.plugin import Kind, Outcome, Progress, Resources, Spec, sha256_file
from training.specs import param

ARTIFACT = "sum.json"


@dataclass(frozen=True)
class ToySpec:
    """Sum 1..count, each raised to power."""

    count: int = param(100, "How many integers to sum.", lo=1, hi=10_000)
    power: int = param(1, "The power each integer is raised to.", lo=1, hi=4)


def total(spec: Spec) -> int:
    """The exact answer of a toy spec."""
    return sum(i ** int(spec["power"]) for i in range(1, int(spec["count"]) + 1))


def run(job: dict[str, Any], workdir: Path, progress: Progress) -> Outcome:
    """Compute the sum; commit to sha256(sum.json)."""
    progress(0, 1, {})
    path = workdir / ARTIFACT
    path.write_text(json.dumps({"total": total(job["spec"])}))
    progress(1, 1, {})
    return Outcome(
        result_hash=sha256_file(path), proof={"count": int(job["spec"]["count"])}, artifacts={ARTIFACT: path}
    )


def _resources(spec: Spec) -> Resources:
    return Resources(memory_bytes=1 << 20, gpu_preferred=False)


def _flops(spec: Spec) -> float:
    return float(spec["count"] * spec["power"])


TOY = Kind(
    name="toy_sum",
    label="Toy sum",
    description="Sum the first count integers raised to a power.",
    spec=ToySpec,
    resources=_resources,
    flops=_flops,
    run=run,
    artifacts=(ARTIFACT,),
)
