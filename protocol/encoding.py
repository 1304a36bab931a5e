"""The one canonical, versioned byte encoding of everything the ledger signs or hashes.

Every structure starts with a magic tag and a version byte, then each field in a fixed
order as a 4-byte big-endian length followed by its bytes. Integers are 8-byte
big-endian unsigned; strings UTF-8; the JSON payload RFC 8785-style canonical JSON
(sorted ASCII keys, no whitespace, integers only). Length prefixes make the encoding
injective: two transactions that differ in any field never share an encoding, hence
never a hash or a signature. chain_id and type are fields, so a signature never
verifies for another chain or another kind of transaction.

Pure Python, no Django: the provider agent builds and signs the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

TX_MAGIC = b"CPCTX\x01"
CR_MAGIC = b"CPCCR\x01"
HEADER_MAGIC = b"CPCBLK\x01"
STATE_MAGIC = b"CPCST\x01"

MAX_UINT = 2**63 - 1  # fits PostgreSQL bigint
MAX_JSON_INT = 2**53 - 1  # RFC 8785 numbers are IEEE doubles; larger ints would round
MAX_PAYLOAD_BYTES = 16_384

DEPOSIT = "DEPOSIT"
TRANSFER = "TRANSFER"
ESCROW_LOCK = "ESCROW_LOCK"
ESCROW_RELEASE = "ESCROW_RELEASE"
FEE = "FEE"
REGISTER_WORKER = "REGISTER_WORKER"
SUBMIT_RESULT = "SUBMIT_RESULT"
REJECT_RESULT = "REJECT_RESULT"
PAYOUT = "PAYOUT"
# Money leaving because a card payment was refunded or disputed: burns the user's credits.
REVERSAL = "REVERSAL"
TX_TYPES = (
    DEPOSIT,
    TRANSFER,
    ESCROW_LOCK,
    ESCROW_RELEASE,
    FEE,
    REGISTER_WORKER,
    SUBMIT_RESULT,
    REJECT_RESULT,
    PAYOUT,
    REVERSAL,
)


class EncodingError(ValueError):
    """A value cannot be encoded canonically; ``field`` names which."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


_u32 = struct.Struct(">I").pack
_u64 = struct.Struct(">Q").pack


def _bytes_field(value: bytes) -> bytes:
    return _u32(len(value)) + value


def _uint(name: str, value: int) -> bytes:
    if type(value) is not int or not 0 <= value <= MAX_UINT:
        raise EncodingError(name, f"must be an integer between 0 and {MAX_UINT}")
    return _u32(8) + _u64(value)


def _str(name: str, value: str) -> bytes:
    if not isinstance(value, str):
        raise EncodingError(name, "must be a string")
    return _bytes_field(value.encode())


_MAX_DEPTH = 16


def _check_json(name: str, value: Any, depth: int = 0) -> None:
    """Raise EncodingError, naming the field, when ``value`` is not canonical JSON.
    The reference definition; canonical_json tries the fast ``_plain_json`` first."""
    if depth > _MAX_DEPTH:
        raise EncodingError(name, "is nested too deeply")
    if value is None or isinstance(value, bool | str):
        return
    if isinstance(value, int):
        if abs(value) > MAX_JSON_INT:
            raise EncodingError(name, f"integers in a payload are at most {MAX_JSON_INT} in magnitude")
        return
    if isinstance(value, float):
        raise EncodingError(name, "floats are not allowed (amounts are integers)")
    if isinstance(value, list | tuple):
        for item in value:
            _check_json(name, item, depth + 1)
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str) or not key.isascii():
                raise EncodingError(name, "object keys must be ASCII strings")
            _check_json(f"{name}.{key}", item, depth + 1)
        return
    raise EncodingError(name, f"{type(value).__name__} is not JSON")


def _plain_json(value: Any, depth: int = 0) -> bool:
    """True when ``value`` is built of exact dicts, lists, tuples, str, bool, None and
    in-range ints only: then _check_json would accept it. False means "ask _check_json",
    which either names the fault or accepts an unusual but valid value (a Mapping that
    is not a dict, a str subclass…). Exact type tests and no field names keep this pass
    several times cheaper than _check_json on the payloads every transaction carries."""
    if depth > _MAX_DEPTH:
        return False
    kind = type(value)
    if kind is dict:
        for key in value:
            if type(key) is not str or not key.isascii():
                return False
        children = value.values()
    elif kind is list or kind is tuple:
        children = value
    elif kind is str or kind is bool or value is None:
        return True
    elif kind is int:
        return -MAX_JSON_INT <= value <= MAX_JSON_INT
    else:
        return False
    depth += 1
    for child in children:
        kind = type(child)
        if kind is str or kind is bool or child is None:
            if depth > _MAX_DEPTH:
                return False
        elif kind is int:
            if depth > _MAX_DEPTH or not -MAX_JSON_INT <= child <= MAX_JSON_INT:
                return False
        elif not _plain_json(child, depth):
            return False
    return True


# json.dumps builds a new encoder per call when given options; one shared instance.
_dumps_canonical = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode


def canonical_json(value: Any, name: str = "payload") -> bytes:
    """RFC 8785 canonical JSON for the subset we allow: no floats, ASCII keys.

    With ASCII keys, Python's code-point key order equals RFC 8785's UTF-16 order, and
    json.dumps escapes exactly the characters ECMAScript's JSON.stringify escapes.
    """
    if not _plain_json(value):
        _check_json(name, value)
    return _dumps_canonical(value).encode()


@dataclass(frozen=True)
class Tx:
    """Every field of a transaction except its signature."""

    chain_id: str
    type: str
    sender: str
    recipient: str
    amount: int
    fee: int
    nonce: int
    gas_price: int
    gas_limit: int
    payload: Mapping[str, Any] = field(default_factory=dict)
    public_key: bytes = b""

    def encode(self) -> bytes:
        return encode_tx(self)

    def hash(self) -> bytes:
        return hashlib.sha256(encode_tx(self)).digest()


def tx_from_json(fields: Mapping[str, Any]) -> Tx:
    """The Tx a transaction's JSON form describes (the API's names: ``from``, ``to``; hex
    for the public key, empty or absent in an unsigned template). Strict: a text field
    must be a string and an amount an integer (not a bool, a float or a numeric string),
    so the JSON shows exactly what is signed. KeyError, TypeError or ValueError when not."""

    def text(name: str) -> str:
        value = fields[name]
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a string")
        return value

    def count(name: str) -> int:
        value = fields[name]
        if type(value) is not int:
            raise TypeError(f"{name} must be an integer")
        return value

    payload = fields.get("payload", {})
    if not isinstance(payload, Mapping):
        raise TypeError("payload must be an object")
    return Tx(
        chain_id=text("chain_id"),
        type=text("type"),
        sender=text("from"),
        recipient=text("to"),
        amount=count("amount"),
        fee=count("fee"),
        nonce=count("nonce"),
        gas_price=count("gas_price"),
        gas_limit=count("gas_limit"),
        payload=payload,
        public_key=bytes.fromhex(fields["public_key"]) if "public_key" in fields else b"",
    )


def tx_to_json(tx: Tx) -> dict[str, Any]:
    """A transaction's JSON form, which ``tx_from_json`` reads back: the API's names
    (``from``, ``to``), in encoding order, hex for the public key; no signature."""
    return {
        "chain_id": tx.chain_id,
        "type": tx.type,
        "from": tx.sender,
        "to": tx.recipient,
        "amount": tx.amount,
        "fee": tx.fee,
        "nonce": tx.nonce,
        "gas_price": tx.gas_price,
        "gas_limit": tx.gas_limit,
        "payload": dict(tx.payload),
        "public_key": tx.public_key.hex(),
    }


def encode_tx(tx: Tx) -> bytes:
    """The signed bytes of a transaction (version 1)."""
    if tx.type not in TX_TYPES:
        raise EncodingError("type", f"must be one of {', '.join(TX_TYPES)}")
    if not isinstance(tx.payload, Mapping):
        raise EncodingError("payload", "must be a JSON object")
    if not isinstance(tx.public_key, bytes):
        raise EncodingError("public_key", "must be bytes")
    payload = canonical_json(tx.payload)
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise EncodingError("payload", f"is larger than {MAX_PAYLOAD_BYTES} bytes")
    return b"".join(
        (
            TX_MAGIC,
            _str("chain_id", tx.chain_id),
            _str("type", tx.type),
            _str("from", tx.sender),
            _str("to", tx.recipient),
            _uint("amount", tx.amount),
            _uint("fee", tx.fee),
            _uint("nonce", tx.nonce),
            _uint("gas_price", tx.gas_price),
            _uint("gas_limit", tx.gas_limit),
            _bytes_field(payload),
            _bytes_field(tx.public_key),
        )
    )


def tx_leaf(tx_hash: bytes, signature: bytes) -> bytes:
    """Leaf data of tx_root: the hash and the signature, so the root commits to both."""
    return tx_hash + signature


@dataclass(frozen=True)
class ComputeResult:
    """A worker's signed claim: this task, this result, this proof."""

    task_id: str
    worker_address: str
    result_hash: str
    proof: Any
    nonce: int
    signature: bytes = b""

    def encode(self) -> bytes:
        """The bytes the worker signs (everything but the signature)."""
        return _compute_result_message(self, canonical_json(self.proof, "proof"))

    def leaf(self) -> bytes:
        """Leaf data of compute_root: the signed bytes and the signature."""
        return compute_result_leaf(self, self.encode())

    def to_json(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "worker_address": self.worker_address,
            "result_hash": self.result_hash,
            "proof": self.proof,
            "nonce": self.nonce,
            "signature": self.signature.hex(),
        }


def _compute_result_message(result: ComputeResult, proof_json: bytes) -> bytes:
    return b"".join(
        (
            CR_MAGIC,
            _str("task_id", result.task_id),
            _str("worker_address", result.worker_address),
            _str("result_hash", result.result_hash),
            _bytes_field(proof_json),
            _uint("nonce", result.nonce),
        )
    )


def parse_signed_compute_result(data: Any) -> tuple[ComputeResult, bytes]:
    """parse_compute_result, plus the bytes the worker signed (``result.encode()``),
    validating the proof once instead of twice: admission, sealing and the chain audit
    need both for every SUBMIT_RESULT."""
    result = parse_compute_result(data)
    # parse_compute_result has just checked the proof as canonical_json would.
    return result, _compute_result_message(result, _dumps_canonical(result.proof).encode())


def compute_result_leaf(result: ComputeResult, message: bytes) -> bytes:
    """``result.leaf()`` from its already computed signed bytes."""
    return message + _bytes_field(result.signature)


def parse_compute_result(data: Any) -> ComputeResult:
    """Check the structure of a ComputeResult from a payload; EncodingError names the field."""
    if not isinstance(data, Mapping):
        raise EncodingError("payload.compute_result", "must be an object")
    expected = {"task_id", "worker_address", "result_hash", "proof", "nonce", "signature"}
    missing = expected - data.keys()
    if missing:
        raise EncodingError(f"payload.compute_result.{sorted(missing)[0]}", "is required")
    extra = data.keys() - expected
    if extra:
        raise EncodingError(f"payload.compute_result.{sorted(extra)[0]}", "is not a ComputeResult field")
    try:
        task_id = str(uuid.UUID(str(data["task_id"])))
    except ValueError:
        raise EncodingError("payload.compute_result.task_id", "must be a UUID") from None
    if task_id != data["task_id"]:
        raise EncodingError("payload.compute_result.task_id", "must be a lower-case hyphenated UUID")
    result_hash = data["result_hash"]
    if not isinstance(result_hash, str) or len(result_hash) != 64 or not _is_lower_hex(result_hash):
        raise EncodingError("payload.compute_result.result_hash", "must be 64 lower-case hex characters")
    if not isinstance(data["worker_address"], str):
        raise EncodingError("payload.compute_result.worker_address", "must be a string")
    signature = data["signature"]
    if not isinstance(signature, str) or len(signature) != 128 or not _is_lower_hex(signature):
        raise EncodingError("payload.compute_result.signature", "must be 128 lower-case hex characters")
    nonce = data["nonce"]
    if type(nonce) is not int or not 0 <= nonce <= MAX_JSON_INT:
        raise EncodingError("payload.compute_result.nonce", "must be a non-negative integer")
    if not _plain_json(data["proof"]):
        _check_json("payload.compute_result.proof", data["proof"])
    return ComputeResult(
        task_id=task_id,
        worker_address=data["worker_address"],
        result_hash=result_hash,
        proof=data["proof"],
        nonce=nonce,
        signature=bytes.fromhex(signature),
    )


_LOWER_HEX = re.compile(r"[0-9a-f]*")


def _is_lower_hex(text: str) -> bool:
    return _LOWER_HEX.fullmatch(text) is not None


@dataclass(frozen=True)
class Header:
    """A block header: everything the validator signs."""

    height: int
    prev_hash: bytes
    timestamp_us: int
    chain_id: str
    proposer: str
    proposer_key: bytes
    tx_root: bytes
    compute_root: bytes
    state_root: bytes
    tx_count: int
    gas_used: int

    def encode(self) -> bytes:
        return b"".join(
            (
                HEADER_MAGIC,
                _uint("height", self.height),
                _bytes_field(self.prev_hash),
                _uint("timestamp", self.timestamp_us),
                _str("chain_id", self.chain_id),
                _str("proposer", self.proposer),
                _bytes_field(self.proposer_key),
                _bytes_field(self.tx_root),
                _bytes_field(self.compute_root),
                _bytes_field(self.state_root),
                _uint("tx_count", self.tx_count),
                _uint("gas_used", self.gas_used),
            )
        )

    def hash(self) -> bytes:
        return hashlib.sha256(self.encode()).digest()


def state_leaf(address: str, balance: int, nonce: int) -> bytes:
    """Leaf data of state_root for one account."""
    return STATE_MAGIC + _str("address", address) + _uint("balance", balance) + _uint("nonce", nonce)
