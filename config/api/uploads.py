"""Uploads in ordered parts, as every API that takes large files has them: each part names
its place with ``Content-Range: bytes START-END/TOTAL``, and a part that does not continue
what was received is refused with a 409 naming ``received`` (``OutOfOrder``)."""

from __future__ import annotations

import re
from typing import Any

from rest_framework.exceptions import ValidationError

_RANGE = re.compile(r"bytes (\d{1,15})-(\d{1,15})/(\d{1,15})")


class OutOfOrder(Exception):
    """The part does not continue what was received; the view answers 409 with ``received``."""

    def __init__(self, received: int) -> None:
        super().__init__(f"Expected the part that starts at byte {received}.")
        self.received = received

    def body(self) -> dict[str, Any]:
        """The 409's JSON: the reason under the header's name and where to continue."""
        return {"Content-Range": [str(self)], "received": self.received}


def parse_content_range(header: str | None) -> tuple[int, int, int] | None:
    """(start, end, total) from ``bytes START-END/TOTAL``, None without the header."""
    if header is None:
        return None
    match = _RANGE.fullmatch(header.strip())
    if match is None:
        raise ValidationError({"Content-Range": ["Expected 'bytes START-END/TOTAL'."]})
    start, end, total = (int(group) for group in match.groups())
    if not start <= end < total:
        raise ValidationError({"Content-Range": ["Needs START ≤ END < TOTAL."]})
    return start, end, total
