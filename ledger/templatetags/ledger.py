"""Template filters for ledger pages: credits from base units, shortened hashes."""

from __future__ import annotations

from django import template

from ledger.units import format_credits

register = template.Library()


@register.filter
def credits(units: int | None) -> str:
    """12500000000 → "12.5"."""
    return format_credits(int(units or 0))


@register.filter
def short(value: str | None, n: int = 12) -> str:
    """The first n characters of a hash or address, with an ellipsis."""
    text = value or ""
    return text if len(text) <= n else f"{text[:n]}…"
