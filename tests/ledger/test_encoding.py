"""Canonical encoding: replay, malleability and forgery attempts all fail."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pytest

from ledger import encoding, keys
from ledger.encoding import ComputeResult, EncodingError, Tx
from ledger.signing import sign_compute_result, sign_tx, verify_compute_result, verify_tx

ALICE = keys.from_seed(bytes(range(32)))
MALLORY = keys.from_seed(bytes(range(1, 33)))


def _tx(**overrides: object) -> Tx:
    fields: dict[str, object] = {
        "chain_id": "proofwork-test-1",
        "type": encoding.TRANSFER,
        "sender": ALICE.address,
        "recipient": MALLORY.address,
        "amount": 5 * 10**9,
        "fee": 21_000_000,
        "nonce": 3,
        "gas_price": 1_000,
        "gas_limit": 21_000,
        "payload": {"memo": "rent"},
    }
    fields.update(overrides)
    return Tx(**fields)  # type: ignore[arg-type]


VARIANTS: dict[str, Any] = {
    "chain_id": "proofwork-main-1",
    "type": encoding.PAYOUT,
    "recipient": ALICE.address,
    "amount": 5 * 10**9 + 1,
    "fee": 21_000_001,
    "nonce": 4,
    "gas_price": 1_001,
    "gas_limit": 21_001,
    "payload": {"memo": "rent!"},
}


@pytest.mark.parametrize(("name", "value"), VARIANTS.items())
def test_a_signature_never_verifies_for_another_field_value(name: str, value: Any) -> None:
    signed, sig = sign_tx(_tx(), ALICE)
    assert verify_tx(signed, sig)
    other = dataclasses.replace(signed, **{name: value})
    assert other.encode() != signed.encode()
    assert other.hash() != signed.hash()
    assert not verify_tx(other, sig), f"signature replayed onto a tx with another {name}"


def test_forgery_by_another_key_is_refused() -> None:
    unsigned = _tx()
    # Mallory signs Alice's tx with her own key but claims Alice's address.
    forged = dataclasses.replace(unsigned, public_key=MALLORY.public_key)
    sig = MALLORY.sign(forged.encode())
    assert not verify_tx(forged, sig)
    with pytest.raises(ValueError, match="sender"):
        sign_tx(unsigned, MALLORY)


def test_payload_key_order_does_not_change_the_encoding_but_values_do() -> None:
    a = _tx(payload={"a": 1, "b": [1, "x"]})
    b = _tx(payload={"b": [1, "x"], "a": 1})
    assert a.encode() == b.encode()
    assert _tx(payload={"a": 1}).hash() != _tx(payload={"a": "1"}).hash()


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"payload": {"x": 1.5}}, "payload.x"),
        ({"amount": -1}, "amount"),
        ({"amount": 2**63}, "amount"),
        ({"fee": True}, "fee"),
        ({"type": "STEAL"}, "type"),
        ({"payload": {"big": 2**60}}, "payload.big"),
        ({"payload": {"é": 1}}, "payload"),
    ],
)
def test_values_that_cannot_be_encoded_canonically_are_refused(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(EncodingError) as err:
        _tx(**overrides).encode()
    assert err.value.field == field


def test_compute_result_signature_binds_every_field() -> None:
    result = ComputeResult(
        task_id=str(uuid.UUID(int=7)),
        worker_address=ALICE.address,
        result_hash="ab" * 32,
        proof={"rows": [1, 2]},
        nonce=1,
    )
    signed = sign_compute_result(result, ALICE)
    assert verify_compute_result(signed, ALICE.public_key)
    assert not verify_compute_result(signed, MALLORY.public_key)
    changes: dict[str, Any] = {
        "task_id": str(uuid.UUID(int=8)),
        "result_hash": "cd" * 32,
        "proof": {"rows": [1]},
        "nonce": 2,
    }
    for name, value in changes.items():
        assert not verify_compute_result(dataclasses.replace(signed, **{name: value}), ALICE.public_key), name
    parsed = encoding.parse_compute_result(signed.to_json())
    assert parsed == signed


def test_compute_result_structure_errors_name_the_field() -> None:
    good = ComputeResult(str(uuid.UUID(int=1)), ALICE.address, "ab" * 32, {}, 0, b"\x00" * 64).to_json()
    cases: list[tuple[dict[str, Any], str]] = [
        ({"task_id": "nope"}, "payload.compute_result.task_id"),
        ({"result_hash": "AB" * 32}, "payload.compute_result.result_hash"),
        ({"nonce": -1}, "payload.compute_result.nonce"),
        ({"signature": "00"}, "payload.compute_result.signature"),
        ({"extra": 1}, "payload.compute_result.extra"),
    ]
    for change, field in cases:
        with pytest.raises(EncodingError) as err:
            encoding.parse_compute_result({**good, **change})
        assert err.value.field == field
