"""Request parsers of every API (the DEFAULT_PARSER_CLASSES of REST_FRAMEWORK)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import IO, Any

from rest_framework import parsers
from rest_framework.exceptions import ParseError, ValidationError

NUL_MESSAGE = "Null characters are not allowed."
NUL_IN_FORM_FIELD = (
    "Null characters are not allowed in a form field; to send a file, send it as a file part"
    ' with a filename (Content-Disposition: form-data; name="…"; filename="…").'
)
SURROGATE_MESSAGE = "Unpaired surrogates (\\ud800-\\udfff escapes that are not a character) are not allowed."


def text_error(text: str) -> str | None:
    """Why ``text`` cannot be stored or sent back, or None.

    PostgreSQL refuses U+0000 in text and jsonb columns, and a JSON escape such as
    ``"\\ud800"`` parses to a lone surrogate that no column (and no UTF-8 response echoing
    it) can encode: both were 500s wherever a view stored or echoed a string unchecked."""
    if "\x00" in text:
        return NUL_MESSAGE
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return SURROGATE_MESSAGE
    return None


def refuse_unstorable_text(data: Any) -> None:
    """ValidationError at the first string (value or key) of ``data`` that ``text_error``
    refuses, nested under its path as DRF nests a field's errors: ``{"capabilities":
    {"gpu_name": ["Null characters are not allowed."]}}``. Iterative, so a body as deep
    as the JSON parser accepts cannot exhaust the stack here."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(data, ())]
    while stack:
        node, path = stack.pop()
        if isinstance(node, str):
            problem = text_error(node)
            if problem is not None:
                _raise_at(path, problem)
        elif isinstance(node, Mapping):
            for key in node:
                if isinstance(key, str) and text_error(key) is not None:
                    _raise_at(path, f"A key: {text_error(key)}")
            # A QueryDict (form and multipart bodies) holds lists of values per key.
            items = node.lists() if hasattr(node, "lists") else node.items()
            stack.extend((value, (*path, key)) for key, value in items)
        elif isinstance(node, (list, tuple)):
            stack.extend((value, (*path, index)) for index, value in enumerate(node))


def _raise_at(path: tuple[Any, ...], message: str) -> None:
    keys = [key for key in path if not isinstance(key, int)] or ["non_field_errors"]
    detail: Any = [message]
    for key in reversed(keys):
        detail = {key: detail}
    raise ValidationError(detail)


class _StorableText(parsers.BaseParser):
    """Mixed into a DRF parser: what it parsed is refused at the first string no column
    or response can hold (``refuse_unstorable_text``); of a multipart body, the fields
    (not the files' bytes)."""

    def parse(
        self, stream: IO[Any], media_type: str | None = None, parser_context: Mapping[str, Any] | None = None
    ) -> Any:
        data = super().parse(stream, media_type, parser_context)
        refuse_unstorable_text(data.data if isinstance(data, parsers.DataAndFiles) else data)
        return data


class JSONParser(_StorableText, parsers.JSONParser):
    """DRF's strict JSON parser, plus a 400 for absurdly nested bodies and for strings no
    column or response can hold.

    ``json`` raises RecursionError (not ValueError) on deep nesting such as ``[[[[…``,
    which DRF does not catch: this parser answers a 2 MB body of brackets with a 400.
    """

    def parse(
        self, stream: IO[Any], media_type: str | None = None, parser_context: Mapping[str, Any] | None = None
    ) -> Any:
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - the body is nested too deeply.") from None


class FormParser(_StorableText, parsers.FormParser):
    """DRF's form parser; ``reason=a%00b`` is refused as in JSON."""


class MultiPartParser(_StorableText, parsers.MultiPartParser):
    """DRF's multipart parser; its fields are checked as in JSON.

    A part sent with ``filename=""`` is a plain field to Django, not a file, so a binary
    file sent that way arrives as text with NUL bytes: the message says how to send it."""

    def parse(
        self, stream: IO[Any], media_type: str | None = None, parser_context: Mapping[str, Any] | None = None
    ) -> Any:
        try:
            return super().parse(stream, media_type, parser_context)
        except ValidationError as exc:
            detail = exc.detail
            if isinstance(detail, dict) and len(detail) == 1:
                ((key, messages),) = detail.items()
                if messages == [NUL_MESSAGE]:
                    raise ValidationError({key: [NUL_IN_FORM_FIELD]}) from None
            raise


PARSERS = [JSONParser, FormParser, MultiPartParser]
