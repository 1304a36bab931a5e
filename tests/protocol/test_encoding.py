"""Canonical encoding: replay, malleability and forgery attempts all fail."""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import hypothesis
import pytest
from hypothesis import strategies as st

from protocol import encoding, keys
from protocol.encoding import ComputeResult, EncodingError, Tx
from protocol.signing import sign_compute_result, sign_tx, verify_compute_result, verify_tx

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


def _reference_canonical_json(value: Any) -> bytes:
    """canonical_json as first written: the full check, then json.dumps."""
    encoding._check_json("payload", value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _outcome(fn: Callable[[Any], bytes], value: Any) -> bytes | str:
    try:
        return fn(value)
    except EncodingError as exc:
        return f"refused {exc}"


json_like = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**60), max_value=2**60)
    | st.floats(allow_nan=False)
    | st.text(max_size=5)
    | st.binary(max_size=2),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=3) | st.integers(0, 3), inner, max_size=4)
    ),
    max_leaves=30,
)


@hypothesis.given(json_like)
def test_canonical_json_accepts_refuses_and_writes_exactly_as_the_full_check(value: Any) -> None:
    assert _outcome(encoding.canonical_json, value) == _outcome(_reference_canonical_json, value)


def _nested(depth: int, leaf: Any, kind: str) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value] if kind == "list" else {"k": value}
    return value


@pytest.mark.parametrize("kind", ["list", "dict"])
@pytest.mark.parametrize("leaf", [1, "x", None, [], {}])
@pytest.mark.parametrize("depth", [15, 16, 17, 18])
def test_nesting_limits_are_the_same_on_the_fast_path(kind: str, leaf: Any, depth: int) -> None:
    value = _nested(depth, leaf, kind)
    assert _outcome(encoding.canonical_json, value) == _outcome(_reference_canonical_json, value)


class _Key(str):
    pass


def test_unusual_but_valid_json_is_still_accepted() -> None:
    value = OrderedDict([(_Key("b"), _Key("x")), ("a", (1, True))])
    assert encoding.canonical_json(value) == b'{"a":[1,true],"b":"x"}'


def test_parse_signed_compute_result_gives_the_signed_bytes() -> None:
    signed = sign_compute_result(
        ComputeResult(str(uuid.UUID(int=3)), ALICE.address, "ab" * 32, {"rows": [1, {"a": None}]}, 4), ALICE
    )
    result, message = encoding.parse_signed_compute_result(signed.to_json())
    assert result == signed
    assert message == signed.encode()
    assert encoding.compute_result_leaf(result, message) == signed.leaf()
    with pytest.raises(EncodingError) as err:
        encoding.parse_signed_compute_result({**signed.to_json(), "proof": {"x": 0.5}})
    assert err.value.field == "payload.compute_result.proof.x"


def test_the_json_form_reads_back_as_the_same_transaction() -> None:
    tx, _ = sign_tx(_tx(), ALICE)
    body = encoding.tx_to_json(tx)
    assert (body["from"], body["to"]) == (ALICE.address, MALLORY.address)
    assert body["public_key"] == ALICE.public_key.hex()
    assert encoding.tx_from_json(json.loads(json.dumps(body))) == tx
