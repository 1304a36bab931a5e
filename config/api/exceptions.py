"""Exceptions a model or service raises for the API's error handler (config/api/errors.py)
to answer; free of DRF, so models can import them."""

from __future__ import annotations

from django.core.exceptions import ValidationError


class StateConflict(ValidationError):
    """The current state of a row refuses the request: a 409 naming ``field``, with the
    error's ``code``. Each app subclasses it for its own conflicts."""

    field = "status"
