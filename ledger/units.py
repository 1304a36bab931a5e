"""Credits and base units. 1 credit = 10**9 units; amounts are integers, never floats."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

UNITS_PER_CREDIT = 10**9
CREDIT_DECIMALS = 9
# Digits before the point that an amount of credits may have (the API's fields allow 19).
MAX_CREDIT_DIGITS = 30


def credits_to_units(value: Decimal | str | int) -> int:
    """Convert an exact credit amount to base units; reject sub-unit precision."""
    try:
        amount = Decimal(value)
    except (InvalidOperation, TypeError, ValueError):
        raise ValueError(f"{value!r} is not a number of credits") from None
    if not amount.is_finite():
        raise ValueError("an amount must be a finite number")
    if amount.adjusted() >= MAX_CREDIT_DIGITS:
        # Bounded before any arithmetic: '1e999999999' would overflow the decimal context
        # and '1e999990' would take 25 s of CPU in int(); no real amount comes near it.
        raise ValueError(f"an amount has at most {MAX_CREDIT_DIGITS} digits before the decimal point")
    units = amount * UNITS_PER_CREDIT
    if units != units.to_integral_value():
        raise ValueError(f"at most {CREDIT_DECIMALS} decimal places")
    return int(units)


def units_to_credits(units: int) -> Decimal:
    return (Decimal(units) / UNITS_PER_CREDIT).quantize(Decimal(1).scaleb(-CREDIT_DECIMALS))


def format_credits(units: int) -> str:
    """Human form: trailing zeros trimmed, e.g. 12.5 or 0.000000001."""
    text = f"{units_to_credits(units):f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text
