"""Template filters and tags for ledger pages: credits from base units, shortened hashes,
relative times, and addresses with their system-account names and a copy button."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django import template
from django.utils import timezone
from django.utils.timesince import timesince

from ledger.units import format_credits

register = template.Library()


@register.filter
def credits(units: int | None) -> str:
    """12500000000 → "12.5"."""
    return format_credits(int(units or 0))


@register.filter
def signed_credits(units: int | None) -> str:
    """12500000000 → "+12.5", -3 → "−0.000000003" (a minus sign), 0 → "0"."""
    value = int(units or 0)
    sign = "+" if value > 0 else "−" if value < 0 else ""
    return sign + format_credits(abs(value))


@register.filter
def short(value: str | None, n: int = 12) -> str:
    """The first n characters of a hash or address, with an ellipsis."""
    text = value or ""
    return text if len(text) <= n else f"{text[:n]}…"


@register.filter
def ago(moment: datetime | None) -> str:
    """ "just now", "3 minutes ago", "2 days ago": the largest unit only."""
    if moment is None:
        return ""
    if (timezone.now() - moment).total_seconds() < 60:
        return "just now"
    return f"{timesince(moment, depth=1)} ago"


@register.filter
def label(address: str | None, labels: dict[str, str] | None) -> str:
    """The name of a system or escrow account ("Treasury"), "" for any other address."""
    return (labels or {}).get(address or "", "")


@register.inclusion_tag("ledger/_when.html")
def when(moment: datetime | None) -> dict[str, Any]:
    """A relative time ("3 minutes ago") in a <time> whose title is the absolute UTC time."""
    return {"moment": moment}


@register.inclusion_tag("ledger/_address.html")
def address(value: str, labels: dict[str, str] | None = None, n: int = 16) -> dict[str, Any]:
    """An address linked to its page, shortened to n characters (0: whole), its name when it
    is a system or escrow account, and a copy button (shown only where scripts run)."""
    return {"address": value, "name": (labels or {}).get(value, ""), "n": n}


@register.inclusion_tag("ledger/_copy.html")
def copy_button(value: str, what: str = "") -> dict[str, Any]:
    """A button that copies ``value``; hidden until the page script can use the clipboard."""
    return {"value": value, "what": what}
