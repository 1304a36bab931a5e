"""Request parsers for the marketplace API."""

from __future__ import annotations

from collections.abc import Mapping
from typing import IO, Any

from rest_framework import parsers
from rest_framework.exceptions import ParseError


class JSONParser(parsers.JSONParser):
    """DRF's strict JSON parser, plus a 400 for absurdly nested bodies.

    ``json`` raises RecursionError (not ValueError) on deep nesting such as ``[[[[…``,
    which DRF does not catch, so a 2 MB body of brackets was a 500.
    """

    def parse(
        self, stream: IO[Any], media_type: str | None = None, parser_context: Mapping[str, Any] | None = None
    ) -> Any:
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - the body is nested too deeply.") from None


PARSERS = [JSONParser, parsers.FormParser, parsers.MultiPartParser]
