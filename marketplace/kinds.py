"""The kind registry: everything the platform knows about each kind of task.

A kind is one entry here: its spec serializer, the resources it needs, its price
estimate, and the dotted paths of its runner (provider side, in ``training/``) and
verifier (platform side). Adding a kind touches this file and one module in
``training/``. A kind whose runner is not built yet is listed and accepts tasks, which
stay open until a runner exists.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from rest_framework import serializers

from marketplace import specs
from training.poc import spec as poc_spec

GIB = 1024**3


def memory(size: int) -> str:
    """A memory size as a requester reads it, rounded up (a need is never understated):
    GiB to one decimal, MiB below 1 GiB."""
    if size >= 2**30:
        return f"{-(-size * 10 // 2**30) / 10:.1f} GiB"
    return f"{-(-size // 2**20)} MiB"


@dataclass(frozen=True)
class Resources:
    """What a worker must offer to take a task."""

    memory_bytes: int
    gpu_preferred: bool = True

    def as_dict(self) -> dict[str, Any]:
        return {"memory_bytes": self.memory_bytes, "gpu_preferred": self.gpu_preferred}


@dataclass(frozen=True)
class Kind:
    """One kind of task."""

    name: str
    label: str
    description: str
    spec_serializer: type[specs.SpecSerializer]
    resources: Callable[[dict[str, Any]], Resources]
    flops: Callable[[dict[str, Any]], float]
    dataset_formats: tuple[str, ...] = ()
    dataset_required: Callable[[dict[str, Any]], bool] = lambda spec: False
    runner: str | None = None
    verifier: str | None = None
    artifacts: tuple[str, ...] = field(default_factory=tuple)
    # fn(spec, upload path | None, out_dir) -> (worker-facing file | None, held-out file):
    # run on the platform once per task before scheduling (workers.heldout); the worker
    # then gets only the first file and the verifier scores on the second.
    prepare: str | None = None
    # The artifacts that make up the trained model, served to inference tasks built on it.
    model_files: tuple[str, ...] = ()
    # Protocol features a worker must list in its capabilities to run this spec (for a
    # change a node cannot follow silently, such as how the synthetic matrices are drawn).
    features: Callable[[dict[str, Any]], tuple[str, ...]] = lambda spec: ()

    @property
    def available(self) -> bool:
        """Whether providers can run it yet (a runner and a verifier exist)."""
        return self.runner is not None and self.verifier is not None

    def validate_spec(self, data: Any) -> dict[str, Any]:
        """Return the spec with defaults filled in, or raise ValidationError."""
        serializer = self.spec_serializer(data=data if data is not None else {})
        serializer.is_valid(raise_exception=True)
        return dict(serializer.validated_data)

    def estimate_price(self, spec: dict[str, Any]) -> int:
        """Price estimate in base units: work in TFLOP at the configured rate, with a floor."""
        units = int(self.flops(spec) / 1e12 * settings.PRICE_PER_TFLOP_UNITS)
        return max(units, settings.MIN_TASK_PRICE_UNITS, minimum_reward())

    def json_schema(self) -> dict[str, Any]:
        """The spec as a JSON schema object (draft 2020-12 subset)."""
        return specs.json_schema(self.spec_serializer)


def minimum_reward() -> int:
    """The least a task may pay: after the platform's fee share, the worker's reward
    must still cover the gas of the SUBMIT_RESULT it signs (paid out of that reward) and
    of the TRANSFER that sweeps the rest to its provider's wallet (workers/sweep.py)."""
    from ledger import gas
    from protocol import encoding

    price = settings.LEDGER_GAS_PRICE
    fee = gas.fee_for(encoding.SUBMIT_RESULT, price) + gas.fee_for(encoding.TRANSFER, price)
    keep = 10_000 - settings.LEDGER_PLATFORM_FEE_BPS
    return -(-fee * 10_000 // keep) if keep > 0 else fee


def _synthetic_flops(spec: dict[str, Any]) -> float:
    return 2.0 * spec["n"] ** 3 * spec["count"]


def _synthetic_resources(spec: dict[str, Any]) -> Resources:
    # A, B and C in float32, plus headroom for the allocator.
    return Resources(memory_bytes=int(3 * spec["n"] ** 2 * 4 * 1.25), gpu_preferred=spec["n"] >= 2048)


def _cube_cells(spec: dict[str, Any]) -> int:
    return int(spec["lattice_edge"]) ** 3


def _cube_training_flops(spec: dict[str, Any]) -> float:
    # Per sample per step every cell mixes ~3 experts over ~64 neighbours of width state².
    per_sample = _cube_cells(spec) * spec["steps"] * 3 * 64 * spec["state_size"] ** 2 * 2
    samples = max(spec.get("synthetic_samples", 0), 1024)
    return 3.0 * per_sample * samples * spec["epochs"]


def _cube_training_resources(spec: dict[str, Any]) -> Resources:
    # Activations kept for backward: cells × state × steps × batch × bytes, ×8 for experts.
    activations = _cube_cells(spec) * spec["state_size"] * spec["steps"] * spec["batch_size"] * 4 * 8
    return Resources(memory_bytes=max(activations + 256 * 1024**2, GIB // 2))


def _asl_training_flops(spec: dict[str, Any]) -> float:
    dim = int(spec["dim"])
    per_frame = spec["blocks"] * (3 * 2 * 2 * dim * dim * 2 + 12 * dim * dim)
    return 3.0 * per_frame * spec["max_len"] * 20_000 * spec["epochs"]


def _asl_training_resources(spec: dict[str, Any]) -> Resources:
    dim = int(spec["dim"])
    activations = spec["batch_size"] * spec["max_len"] * dim * spec["blocks"] * 4 * 40
    return Resources(memory_bytes=max(activations + 512 * 1024**2, GIB))


def _synthetic_features(spec: dict[str, Any]) -> tuple[str, ...]:
    # An agent that draws A and B another way computes a product the verifier rejects.
    return (poc_spec.feature(spec.get("generator", poc_spec.UNNAMED_GENERATOR)),)


def _inference_flops(spec: dict[str, Any]) -> float:
    return 5e11


KINDS: dict[str, Kind] = {
    kind.name: kind
    for kind in [
        Kind(
            name="synthetic",
            label="Synthetic proof of compute",
            description="Exact integer matrix products, verified by Merkle openings and Freivalds' check.",
            spec_serializer=specs.SyntheticSpec,
            resources=_synthetic_resources,
            flops=_synthetic_flops,
            runner="training.poc.run",
            verifier="workers.verifiers.verify_synthetic",
            artifacts=("product.safetensors",),
            features=_synthetic_features,
        ),
        Kind(
            name="cube_training",
            label="Cube training",
            description="Train a 3D cellular neural network on teacher embeddings.",
            spec_serializer=specs.CubeTrainingSpec,
            resources=_cube_training_resources,
            flops=_cube_training_flops,
            dataset_formats=("npy", "safetensors"),
            dataset_required=lambda spec: spec["synthetic_samples"] == 0,
            runner="training.cube.run",
            verifier="workers.verify_cube.verify_cube_training",
            artifacts=("model.safetensors", "config.json", "metrics.json"),
            prepare="training.cube.split.prepare",
            model_files=("model.safetensors", "config.json"),
        ),
        Kind(
            name="cube_inference",
            label="Cube inference",
            description="Embed uploaded teacher embeddings with a trained cube model.",
            spec_serializer=specs.CubeInferenceSpec,
            resources=lambda spec: Resources(memory_bytes=GIB, gpu_preferred=False),
            flops=_inference_flops,
            dataset_formats=("npy", "safetensors"),
            dataset_required=lambda spec: True,
            runner="training.cube.infer",
            verifier="workers.verify_cube.verify_cube_inference",
            artifacts=("outputs.npy",),
        ),
        Kind(
            name="asl_training",
            label="ASL recognition training",
            description="Train an isolated sign recogniser on ISLR-format landmark sequences.",
            spec_serializer=specs.AslTrainingSpec,
            resources=_asl_training_resources,
            flops=_asl_training_flops,
            dataset_formats=("zip",),
            dataset_required=lambda spec: True,
            runner="training.asl.run.run",
            verifier="workers.verify_asl.verify_asl_training",
            artifacts=("model.safetensors", "config.json", "labels.json", "metrics.json"),
            prepare="training.asl.split.prepare",
            model_files=("model.safetensors", "config.json", "labels.json"),
        ),
        Kind(
            name="asl_inference",
            label="ASL recognition inference",
            description="Predict the top signs for uploaded landmark sequences with a trained model.",
            spec_serializer=specs.AslInferenceSpec,
            resources=lambda spec: Resources(memory_bytes=GIB, gpu_preferred=False),
            flops=_inference_flops,
            dataset_formats=("zip", "parquet"),
            dataset_required=lambda spec: True,
            runner="training.asl.infer.predict",
            verifier="workers.verify_asl.verify_asl_inference",
            artifacts=("predictions.csv",),
        ),
    ]
}

# The kinds as an API enum (TaskKindEnum in the OpenAPI schema).
KIND_NAMES = list(KINDS)


def get_kind(name: str) -> Kind:
    """The registered kind called ``name``, or a ValidationError naming the choices."""
    try:
        return KINDS[name]
    except (KeyError, TypeError):
        raise serializers.ValidationError(
            {"kind": [f"Unknown kind {name!r}; choose one of: {', '.join(KINDS)}."]}
        ) from None
