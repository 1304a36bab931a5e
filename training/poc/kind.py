"""The synthetic kind: exact integer matrix products, the proof of compute."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from training.plugin import Kind, Outcome, Progress, Resources, Spec
from training.poc.spec import UNNAMED_GENERATOR, SyntheticSpec, feature


def _flops(spec: Spec) -> float:
    return 2.0 * spec["n"] ** 3 * spec["count"]


def _resources(spec: Spec) -> Resources:
    # A, B and C in float32, plus headroom for the allocator.
    return Resources(memory_bytes=int(3 * spec["n"] ** 2 * 4 * 1.25), gpu_preferred=spec["n"] >= 2048)


def _features(spec: Spec) -> tuple[str, ...]:
    # An agent that draws A and B another way computes a product the verifier rejects.
    return (feature(spec.get("generator", UNNAMED_GENERATOR)),)


def run(job: dict[str, Any], workdir: Path, progress: Progress) -> Outcome:
    """Multiply the seeded matrices; commit to the product's Merkle root."""
    from training.poc import runner as poc

    def report(event: dict[str, Any]) -> None:
        progress(int(event.get("step", 0)), int(event.get("total", 1)), {})

    out = poc.run(job["spec"], job["seed"], workdir, progress=report)
    return Outcome(
        result_hash=out["result_hash"],
        # Signed JSON carries integers only: MFLOP/s and microseconds.
        proof={"mflops": round(float(out["gflops"]) * 1000), "micros": round(float(out["seconds"]) * 1e6)},
        artifacts={"product.safetensors": workdir / out["artifact"]},
    )


SYNTHETIC = Kind(
    name="synthetic",
    label="Synthetic proof of compute",
    description="Exact integer matrix products, verified by Merkle openings and Freivalds' check.",
    spec=SyntheticSpec,
    resources=_resources,
    flops=_flops,
    run=run,
    artifacts=("product.safetensors",),
    features=_features,
)
