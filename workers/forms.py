"""Forms of the provider pages."""

from __future__ import annotations

from decimal import Decimal

from django import forms

from ledger.units import UNITS_PER_CREDIT, format_credits
from marketplace.forms import ServiceErrorsMixin

_MAX = Decimal(9_000_000_000)
_BOUNDS = {"max_value": f"Must be at most {format_credits(9_000_000_000 * UNITS_PER_CREDIT)} credits."}


class AskForm(ServiceErrorsMixin, forms.Form):
    """A node's ask for one kind, in credits (``workers.market.asks.set_ask`` checks the rest)."""

    per_tflop = forms.DecimalField(
        label="Per TFLOP (credits)",
        min_value=Decimal(0),
        max_value=_MAX,
        max_digits=19,
        decimal_places=9,
        error_messages={**_BOUNDS, "min_value": "Must be 0 credits or more."},
    )
    minimum = forms.DecimalField(
        label="Minimum per job (credits)",
        min_value=Decimal(1) / UNITS_PER_CREDIT,
        max_value=_MAX,
        max_digits=19,
        decimal_places=9,
        error_messages={**_BOUNDS, "min_value": f"Must be at least {format_credits(1)} credits."},
    )
