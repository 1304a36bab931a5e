"""Messages the platform and a provider node exchange, as exact bytes.

Pure Python (no Django): the agent on the node imports this module to sign, the
platform imports it to verify, so the two can never disagree on an encoding.
"""

from __future__ import annotations

from typing import Any

from protocol.encoding import Tx, tx_from_json
from protocol.keys import KeyPair
from protocol.signing import sign_tx

REGISTER_DOMAIN = b"proofwork/register-worker/v1"


def registration_message(challenge: str, public_key_hex: str) -> bytes:
    """What a node signs to prove it holds the key it registers.

    Domain-separated so that a registration signature can never be replayed as a
    transaction or result signature, and bound to the one-time server challenge.
    """
    return b"\n".join([REGISTER_DOMAIN, challenge.encode("ascii"), public_key_hex.lower().encode("ascii")])


def template_tx(template: dict[str, Any]) -> Tx:
    """A ledger Tx from the JSON template the platform hands out (``from``/``to`` keys)."""
    return tx_from_json(template)


def sign_template(template: dict[str, Any], key: KeyPair) -> bytes:
    """Sign a transaction template with the node's key; returns the signature."""
    _, signature = sign_tx(template_tx(template), key)
    return signature
