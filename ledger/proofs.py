"""Inclusion proofs of a transaction, and their offline check.

``build_proof`` needs the database; ``verify_proof`` needs nothing but the proof (and,
to pin the signer, the validator's public key): give the JSON to anyone and they can
check that the transaction, and for a SUBMIT_RESULT its ComputeResult, is in a block
the platform signed.
"""

from __future__ import annotations

from typing import Any

from ledger.models import Block, Transaction, timestamp_us
from ledger.proofcheck import is_verified, verify_proof
from ledger.sealer import compute_leaf_hashes, tx_leaf_hashes
from protocol import encoding, merkle

# 2: the transaction's signed fields are in the proof, so the checker binds the hash (and
# a SUBMIT_RESULT's ComputeResult) to what the transaction says; 1 carried the hash only.
PROOF_VERSION = 2
__all__ = ["build_proof", "header_json", "is_verified", "verify_proof"]


def header_json(block: Block) -> dict[str, Any]:
    return {
        "height": block.height,
        "hash": block.hash,
        "prev_hash": block.prev_hash,
        "timestamp": block.timestamp.isoformat(),
        "timestamp_us": timestamp_us(block.timestamp),
        "chain_id": block.chain_id,
        "proposer": block.proposer,
        "proposer_key": block.proposer_key,
        "tx_root": block.tx_root,
        "compute_root": block.compute_root,
        "state_root": block.state_root,
        "tx_count": block.tx_count,
        "gas_used": block.gas_used,
        "signature": block.signature,
    }


def build_proof(tx: Transaction) -> dict[str, Any] | None:
    """The proof of a sealed transaction; None while it is pending or if refused."""
    block = tx.block
    if block is None or tx.index_in_block is None:
        return None
    txs = list(
        Transaction.objects.filter(block=block).order_by("index_in_block").only("hash", "signature", "type", "payload")
    )
    leaves = tx_leaf_hashes(txs)
    proof: dict[str, Any] = {
        "version": PROOF_VERSION,
        "block": header_json(block),
        "transaction": {**encoding.tx_to_json(tx.as_tx()), "hash": tx.hash, "signature": tx.signature},
        "tx_inclusion": {
            "leaf_index": tx.index_in_block,
            "tree_size": len(leaves),
            "audit_path": [p.hex() for p in merkle.audit_path(leaves, tx.index_in_block)],
        },
    }
    if tx.type == encoding.SUBMIT_RESULT:
        results = [t for t in txs if t.type == encoding.SUBMIT_RESULT]
        position = next(i for i, t in enumerate(results) if t.hash == tx.hash)
        compute_leaves = compute_leaf_hashes(results)
        result = encoding.parse_compute_result(tx.payload["compute_result"])
        proof["compute_inclusion"] = {
            "leaf": result.leaf().hex(),
            "compute_result": result.to_json(),
            "leaf_index": position,
            "tree_size": len(compute_leaves),
            "audit_path": [p.hex() for p in merkle.audit_path(compute_leaves, position)],
        }
    return proof
