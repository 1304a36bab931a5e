"""The kind registry as the platform sees it: each kind of ``training.kinds`` with its spec
serializer, its price estimate and its verifier (platform side, in ``workers/``).

What a kind needs, costs, takes and hands back is its plug-in's (``training/<family>/kind.py``);
this module adds only what the platform alone knows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from rest_framework import serializers

from marketplace import specs
from training import kinds as plugins
from training.plugin import CheckDataset, Resources, Spec


def memory(size: int) -> str:
    """A memory size as a requester reads it, rounded up (a need is never understated):
    GiB to one decimal, MiB below 1 GiB."""
    if size >= 2**30:
        return f"{-(-size * 10 // 2**30) / 10:.1f} GiB"
    return f"{-(-size // 2**20)} MiB"


@dataclass(frozen=True)
class Kind:
    """One kind of task."""

    name: str
    label: str
    description: str
    spec_serializer: type[specs.SpecSerializer]
    resources: Callable[[Spec], Resources]
    flops: Callable[[Spec], float]
    dataset_formats: tuple[str, ...]
    dataset_required: Callable[[Spec], bool]
    artifacts: tuple[str, ...]
    model_files: tuple[str, ...]
    source_kind: str | None
    # fn(spec, upload path | None, out_dir) -> (worker-facing file | None, held-out file):
    # run on the platform once per task before scheduling (workers.assignments.heldout); the worker
    # then gets only the first file and the verifier scores on the second.
    prepare: Callable[[Spec, Path | None, Path], tuple[Path | None, Path]] | None
    features: Callable[[Spec], tuple[str, ...]]
    # fn(spec, upload, source spec | None): refuses a dataset (training.plugin.DatasetProblem).
    check_dataset: CheckDataset | None
    verifier: str | None

    @classmethod
    def of(cls, plugin: plugins.Kind, spec_serializer: type[specs.SpecSerializer], verifier: str | None) -> Kind:
        """The platform's view of a plug-in: the plug-in's facts, a serializer and a verifier."""
        return cls(
            name=plugin.name,
            label=plugin.label,
            description=plugin.description,
            spec_serializer=spec_serializer,
            resources=plugin.resources,
            flops=plugin.flops,
            dataset_formats=plugin.dataset_formats,
            dataset_required=plugin.dataset_required,
            artifacts=plugin.artifacts,
            model_files=plugin.model_files,
            source_kind=plugin.source_kind,
            prepare=plugin.prepare,
            check_dataset=plugin.check_dataset,
            features=plugin.features,
            verifier=verifier,
        )

    @property
    def available(self) -> bool:
        """Whether providers can run it yet (the platform has a verifier for it)."""
        return self.verifier is not None

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
    of the TRANSFER that sweeps the rest to its provider's wallet (workers/assignments/sweep.py)."""
    from ledger import gas
    from protocol import encoding

    price = settings.LEDGER_GAS_PRICE
    fee = gas.fee_for(encoding.SUBMIT_RESULT, price) + gas.fee_for(encoding.TRANSFER, price)
    keep = 10_000 - settings.LEDGER_PLATFORM_FEE_BPS
    return -(-fee * 10_000 // keep) if keep > 0 else fee


# The platform's side of each kind: its verifier, and the platform's own checks on a spec
# (a serializer the dataclass's derived one builds on) where it has any.
_PLATFORM: dict[str, tuple[str, type[specs.SpecSerializer] | None]] = {
    "synthetic": ("workers.verification.synthetic.verify_synthetic", specs.SyntheticChecks),
    "cube_training": ("workers.verification.cube.verify_cube_training", None),
    "cube_inference": ("workers.verification.cube.verify_cube_inference", None),
    "asl_training": ("workers.verification.asl.verify_asl_training", None),
    "asl_inference": ("workers.verification.asl.verify_asl_inference", None),
}

KINDS: dict[str, Kind] = {
    name: Kind.of(plugin, specs.serializer_for(plugin.spec, _PLATFORM[name][1]), _PLATFORM[name][0])
    for name, plugin in plugins.KINDS.items()
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
