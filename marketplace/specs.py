"""Spec serializers, one per task kind, derived from the kind's spec dataclass
(``training.specs``): every field typed, bounded and defaulted, with its unit in the help
text; unknown keys are refused so a typo never silently falls back to a default."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from django.conf import settings
from rest_framework import serializers


class FiniteFloatField(serializers.FloatField):
    """A float that refuses NaN and ±Infinity (JSON forbids them, strings can carry them)."""

    default_error_messages = {"not_finite": "Must be a finite number (not NaN or Infinity)."}

    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool):
            self.fail("invalid")
        value = super().to_internal_value(data)
        if not math.isfinite(value):
            self.fail("not_finite")
        return value


class StrictIntegerField(serializers.IntegerField):
    """An integer that refuses booleans and non-integral floats such as 3.5."""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or (isinstance(data, float) and not data.is_integer()):
            self.fail("invalid")
        return super().to_internal_value(data)


class SpecSerializer(serializers.Serializer):
    """Base for kind specs: rejects unknown keys and non-object input."""

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise serializers.ValidationError({"non_field_errors": ["The spec must be a JSON object."]})
        unknown = sorted(set(data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError({key: ["Unknown field for this kind."] for key in unknown})
        return super().to_internal_value(data)


def _serializer_field(f: dataclasses.Field[Any]) -> serializers.Field:
    meta = f.metadata
    common: dict[str, Any] = {"help_text": meta.get("help", "")}
    # The page form's hints: a field off the form ({"form": False}), a field it shows first.
    common["style"] = {"form": meta.get("form", True), "common": bool(meta.get("common"))}
    if meta.get("uuid"):
        return serializers.UUIDField(**common)
    common["default"] = f.default
    if meta.get("choices") is not None:
        return serializers.ChoiceField(choices=list(meta["choices"]), **common)
    if isinstance(f.default, bool):
        return serializers.BooleanField(**common)
    if isinstance(f.default, int):
        return StrictIntegerField(min_value=meta.get("lo"), max_value=meta.get("hi"), **common)
    if isinstance(f.default, float):
        return FiniteFloatField(min_value=meta.get("lo"), max_value=meta.get("hi"), **common)
    return serializers.CharField(**common)


def serializer_for(spec: type, base: type[SpecSerializer] | None = None) -> type[SpecSerializer]:
    """The spec serializer of a spec dataclass: a field per dataclass field, in its order,
    named and documented as the dataclass is (the JSON schema's title and description)."""
    attrs: dict[str, Any] = {f.name: _serializer_field(f) for f in dataclasses.fields(spec)}
    attrs["__doc__"] = spec.__doc__
    attrs["__module__"] = __name__
    return type(spec.__name__, (base or SpecSerializer,), attrs)


# Room for the safetensors header of the product file (a few hundred bytes for 64 tensors).
_ARTIFACT_HEADER_BYTES = 16 * 1024


class SyntheticChecks(SpecSerializer):
    """The platform's own limits on a synthetic spec."""

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        # Exactness in float32 needs every partial sum below 2**24.
        if attrs["n"] * attrs["entry_bound"] ** 2 >= 2**24:
            raise serializers.ValidationError(
                {"entry_bound": ["n × entry_bound² must stay below 2^24 so float32 products are exact."]}
            )
        # The products go up as one int32 artifact, which the platform caps: a task whose
        # file could never be uploaded would cost every worker that tried it.
        per_product = 4 * attrs["n"] ** 2
        most = (settings.ARTIFACT_MAX_BYTES - _ARTIFACT_HEADER_BYTES) // per_product
        if most < 1:
            raise serializers.ValidationError(
                {"n": [f"An {attrs['n']}×{attrs['n']} product is larger than the platform's result limit."]}
            )
        if attrs["count"] > most:
            raise serializers.ValidationError(
                {
                    "count": [
                        f"{attrs['count']} products of {attrs['n']}×{attrs['n']} make a "
                        f"{attrs['count'] * per_product / 2**30:.1f} GiB result; the platform takes results up to "
                        f"{settings.ARTIFACT_MAX_BYTES / 2**30:.1f} GiB, so at most {most} at this n."
                    ]
                }
            )
        return attrs


def _field_schema(f: serializers.Field) -> dict[str, Any]:
    schema: dict[str, Any]
    if isinstance(f, serializers.ChoiceField):
        choices = list(f.choices)
        schema = {"enum": choices}
        if all(isinstance(c, int) for c in choices):
            schema["type"] = "integer"
        elif all(isinstance(c, str) for c in choices):
            schema["type"] = "string"
    elif isinstance(f, serializers.BooleanField):
        schema = {"type": "boolean"}
    elif isinstance(f, serializers.IntegerField):
        schema = {"type": "integer"}
    elif isinstance(f, serializers.FloatField):
        schema = {"type": "number"}
    elif isinstance(f, serializers.UUIDField):
        schema = {"type": "string", "format": "uuid"}
    else:
        schema = {"type": "string"}
    for attr, key in (("min_value", "minimum"), ("max_value", "maximum")):
        value = getattr(f, attr, None)
        if value is not None:
            schema[key] = value
    if f.default is not serializers.empty:
        schema["default"] = f.default
    if f.help_text:
        schema["description"] = str(f.help_text)
    return schema


def json_schema(serializer_class: type[SpecSerializer]) -> dict[str, Any]:
    """A JSON schema for a spec serializer: types, bounds, defaults and help texts."""
    fields = serializer_class().fields
    return {
        "type": "object",
        "title": serializer_class.__name__,
        "description": (serializer_class.__doc__ or "").strip(),
        "properties": {name: _field_schema(f) for name, f in fields.items()},
        "required": [name for name, f in fields.items() if f.required],
        "additionalProperties": False,
    }
