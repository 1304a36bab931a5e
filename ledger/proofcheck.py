"""Offline check of a ledger inclusion proof. Pure Python, no Django, no database: copy
this module (with encoding, merkle, keys, bech32, signing) anywhere and run

    verify_proof(proof_json, validator_public_key)

on the JSON that GET /api/v1/ledger/transactions/<hash>/proof returns (its "proof" key).
"""

from __future__ import annotations

import hashlib
from typing import Any

from ledger import encoding, keys, merkle
from ledger.bech32 import address_from_public_key


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
    - tx_inclusion: hash ‖ signature is a leaf under tx_root at the stated position;
    - compute_inclusion (SUBMIT_RESULT only): the ComputeResult is a leaf under compute_root.
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
        inc = proof["tx_inclusion"]
        leaf = merkle.leaf_hash(encoding.tx_leaf(bytes.fromhex(tx["hash"]), bytes.fromhex(tx["signature"])))
        path = [bytes.fromhex(p) for p in inc["audit_path"]]
        checks["tx_inclusion"] = (
            merkle.verify_inclusion(leaf, int(inc["leaf_index"]), int(inc["tree_size"]), path, header.tx_root)
            and int(inc["tree_size"]) == header.tx_count
        )
        if tx.get("type") == encoding.SUBMIT_RESULT or "compute_inclusion" in proof:
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
    except (KeyError, TypeError, ValueError, OverflowError):  # OverflowError: int() of an infinite number
        checks["well_formed"] = False
    return checks


def is_verified(checks: dict[str, bool]) -> bool:
    return bool(checks) and all(checks.values())
