"""The rules every transaction obeys, shared by admission, sealing and the chain audit.

``check_stateless`` needs nothing but the transaction; ``apply`` moves balances and
nonces in a plain mapping address → [balance, nonce]. Admission runs apply over the
accounts' (available, next_nonce), sealing and verify_chain over (balance, nonce): one
rule book, three readers.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from ledger import batchverify, gas
from ledger.batchverify import Item
from protocol import encoding
from protocol.bech32 import AddressError, address_from_public_key, decode_address
from protocol.encoding import ComputeResult, EncodingError, Tx
from protocol.signing import verify_compute_result, verify_tx


class Refusal(Exception):
    """A transaction broke a rule. ``code`` is stable and machine-readable; ``field``
    names the transaction field at fault."""

    def __init__(self, code: str, detail: str, field: str = "") -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.field = field


@dataclass(frozen=True)
class ChainContext:
    """What the rules need to know about this chain."""

    chain_id: str
    treasury: str
    validator: str
    min_gas_price: int


def _task_id(payload: Mapping[str, Any]) -> uuid.UUID:
    raw = payload.get("task_id")
    try:
        value = uuid.UUID(str(raw))
    except ValueError:
        raise Refusal("bad_payload", "payload.task_id must be a UUID", "payload") from None
    if str(value) != raw:
        raise Refusal("bad_payload", "payload.task_id must be a lower-case hyphenated UUID", "payload")
    return value


def _keys(payload: Mapping[str, Any], required: set[str], optional: frozenset[str] = frozenset()) -> None:
    missing = required - payload.keys()
    if missing:
        raise Refusal("bad_payload", f"payload.{sorted(missing)[0]} is required", "payload")
    extra = payload.keys() - required - optional
    if extra:
        raise Refusal("bad_payload", f"payload.{sorted(extra)[0]} is not allowed for this type", "payload")


def _positive(tx: Tx) -> None:
    if tx.amount <= 0:
        raise Refusal("bad_amount", "the amount must be positive", "amount")


def _zero(tx: Tx) -> None:
    if tx.amount != 0:
        raise Refusal("bad_amount", f"a {tx.type} moves no amount", "amount")


def check_stateless(
    tx: Tx,
    signature: bytes,
    ctx: ChainContext,
    message: bytes | None = None,
    *,
    signatures_checked: bool = False,
    parsed: ComputeResult | None = None,
) -> ComputeResult | None:
    """Every rule that needs no account state. Returns the parsed ComputeResult of a
    SUBMIT_RESULT. Raises Refusal.

    ``signatures_checked`` means the caller has already verified the ed25519 signatures
    (the transaction's and its ComputeResult's) in a batch (check_signatures) and
    refused those that failed; everything else is still checked here."""
    if tx.chain_id != ctx.chain_id:
        raise Refusal("wrong_chain", f"this ledger is {ctx.chain_id!r}, not {tx.chain_id!r}", "chain_id")
    for name, address in (("from", tx.sender), ("to", tx.recipient)):
        try:
            decode_address(address)
        except AddressError as exc:
            raise Refusal("bad_address", f"{name}: {exc}", name) from None
        if address != address.lower():
            raise Refusal("bad_address", f"{name}: addresses are written in lower case", name)
    expected_gas = gas.GAS[tx.type]
    if tx.gas_limit != expected_gas:
        raise Refusal("bad_gas", f"a {tx.type} takes gas_limit {expected_gas}", "gas_limit")
    if expected_gas and tx.gas_price < ctx.min_gas_price:
        raise Refusal("bad_gas", f"gas_price is at least {ctx.min_gas_price}", "gas_price")
    if tx.fee != tx.gas_limit * tx.gas_price:
        raise Refusal("bad_fee", "fee must equal gas_limit × gas_price", "fee")
    if signatures_checked:
        if len(signature) != 64 or address_from_public_key_safe(tx.public_key) != tx.sender:
            raise Refusal("bad_signature", "the signature does not verify for this transaction and sender", "signature")
    elif len(signature) != 64 or not verify_tx(tx, signature, message):
        raise Refusal("bad_signature", "the signature does not verify for this transaction and sender", "signature")
    return _check_type(tx, ctx, signatures_checked, parsed)


def address_from_public_key_safe(public_key: bytes) -> str:
    try:
        return address_from_public_key(public_key)
    except AddressError:
        return ""


def _check_type(
    tx: Tx, ctx: ChainContext, signatures_checked: bool = False, parsed: ComputeResult | None = None
) -> ComputeResult | None:
    p = tx.payload
    t = tx.type
    if t == encoding.DEPOSIT:
        _positive(tx)
        if tx.sender != ctx.treasury:
            raise Refusal("bad_sender", "only the treasury deposits", "from")
        _keys(p, set(), frozenset({"reference", "source"}))
    elif t == encoding.PAYOUT:
        _positive(tx)
        if tx.recipient != ctx.treasury:
            raise Refusal("bad_recipient", "a payout goes to the treasury", "to")
        _keys(p, set(), frozenset({"reference", "destination"}))
    elif t == encoding.REVERSAL:
        _positive(tx)
        if tx.recipient != ctx.treasury:
            raise Refusal("bad_recipient", "a reversal goes to the treasury", "to")
        _keys(p, set(), frozenset({"reference", "reason"}))
    elif t == encoding.TRANSFER:
        _positive(tx)
        if tx.recipient == tx.sender:
            raise Refusal("bad_recipient", "a transfer goes to another address", "to")
        _keys(p, set(), frozenset({"memo"}))
    elif t == encoding.ESCROW_LOCK:
        _positive(tx)
        _keys(p, {"task_id"})
        _task_id(p)
    elif t == encoding.ESCROW_RELEASE:
        _positive(tx)
        _keys(p, {"task_id", "kind"})
        _task_id(p)
        if p["kind"] not in ("reward", "refund"):
            raise Refusal("bad_payload", "payload.kind is 'reward' or 'refund'", "payload")
    elif t == encoding.FEE:
        _positive(tx)
        _keys(p, {"task_id"})
        _task_id(p)
        if tx.recipient != ctx.validator:
            raise Refusal("bad_recipient", "a platform fee goes to the platform account", "to")
    elif t == encoding.REGISTER_WORKER:
        _zero(tx)
        if tx.recipient != tx.sender:
            raise Refusal("bad_recipient", "a worker registers its own address", "to")
        _keys(p, set(), frozenset({"name"}))
        if not isinstance(p.get("name", ""), str) or len(p.get("name", "")) > 100:
            raise Refusal("bad_payload", "payload.name is a string of at most 100 characters", "payload")
    elif t == encoding.SUBMIT_RESULT:
        _zero(tx)
        if tx.recipient != tx.sender:
            raise Refusal("bad_recipient", "a result is addressed to its worker", "to")
        _keys(p, {"compute_result"})
        try:
            result = parsed or encoding.parse_compute_result(p["compute_result"])
        except EncodingError as exc:
            raise Refusal("bad_compute_result", str(exc), "payload") from None
        if result.worker_address != tx.sender:
            raise Refusal("bad_compute_result", "compute_result.worker_address must be the sender", "payload")
        if not signatures_checked and not verify_compute_result(result, tx.public_key):
            raise Refusal("bad_compute_result", "the ComputeResult signature does not verify", "payload")
        return result
    elif t == encoding.REJECT_RESULT:
        _zero(tx)
        if tx.sender != ctx.validator:
            raise Refusal("bad_sender", "only the platform rejects results", "from")
        _keys(p, {"task_id", "worker_address", "reason"})
        _task_id(p)
        if p["worker_address"] != tx.recipient:
            raise Refusal("bad_payload", "payload.worker_address must be the recipient", "payload")
        if not isinstance(p["reason"], str) or len(p["reason"]) > 300:
            raise Refusal("bad_payload", "payload.reason is a string of at most 300 characters", "payload")
    return None


def apply(state: MutableMapping[str, list[int]], tx: Tx, fee_collector: str) -> None:
    """Apply one transaction to ``state`` (address → [balance, nonce]) or raise Refusal
    leaving it unchanged. Deposits create money, payouts and reversals destroy it; everything else
    moves it, fees to the collector. Every address must already be in ``state``."""
    sender = state[tx.sender]
    if tx.nonce != sender[1]:
        raise Refusal("bad_nonce", f"expected nonce {sender[1]}, got {tx.nonce}", "nonce")
    if tx.type == encoding.DEPOSIT:
        sender[1] += 1
        state[tx.recipient][0] += tx.amount
        return
    cost = tx.amount + tx.fee
    if sender[0] < cost:
        raise Refusal("insufficient_funds", f"balance {sender[0]} does not cover amount + fee = {cost}", "amount")
    sender[0] -= cost
    sender[1] += 1
    if tx.type not in (encoding.PAYOUT, encoding.REVERSAL):
        state[tx.recipient][0] += tx.amount
    if tx.fee:
        state[fee_collector][0] += tx.fee


class SignatureChecks:
    """Signature checks of a batch under way (see ``start_signature_checks``)."""

    def __init__(self, size: int, owners: list[tuple[int, str]], verification: batchverify.Verification) -> None:
        self._size = size
        self._owners = owners
        self._verification = verification

    def refusals(self) -> list[Refusal | None]:
        """Per transaction, the Refusal of its first bad signature or None. Blocks
        until every signature of the batch is verified."""
        out: list[Refusal | None] = [None] * self._size
        for (i, what), ok in zip(self._owners, self._verification.result(), strict=True):
            if ok or out[i] is not None:
                continue
            if what == "signature":
                out[i] = Refusal(
                    "bad_signature", "the signature does not verify for this transaction and sender", "signature"
                )
            else:
                out[i] = Refusal("bad_compute_result", "the ComputeResult signature does not verify", "payload")
        return out

    def cancel(self) -> None:
        self._verification.cancel()


def start_signature_checks(
    batch: Sequence[tuple[Tx, bytes, bytes]], parsed_out: list[ComputeResult | None] | None = None
) -> SignatureChecks:
    """Begin verifying the ed25519 signatures of many (tx, signature, encoded tx): the
    transaction's, and for a SUBMIT_RESULT its ComputeResult's. Returns at once (the
    verification pool works meanwhile); ``refusals()`` gives the verdicts. Structure
    errors are left to check_stateless. ``parsed_out``, when given, receives each
    transaction's parsed ComputeResult (or None), to pass on to check_stateless."""
    if parsed_out is not None:
        parsed_out[:] = [None] * len(batch)
    owners: list[tuple[int, str]] = []
    items: list[Item] = []
    for i, (tx, signature, message) in enumerate(batch):
        owners.append((i, "signature"))
        items.append((tx.public_key, message, signature))
        if tx.type == encoding.SUBMIT_RESULT and isinstance(tx.payload, Mapping):
            try:
                result, cr_message = encoding.parse_signed_compute_result(tx.payload.get("compute_result"))
            except EncodingError:
                continue
            if parsed_out is not None:
                parsed_out[i] = result
            owners.append((i, "compute_result"))
            items.append((tx.public_key, cr_message, result.signature))
    return SignatureChecks(len(batch), owners, batchverify.start(items))


def check_signatures(
    batch: Sequence[tuple[Tx, bytes, bytes]], parsed_out: list[ComputeResult | None] | None = None
) -> list[Refusal | None]:
    """start_signature_checks, waiting for the verdicts: per transaction, the Refusal
    of its first bad signature or None."""
    return start_signature_checks(batch, parsed_out).refusals()
