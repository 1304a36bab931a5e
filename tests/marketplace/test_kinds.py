"""The kind registry and /api/v1/kinds/: every kind listed with a JSON schema that says
exactly what its spec serializer enforces."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework import serializers
from rest_framework.test import APIClient

from ledger.units import format_credits
from marketplace.kinds import KINDS, get_kind
from marketplace.pricing import charge, largest_price_under, minimum_reward

pytestmark = pytest.mark.django_db

FIVE = ["synthetic", "cube_training", "cube_inference", "asl_training", "asl_inference"]


def test_the_five_kinds_are_listed_anonymously(anon_client: APIClient) -> None:
    response = anon_client.get("/api/v1/kinds/")
    assert response.status_code == 200
    kinds = response.json()
    assert [k["name"] for k in kinds] == FIVE
    for kind in kinds:
        assert set(kind) == {
            "name",
            "label",
            "description",
            "available",
            "dataset_formats",
            "artifacts",
            "default_price_estimate",
            "spec_schema",
        }
        assert kind["spec_schema"]["type"] == "object"
        assert kind["spec_schema"]["additionalProperties"] is False


@pytest.mark.parametrize("name", FIVE)
def test_kind_detail_schema_matches_the_serializer(anon_client: APIClient, name: str) -> None:
    response = anon_client.get(f"/api/v1/kinds/{name}/")
    assert response.status_code == 200
    schema = response.json()["spec_schema"]
    fields = KINDS[name].spec_serializer().fields
    assert set(schema["properties"]) == set(fields)
    assert schema["required"] == [key for key, f in fields.items() if f.required]
    for key, field in fields.items():
        prop = schema["properties"][key]
        assert prop["description"], f"{name}.{key} has no help text"
        if field.default is not serializers.empty:
            assert prop["default"] == field.default
        if getattr(field, "min_value", None) is not None:
            assert prop["minimum"] == getattr(field, "min_value")  # noqa: B009 (not every Field has it)
        if getattr(field, "max_value", None) is not None:
            assert prop["maximum"] == getattr(field, "max_value")  # noqa: B009
        if isinstance(field, serializers.ChoiceField):
            assert prop["enum"] == list(field.choices)
        elif isinstance(field, serializers.BooleanField):
            assert prop["type"] == "boolean"
        elif isinstance(field, serializers.IntegerField):
            assert prop["type"] == "integer"
        elif isinstance(field, serializers.FloatField):
            assert prop["type"] == "number"


@pytest.mark.parametrize("name", FIVE)
def test_schema_bounds_are_what_the_serializer_enforces(name: str) -> None:
    # Walk the published schema and probe each bound: just inside passes, just outside fails.
    kind = get_kind(name)
    schema = kind.json_schema()
    base = {key: "00000000-0000-0000-0000-000000000001" for key in schema["required"]}
    for key, prop in schema["properties"].items():
        step = 1 if prop.get("type") == "integer" else 1e-9
        for bound, outside in (("minimum", -step), ("maximum", step)):
            if bound not in prop:
                continue
            kind.validate_spec({**base, key: prop[bound]})
            with pytest.raises(serializers.ValidationError) as caught:
                kind.validate_spec({**base, key: prop[bound] + outside})
            assert key in caught.value.detail


def test_defaults_of_the_schema_validate_as_a_spec() -> None:
    for name in ["synthetic", "cube_training", "asl_training"]:
        kind = get_kind(name)
        defaults = {k: p["default"] for k, p in kind.json_schema()["properties"].items()}
        assert kind.validate_spec({}) == defaults


def test_default_price_estimate_is_the_estimate_of_the_default_spec(anon_client: APIClient) -> None:
    data = anon_client.get("/api/v1/kinds/synthetic/").json()
    kind = get_kind("synthetic")
    assert data["default_price_estimate"] == format_credits(kind.estimate_price(kind.validate_spec({})))
    assert data["available"] is kind.available
    assert data["dataset_formats"] == []
    assert anon_client.get("/api/v1/kinds/asl_training/").json()["dataset_formats"] == ["zip"]


def test_price_grows_with_the_work_and_has_a_floor(settings: Any) -> None:
    kind = get_kind("synthetic")
    settings.ARTIFACT_MAX_BYTES = 2**40  # a platform that takes 64 products of 16384²
    small = kind.estimate_price(kind.validate_spec({"n": 64}))
    big = kind.estimate_price(kind.validate_spec({"n": 16384, "count": 64}))
    # The floor is the least ask a node may set, plus the platform's fee the requester pays.
    assert small == charge(max(settings.MIN_TASK_PRICE_UNITS, minimum_reward()))
    assert big > small
    assert isinstance(big, int)


def test_the_floor_always_leaves_the_worker_its_submit_and_sweep_gas(settings: Any) -> None:
    """Even with no configured floor, the least a job pays its node (the platform's fee is
    the requester's, on top) covers the worker's SUBMIT_RESULT gas and the TRANSFER that
    sweeps its earnings to the provider's wallet, so an accepted result can always enter
    the ledger and one job is enough to cash out."""
    from ledger import gas
    from protocol import encoding

    settings.MIN_TASK_PRICE_UNITS = 0
    price = get_kind("synthetic").estimate_price(get_kind("synthetic").validate_spec({"n": 64}))
    net = largest_price_under(price)  # what the node at the reference ask is paid
    submit = gas.fee_for(encoding.SUBMIT_RESULT, settings.LEDGER_GAS_PRICE)
    sweep = gas.fee_for(encoding.TRANSFER, settings.LEDGER_GAS_PRICE)
    assert net >= submit + sweep


@pytest.mark.parametrize("name", FIVE)
def test_the_largest_spec_price_fits_the_database(name: str, settings: Any) -> None:
    settings.ARTIFACT_MAX_BYTES = 2**40  # every field at its maximum, on a platform that takes the result
    kind = get_kind(name)
    props = kind.json_schema()["properties"]
    spec: dict[str, Any] = {}
    for key, prop in props.items():
        if "maximum" in prop:
            spec[key] = prop["maximum"]
        elif "enum" in prop:
            spec[key] = max(prop["enum"], key=str)
        elif prop.get("format") == "uuid":
            spec[key] = "00000000-0000-0000-0000-000000000001"
    price = kind.estimate_price(kind.validate_spec(spec))
    assert 0 < price < 2**63
    assert kind.resources(kind.validate_spec(spec)).memory_bytes > 0


def test_unknown_kind_is_a_validation_error_naming_the_choices() -> None:
    with pytest.raises(serializers.ValidationError) as caught:
        get_kind("quantum")
    assert "choose one of: synthetic" in str(caught.value.detail["kind"])  # type: ignore[call-overload]
    with pytest.raises(serializers.ValidationError):
        get_kind(["synthetic"])  # type: ignore[arg-type]


def test_asl_batch_size_zero_presets_by_gpu_memory_as_its_help_says(alice_client: APIClient) -> None:
    """The platform takes what the help text and the trainer offer: 0 lets the node preset
    the micro-batch from its GPU memory; below 0 is refused naming the field."""
    from training.asl.spec import TrainSpec, preset_batch

    kind = get_kind("asl_training")
    assert "0 presets by GPU memory" in kind.json_schema()["properties"]["batch_size"]["description"]
    spec = kind.validate_spec({"batch_size": 0})
    assert spec["batch_size"] == 0
    assert kind.resources(spec).memory_bytes > 0
    assert preset_batch(TrainSpec.from_dict(spec), {"gpu_memory_bytes": 80 * 10**9}) == (72, 4)
    body = {"kind": "asl_training", "spec": {"batch_size": -1}, "budget": 10}
    response = alice_client.post("/api/v1/tasks/", body, format="json")
    assert response.status_code == 400
    assert "batch_size" in response.json()["spec"]


@pytest.mark.parametrize("name", FIVE)
def test_the_platform_schema_is_the_kind_dataclass(name: str) -> None:
    """One schema per kind: the platform's serializer has the dataclass's fields, defaults,
    bounds and help, in its order."""
    import dataclasses

    from training.kinds import KINDS as PLUGINS

    props = get_kind(name).json_schema()["properties"]
    fields = dataclasses.fields(PLUGINS[name].spec)
    assert list(props) == [f.name for f in fields]
    for f in fields:
        assert props[f.name]["description"] == f.metadata["help"]
        if f.default is not dataclasses.MISSING:
            assert props[f.name]["default"] == f.default
        if f.metadata["lo"] is not None:
            assert (props[f.name]["minimum"], props[f.name]["maximum"]) == (f.metadata["lo"], f.metadata["hi"])
