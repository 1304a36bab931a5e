"""Signing and checking transactions and ComputeResults. Pure: the agent uses it too."""

from __future__ import annotations

import dataclasses

from protocol import keys
from protocol.bech32 import address_from_public_key
from protocol.encoding import ComputeResult, Tx


def sign_tx(tx: Tx, pair: keys.KeyPair) -> tuple[Tx, bytes]:
    """Bind the signer's public key into the transaction and sign its canonical bytes.

    Returns the transaction as signed (with ``public_key`` set) and the signature.
    """
    if tx.sender != pair.address:
        raise ValueError("a transaction is signed by the key of its sender")
    bound = dataclasses.replace(tx, public_key=pair.public_key)
    return bound, pair.sign(bound.encode())


def verify_tx(tx: Tx, signature: bytes, message: bytes | None = None) -> bool:
    """True when ``signature`` is the sender's over exactly this transaction.

    The sender address must be the address of the embedded public key, so a valid
    signature by some other key is still refused. ``message`` may pass the already
    computed encoding to save re-encoding.
    """
    try:
        if address_from_public_key(tx.public_key) != tx.sender:
            return False
    except ValueError:
        return False
    return keys.verify(tx.public_key, tx.encode() if message is None else message, signature)


def sign_compute_result(result: ComputeResult, pair: keys.KeyPair) -> ComputeResult:
    """The worker's signature over a ComputeResult (everything but the signature)."""
    return dataclasses.replace(result, signature=pair.sign(result.encode()))


def verify_compute_result(result: ComputeResult, public_key: bytes) -> bool:
    return keys.verify(public_key, result.encode(), result.signature)
