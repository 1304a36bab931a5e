"""Helpers for ledger tests: worker keys and signed transactions built as an agent would."""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings

from ledger import gas
from ledger.mempool import Submission
from protocol import encoding, keys
from protocol.encoding import ComputeResult, Tx
from protocol.signing import sign_compute_result, sign_tx

CREDIT = 10**9


def worker_keys(n: int) -> keys.KeyPair:
    return keys.from_seed(n.to_bytes(32, "big"))


def signed(
    pair: keys.KeyPair, tx_type: str, to: str, amount: int, nonce: int, payload: dict[str, Any], **over: Any
) -> Submission:
    price = over.pop("gas_price", settings.LEDGER_GAS_PRICE)
    fields: dict[str, Any] = {
        "chain_id": settings.LEDGER_CHAIN_ID,
        "type": tx_type,
        "sender": pair.address,
        "recipient": to,
        "amount": amount,
        "fee": gas.fee_for(tx_type, price),
        "nonce": nonce,
        "gas_price": price,
        "gas_limit": gas.gas_limit(tx_type),
        "payload": payload,
    }
    fields.update(over)
    tx, sig = sign_tx(Tx(**fields), pair)
    return Submission(tx, sig)


def submission_json(sub: Submission) -> dict[str, Any]:
    """A signed transaction as the submission endpoint takes it."""
    return {**encoding.tx_to_json(sub.tx), "signature": sub.signature.hex()}


def submit_result(pair: keys.KeyPair, nonce: int, task_id: uuid.UUID | None = None, **over: Any) -> Submission:
    """A SUBMIT_RESULT exactly as a worker would sign it."""
    result = sign_compute_result(
        ComputeResult(
            task_id=str(task_id or uuid.uuid4()),
            worker_address=pair.address,
            result_hash="ab" * 32,
            proof={"rows": [1, 5, 9]},
            nonce=nonce,
        ),
        pair,
    )
    return signed(pair, encoding.SUBMIT_RESULT, pair.address, 0, nonce, {"compute_result": result.to_json()}, **over)


def follow(client: Any, url: str, key: str = "next") -> list[dict[str, Any]]:
    """Every page of a paged listing from ``url`` on, following ``key`` ("next", or
    "previous" to walk back) to the end."""
    pages = []
    link: str | None = url
    while link is not None:
        response = client.get(link)
        assert response.status_code == 200, response.content
        pages.append(response.json())
        link = pages[-1][key]
    return pages
