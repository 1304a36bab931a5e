"""Error details as people read them on a page."""

from __future__ import annotations

from typing import Any


def error_text(detail: Any) -> str:
    """Flatten a DRF error detail ({field: [msg]}, [msg] or msg) into one sentence."""
    if isinstance(detail, dict):
        return " ".join(error_text(v) for v in detail.values())
    if isinstance(detail, list):
        return " ".join(error_text(v) for v in detail)
    return str(detail)
