"""The node's prices: ``--ask KIND=PER_TFLOP[/MIN]`` (credits), sent to the platform's
``/workers/me/asks/`` at start (``run``) or at once (``ask``). The platform checks them
(a kind this node offers, a minimum at least the floor price) and takes all or none."""

from __future__ import annotations

import argparse
import re
from decimal import Decimal, InvalidOperation

from workers.agent.transfer import PlatformClient, reasons

ASKS_PATH = "/api/v1/workers/me/asks/"
_KIND = re.compile(r"[a-z0-9_]{1,32}")
FORMAT = "KIND=PER_TFLOP[/MIN], credits, e.g. synthetic=0.5/0.2"


def _credits(text: str, what: str, spec: str) -> str:
    try:
        amount = Decimal(text)
    except InvalidOperation:
        amount = Decimal("NaN")
    if not amount.is_finite() or amount < 0:
        raise argparse.ArgumentTypeError(f"{spec!r}: the {what} {text!r} is not a number of credits ({FORMAT})")
    return text


def parse_ask(spec: str) -> dict[str, str]:
    """One ``--ask``: the kind, credits per TFLOP and, when given, the minimum per job (the
    platform's floor price otherwise). Amounts stay text: the platform parses credits exactly."""
    kind, sep, prices = spec.strip().partition("=")
    if not sep or not _KIND.fullmatch(kind):
        raise argparse.ArgumentTypeError(f"{spec!r} is not an ask ({FORMAT})")
    per_tflop, slash, minimum = prices.partition("/")
    ask = {"kind": kind, "per_tflop": _credits(per_tflop, "price per TFLOP", spec)}
    if slash:
        ask["minimum"] = _credits(minimum, "minimum", spec)
    return ask


def send_asks(client: PlatformClient, asks: list[dict[str, str]]) -> str | None:
    """Send the node's asks; None when the platform took them, else why not, in one line."""
    try:
        response = client.request("PUT", ASKS_PATH, json=asks, interruptible=True)
    except RuntimeError as exc:
        return f"could not send this node's asks: {exc}"
    if response.status_code == 200:
        return None
    if response.status_code == 404:
        return f"{client.server} takes no asks (no {ASKS_PATH}): run without --ask"
    return f"the platform refused this node's asks (HTTP {response.status_code}): {reasons(response)}"


def describe(asks: list[dict[str, str]]) -> str:
    """The asks as one line, for the log."""
    return ", ".join(
        f"{a['kind']} {a['per_tflop']}/TFLOP" + (f" (min {a['minimum']})" if "minimum" in a else "") for a in asks
    )
