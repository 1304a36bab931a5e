"""What every API request body is held to: a key the endpoint does not take is a 400 naming
it, never silently dropped."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rest_framework import serializers

# Sent by Django's and DRF's browsable forms with every POST; never a field of the body.
FORM_KEYS = frozenset({"csrfmiddlewaretoken"})
# A body naming more unknown keys than this has its first ones named only, each cut to
# this many characters (the body cap is the only other bound on a key's length).
NAMED_AT_MOST = 20
KEY_SHOWN_CHARS = 64


def named(key: Any) -> str:
    """A client's key as an error names it: cut short, so a 2 MB key is not echoed back."""
    text = str(key)
    return text if len(text) <= KEY_SHOWN_CHARS else text[: KEY_SHOWN_CHARS - 1] + "…"


def refuse_body(data: Any) -> None:
    """For an endpoint that takes no body (``request.data``, whose reading is DRF's 400 for
    malformed JSON): a key it names is a 400 as StrictInput's would be, so a client that
    thinks it is sending options learns they are not read. No body, ``{}`` or a form's
    CSRF token pass."""
    if data is None or (isinstance(data, Mapping) and all(key in FORM_KEYS for key in data)):
        return
    if isinstance(data, Mapping):
        unknown = [key for key in data if key not in FORM_KEYS][:NAMED_AT_MOST]
        raise serializers.ValidationError(
            {named(key): ["Unknown field: this endpoint takes no body."] for key in unknown}
        )
    raise serializers.ValidationError({"non_field_errors": ["This endpoint takes no body."]})


class StrictInput(serializers.Serializer):
    """Mixed in before a request serializer (``class X(StrictInput, serializers.Serializer)``).

    DRF drops a key it has no field for, and a read-only field's value, without a word: a
    misspelt ``emial`` on ``PATCH /me/``, or a ``username`` the endpoint does not change,
    answered 200 and changed nothing. Here each is a 400 under its own key. A read-only
    field sent back with the value the object already has is taken (a client may send back
    what it read), so only an attempt to change it is refused.
    """

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            errors = self._refused_keys(data)
            if errors:
                raise serializers.ValidationError(errors)
        return super().to_internal_value(data)

    def _refused_keys(self, data: Mapping[Any, Any]) -> dict[str, list[str]]:
        errors: dict[str, list[str]] = {}
        for key in data:
            if len(errors) >= NAMED_AT_MOST:
                break
            field = self.fields.get(key)
            if field is None:
                if key not in FORM_KEYS:
                    errors[named(key)] = ["Unknown field."]
            elif field.read_only and not self._same_as_stored(field, data.get(key)):
                errors[named(key)] = ["This field is read-only."]
        return errors

    def _same_as_stored(self, field: serializers.Field, value: Any) -> bool:
        """Whether ``value`` is what the instance holds, however the client wrote it: as
        the GET gave it, as form text ("1" for 1), or in another notation of the same
        value (a time ending in +00:00 for one ending in Z)."""
        if self.instance is None:
            return False
        if isinstance(value, bool) and not isinstance(field, serializers.BooleanField):
            return False  # ``true`` is not the id 1
        try:
            stored = field.get_attribute(self.instance)
            shown = field.to_representation(stored)
        except (AttributeError, KeyError, TypeError, ValueError):  # nothing stored to compare
            return False
        if shown == value or (isinstance(value, str) and str(shown) == value):
            return True
        try:
            return bool(field.to_internal_value(value) == stored)
        except (serializers.ValidationError, NotImplementedError, AttributeError, TypeError, ValueError):
            return False
