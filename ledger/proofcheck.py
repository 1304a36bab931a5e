"""Offline check of a ledger inclusion proof. Pure Python, no Django, no database: copy
this module (with encoding, merkle, keys, bech32, signing) anywhere and run

    verify_proof(proof_json, validator_public_key)

on the JSON that GET /api/v1/ledger/transactions/<hash>/proof returns (its "proof" key).
"""

from __future__ import annotations

import hashlib
from typing import Any

from protocol import encoding, keys, merkle
from protocol.bech32 import address_from_public_key
from protocol.signing import verify_compute_result, verify_tx


def _header(block: dict[str, Any]) -> encoding.Header:
    return encoding.Header(
        height=int(block["height"]),
        prev_hash=bytes.fromhex(block["prev_hash"]),
        timestamp_us=int(block["timestamp_us"]),
        chain_id=str(block["chain_id"]),
        proposer=str(block["proposer"]),
        proposer_key=bytes.fromhex(block["proposer_key"]),
        tx_root=bytes.fromhex(block["tx_root"]),
        compute_root=bytes.fromhex(block["compute_root"]),
        state_root=bytes.fromhex(block["state_root"]),
        tx_count=int(block["tx_count"]),
        gas_used=int(block["gas_used"]),
    )


def verify_proof(proof: dict[str, Any], validator_public_key: bytes | None = None) -> dict[str, bool]:
    """Check a proof offline. Returns each check by name; all True means verified.

    - header: the header fields hash to the block hash;
    - signature: the proposer's key signed the header (and is ``validator_public_key``
      when given, so a forger cannot bring their own key);
    - tx_hash: the transaction's signed fields (chain, type, from, to, amounts, payload,
      key) hash to its hash, so what the proof says the transaction is, it is;
    - tx_signature: the signature is the sender's (its key is the ``from`` address's);
    - tx_inclusion: hash ‖ signature is a leaf under tx_root at the stated position;
    - compute_inclusion (SUBMIT_RESULT only): the ComputeResult is a leaf under compute_root;
    - compute_binding (SUBMIT_RESULT only): that ComputeResult is this transaction's own
      (its payload's), by its sender and signed by the sender's key: a leaf of another
      transaction's result in the same block does not pass for this one's.
    """
    checks: dict[str, bool] = {}
    try:
        block = proof["block"]
        header = _header(block)
        message = header.encode()
        checks["header"] = hashlib.sha256(message).hexdigest() == block["hash"]
        key_ok = address_from_public_key(header.proposer_key) == header.proposer and (
            validator_public_key is None or header.proposer_key == validator_public_key
        )
        checks["signature"] = key_ok and keys.verify(header.proposer_key, message, bytes.fromhex(block["signature"]))
        tx = proof["transaction"]
        signed = encoding.tx_from_json(tx)
        signature = bytes.fromhex(tx["signature"])
        checks["tx_hash"] = signed.hash().hex() == tx["hash"]
        checks["tx_signature"] = len(signature) == 64 and verify_tx(signed, signature)
        inc = proof["tx_inclusion"]
        leaf = merkle.leaf_hash(encoding.tx_leaf(bytes.fromhex(tx["hash"]), signature))
        path = [bytes.fromhex(p) for p in inc["audit_path"]]
        checks["tx_inclusion"] = (
            merkle.verify_inclusion(leaf, int(inc["leaf_index"]), int(inc["tree_size"]), path, header.tx_root)
            and int(inc["tree_size"]) == header.tx_count
        )
        if signed.type == encoding.SUBMIT_RESULT or "compute_inclusion" in proof:
            comp = proof["compute_inclusion"]
            cpath = [bytes.fromhex(p) for p in comp["audit_path"]]
            leaf_bytes = bytes.fromhex(comp["leaf"])
            result = encoding.parse_compute_result(comp["compute_result"])
            checks["compute_inclusion"] = result.leaf() == leaf_bytes and merkle.verify_inclusion(
                merkle.leaf_hash(leaf_bytes),
                int(comp["leaf_index"]),
                int(comp["tree_size"]),
                cpath,
                header.compute_root,
            )
            own = encoding.parse_compute_result(signed.payload.get("compute_result"))
            checks["compute_binding"] = (
                signed.type == encoding.SUBMIT_RESULT
                and result == own
                and result.worker_address == signed.sender
                and verify_compute_result(result, signed.public_key)
            )
    except (KeyError, TypeError, ValueError, OverflowError):  # OverflowError: int() of an infinite number
        checks["well_formed"] = False
    return checks


def is_verified(checks: dict[str, bool]) -> bool:
    return bool(checks) and all(checks.values())
