"""What the node checks before it trusts what the platform sends: the transaction
templates it is asked to sign, the URLs it is sent to, and the server URL itself.

The node holds its own key so that the platform cannot move the worker's earnings
without the worker's signature. That holds only if the node looks at what it signs: a
template comes from the server (or from whoever sits between the node and the server),
and a signed TRANSFER to someone else, or a SUBMIT_RESULT whose fee is the whole
balance, would be valid on the ledger. Likewise the worker token goes only to the
server the node was configured with. Each check returns what is wrong, or None.
"""

from __future__ import annotations

import ipaddress
from typing import Any

import httpx

from protocol.encoding import REGISTER_WORKER, SUBMIT_RESULT

# The platform's default LEDGER_GAS_PRICE is 5 units per gas; this ceiling leaves an
# operator room to raise it (and accepts results of platforms that priced gas at 1,000)
# while still stopping a result's fee (at most 8 credits) from draining the balance.
DEFAULT_MAX_GAS_PRICE = 100_000


def _is_int(value: Any) -> bool:
    return type(value) is int


def _fixed_fields(template: dict[str, Any], expected: dict[str, Any]) -> str | None:
    for field, value in expected.items():
        got = template.get(field)
        if got != value or type(got) is not type(value):
            return f"{field} is {got!r}, expected {value!r}"
    return None


def register_tx_problem(template: Any, address: str) -> str | None:
    """Why a REGISTER_WORKER template must not be signed by ``address``, if it must not.

    The platform fills in only the chain, the nonce and the gas fields: the transaction
    goes from this address to itself, moves nothing and costs nothing.
    """
    if not isinstance(template, dict):
        return "it is not a JSON object"
    expected = {"type": REGISTER_WORKER, "from": address, "to": address, "amount": 0, "fee": 0}
    problem = _fixed_fields(template, expected)
    if problem is not None:
        return problem
    if template.get("payload", {}) != {}:
        return f"payload is {template.get('payload')!r}, expected none"
    if not isinstance(template.get("chain_id"), str) or not template["chain_id"]:
        return "it names no chain_id"
    if not all(_is_int(template.get(k)) and template[k] >= 0 for k in ("nonce", "gas_price", "gas_limit")):
        return "nonce, gas_price and gas_limit must be non-negative integers"
    return None


def submit_tx_problem(template: Any, address: str, *, chain_id: str, max_gas_price: int) -> str | None:
    """Why a SUBMIT_RESULT template must not be signed by ``address``, if it must not.

    From and to this address, no amount, the fee exactly gas_limit × gas_price with the
    gas price at most ``max_gas_price``, on the chain the node registered on (any chain
    when ``chain_id`` is empty: credentials from an agent that did not record it).
    """
    if not isinstance(template, dict):
        return "it is not a JSON object"
    expected = {"type": SUBMIT_RESULT, "from": address, "to": address, "amount": 0}
    problem = _fixed_fields(template, expected)
    if problem is not None:
        return problem
    numbers = ("fee", "nonce", "gas_price", "gas_limit")
    if not all(_is_int(template.get(k)) and template[k] >= 0 for k in numbers):
        return f"fee, nonce, gas_price and gas_limit must be non-negative integers, not {[template.get(k) for k in numbers]}"
    fee, gas_price, gas_limit = int(template["fee"]), int(template["gas_price"]), int(template["gas_limit"])
    if gas_price > max_gas_price:
        return f"gas_price {gas_price} is above this node's ceiling {max_gas_price} (--max-gas-price)"
    if fee != gas_limit * gas_price:
        return f"fee {fee} is not gas_limit × gas_price ({gas_limit} × {gas_price})"
    if not isinstance(template.get("chain_id"), str) or not template["chain_id"]:
        return "it names no chain_id"
    if chain_id and template["chain_id"] != chain_id:
        return f"chain_id is {template['chain_id']!r}, but this node registered on {chain_id!r}"
    return None


def insecure_server(server: str) -> str | None:
    """A warning when the worker token and signed templates would cross a network in clear text."""
    url = httpx.URL(server)
    if url.scheme != "http":
        return None
    try:
        loopback = ipaddress.ip_address(url.host).is_loopback
    except ValueError:
        loopback = url.host == "localhost"
    if loopback:
        return None
    return (
        f"warning: {server} is plain http: the worker token and the transactions this node signs"
        " travel unencrypted; use https:// for a platform on another machine."
    )


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    default = {"http": 80, "https": 443}.get(url.scheme)
    return url.scheme, url.host.lower(), url.port or default


def on_own_server(url: str, server: str) -> str:
    """A URL the platform named, made safe to send the worker token to.

    An absolute URL must be on ``server``'s origin (scheme, host, port), and only its path
    and query are kept, joined to ``server``'s own origin: the token never goes to a host or
    scheme that a server-built URL names (a proxy's Host header, a missing
    X-Forwarded-Proto). A server-relative path is returned as it is. Raises ValueError for
    a URL on another origin.
    """
    named = httpx.URL(url)
    if not named.is_absolute_url:
        return url
    own = httpx.URL(server)
    if _origin(named) != _origin(own):
        raise ValueError(f"the platform named {url}, which is not on this node's server {server}")
    return str(own.copy_with(raw_path=named.raw_path, fragment=None))


__all__ = [
    "DEFAULT_MAX_GAS_PRICE",
    "insecure_server",
    "on_own_server",
    "register_tx_problem",
    "submit_tx_problem",
]
