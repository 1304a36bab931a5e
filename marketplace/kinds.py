"""The kind registry as the platform sees it: each kind of ``training.kinds`` with its spec
serializer, its price estimate and its verifier (platform side, in ``workers/``).

What a kind needs, costs, takes and hands back is its plug-in's (``training/<family>/kind.py``);
this module adds only what the platform alone knows, and names no kind but the ones the
platform checks beyond their dataclass (``SPEC_CHECKS``). The verifiers sit above, in
``workers.verification``, which registers each under its kind's name; the workers app hands
that registry over at ready() (``install_verifiers``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from rest_framework import serializers

from marketplace import specs
from training import kinds as plugins
from training.plugin import CheckDataset, Prepare, Resources, Spec

# fn(assignment, its uploaded artifacts by name) -> verdict: a kind's verifier
# (``workers.verification``), typed loosely here, below the app that defines both.
Verifier = Callable[[Any, dict[str, Path]], Any]

# The platform's own limits on a spec, beyond its dataclass's bounds: a serializer the
# derived one builds on, for the kinds that have any.
SPEC_CHECKS: dict[str, type[specs.SpecSerializer]] = {"synthetic": specs.SyntheticChecks}

# fn(a valid spec) -> what a result must meet to be paid, in sentences: the kind's quality
# bar as its verifier applies it (``workers.verification.base.states_bar``).
QualityBar = Callable[[dict[str, Any]], list[str]]

# The verifiers and quality bars by kind name, once the workers app installed them.
_verifiers: Mapping[str, Verifier] = {}
_bars: Mapping[str, QualityBar] = {}


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
    # The platform's held-out split (training.plugin.Prepare), run once per task before
    # scheduling (workers.assignments.heldout).
    prepare: Prepare | None
    features: Callable[[Spec], tuple[str, ...]]
    # fn(spec, a node's registered capabilities) -> the spec as that node runs it.
    node_spec: Callable[[Spec, Mapping[str, Any]], Spec]
    # fn(spec, upload, source spec | None): refuses a dataset (training.plugin.DatasetProblem).
    check_dataset: CheckDataset | None
    # fn(spec with defaults) -> {field: why}: the plug-in's rules between fields.
    check_spec: Callable[[Spec], dict[str, str]]
    verifier: Verifier | None
    quality_bar: QualityBar | None = None

    @classmethod
    def of(cls, plugin: plugins.Kind) -> Kind:
        """The platform's view of a plug-in: the plug-in's facts, the serializer of its spec
        dataclass (on the platform's own checks where it has any) and its verifier, where
        one is installed."""
        return cls(
            name=plugin.name,
            label=plugin.label,
            description=plugin.description,
            spec_serializer=specs.serializer_for(plugin.spec, SPEC_CHECKS.get(plugin.name)),
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
            node_spec=plugin.node_spec,
            check_spec=plugin.check_spec,
            verifier=_verifiers.get(plugin.name),
            quality_bar=_bars.get(plugin.name),
        )

    @property
    def available(self) -> bool:
        """Whether providers can run it yet (the platform has a verifier for it)."""
        return self.verifier is not None

    def validate_spec(self, data: Any) -> dict[str, Any]:
        """Return the spec with defaults filled in, or raise ValidationError."""
        serializer = self.spec_serializer(data=data if data is not None else {})
        serializer.is_valid(raise_exception=True)
        spec = dict(serializer.validated_data)
        problems = self.check_spec(spec)
        if problems:
            raise serializers.ValidationError({field: [why] for field, why in problems.items()})
        return spec

    def estimate_price(self, spec: dict[str, Any]) -> int:
        """Price estimate in base units, the platform's fee included: what a requester pays
        a node at the platform's reference ask (``marketplace.pricing``)."""
        from marketplace import pricing

        return pricing.charge(pricing.reference_ask().price(self.tflop(spec)))

    def tflop(self, spec: dict[str, Any]) -> float:
        """The kind's work measure of a spec: the TFLOPs it estimates, the unit asks price."""
        return self.flops(spec) / 1e12

    def json_schema(self) -> dict[str, Any]:
        """The spec as a JSON schema object (draft 2020-12 subset)."""
        return specs.json_schema(self.spec_serializer)


KINDS: dict[str, Kind] = {name: Kind.of(plugin) for name, plugin in plugins.KINDS.items()}


def install_verifiers(verifiers: Mapping[str, Verifier], bars: Mapping[str, QualityBar] | None = None) -> None:
    """Give each kind its verifier from ``verifiers`` (``workers.verification.VERIFIERS``,
    handed over by the workers app at ready(), and read again by ``Kind.of``) and its
    quality bar from ``bars`` (``workers.verification.STATED_BARS``); a kind without a verifier
    stays listed but is not offered. A verifier or bar of no known kind is a typo."""
    global _verifiers, _bars
    bars = bars or {}
    unknown = sorted(set(verifiers) - set(KINDS))
    if unknown:
        raise ImproperlyConfigured(f"Verifiers of unknown kinds: {', '.join(unknown)}.")
    unknown = sorted(set(bars) - set(KINDS))
    if unknown:
        raise ImproperlyConfigured(f"Quality bars of unknown kinds: {', '.join(unknown)}.")
    _verifiers, _bars = verifiers, bars
    for name, kind in KINDS.items():
        KINDS[name] = replace(kind, verifier=verifiers.get(name), quality_bar=bars.get(name))


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
