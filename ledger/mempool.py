"""Mempool admission: signed transactions in, pending or refused rows out.

``admit`` takes a batch so that a busy platform (or the benchmark) pays one round of
queries per batch, not per transaction: signatures are checked before any lock, the
accounts involved are locked once in address order (the order the sealer locks in too,
so the two never deadlock), and the rows are written with one bulk insert and one bulk
update.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from ledger import encoding, hooks
from ledger.bulk import insert_transactions, taken, update_accounts
from ledger.chain import context
from ledger.encoding import ComputeResult, EncodingError, Tx
from ledger.models import Account, AccountKind, Transaction, TxStatus
from ledger.rules import ChainContext, Refusal, apply, check_signatures, check_stateless

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Submission:
    """A signed transaction offered to the mempool, with an optional idempotency key."""

    tx: Tx
    signature: bytes
    reference: str | None = None


@dataclass
class _Prepared:
    sub: Submission
    hash: str
    reference: str | None
    refusal: Refusal | None = None
    task_id: uuid.UUID | None = None


def _row(p: _Prepared, status: str, now: datetime) -> Transaction:
    tx = p.sub.tx
    return Transaction(
        hash=p.hash,
        chain_id=tx.chain_id,
        type=tx.type,
        sender=tx.sender,
        recipient=tx.recipient,
        amount=tx.amount,
        fee=tx.fee,
        nonce=tx.nonce,
        gas_price=tx.gas_price,
        gas_limit=tx.gas_limit,
        payload=dict(tx.payload),
        public_key=tx.public_key.hex(),
        signature=p.sub.signature.hex(),
        status=status,
        reason=p.refusal.code if p.refusal else "",
        reason_detail=p.refusal.detail[:300] if p.refusal else "",
        reference=p.reference,
        created_at=now,
    )


def _prepare_all(subs: Sequence[Submission], ctx: ChainContext) -> list[_Prepared]:
    """Stateless checks of a batch: encoding, then every signature in one batch
    (ledger.batchverify), then the per-type rules and the assignment hook."""
    prepared: list[_Prepared] = []
    messages: list[bytes] = []
    for sub in subs:
        try:
            message = sub.tx.encode()
        except EncodingError as exc:
            refusal = Refusal("bad_encoding", str(exc), exc.field.split(".")[0])
            prepared.append(_Prepared(sub, "", sub.reference, refusal))
            messages.append(b"")
            continue
        prepared.append(_Prepared(sub, hashlib.sha256(message).hexdigest(), sub.reference))
        messages.append(message)
    live = [i for i, p in enumerate(prepared) if p.refusal is None]
    parsed: list[ComputeResult | None] = []
    verdicts = check_signatures([(prepared[i].sub.tx, prepared[i].sub.signature, messages[i]) for i in live], parsed)
    for i, verdict, result in zip(live, verdicts, parsed, strict=True):
        p = prepared[i]
        p.refusal = verdict
        if verdict is None:
            _check_one(p, ctx, messages[i], result)
    return prepared


def _check_one(p: _Prepared, ctx: ChainContext, message: bytes, parsed: ComputeResult | None) -> None:
    sub = p.sub
    try:
        result = check_stateless(sub.tx, sub.signature, ctx, message, signatures_checked=True, parsed=parsed)
        if result is not None:
            task_id = uuid.UUID(result.task_id)
            p.task_id = task_id
            p.reference = f"result:{task_id}:{sub.tx.sender}"
            code = hooks.check_assignment(task_id, sub.tx.sender)
            if code is not None:
                raise Refusal(code, "the assignment check refused this result", "payload")
        elif sub.tx.type in (encoding.ESCROW_LOCK, encoding.ESCROW_RELEASE, encoding.FEE):
            p.task_id = uuid.UUID(sub.tx.payload["task_id"])
    except Refusal as refusal:
        p.refusal = refusal


def admit(submissions: Sequence[Submission], *, record_refusals: bool = True) -> list[Transaction]:
    """Admit a batch in order. Returns one Transaction per submission: status pending
    when admitted, refused (with ``reason``) otherwise; a refusal changes no balance.

    Refused rows are stored for the explorer when ``record_refusals`` (those whose bytes
    could not even be encoded are returned unsaved). Runs in its own transaction, or in
    the caller's: a service that must fail as a whole calls it inside its own atomic
    block and raises on a refusal.
    """
    ctx = context()
    prepared = _prepare_all(submissions, ctx)
    now = timezone.now()
    with transaction.atomic():
        live = [p for p in prepared if p.refusal is None]
        _create_missing_accounts(live)
        # The platform account (fee collector) is locked only when a fee is paid: it is
        # the one row every fee-paying transaction shares.
        collector = {ctx.validator} if any(p.sub.tx.fee for p in live) else set()
        addresses = sorted({a for p in live for a in (p.sub.tx.sender, p.sub.tx.recipient)} | collector)
        accounts = {
            a.address: a for a in Account.objects.select_for_update().filter(address__in=addresses).order_by("address")
        }
        hashes = [p.hash for p in live]
        refs = [p.reference for p in live if p.reference]
        taken_hashes = taken("hash", hashes)
        taken_refs = taken("reference", refs)
        state = {addr: [a.available, a.next_nonce] for addr, a in accounts.items()}
        touched: set[str] = set()
        rows: list[Transaction] = []
        for p in prepared:
            if p.refusal is None:
                try:
                    _check_stateful(p, accounts, taken_hashes, taken_refs)
                    apply(state, p.sub.tx, ctx.validator)
                except Refusal as refusal:
                    p.refusal = refusal
            if p.refusal is None:
                tx = p.sub.tx
                taken_hashes.add(p.hash)
                if p.reference:
                    taken_refs.add(p.reference)
                touched.update((tx.sender, tx.recipient))
                if tx.fee:
                    touched.add(ctx.validator)
                sender = accounts[tx.sender]
                if not sender.public_key:
                    sender.public_key = tx.public_key.hex()
                    if tx.type == encoding.REGISTER_WORKER:
                        sender.kind = AccountKind.WORKER
                rows.append(_row(p, TxStatus.PENDING, now))
            else:
                rows.append(_row(p, TxStatus.REFUSED, now))
        to_save = [r for r in rows if r.status == TxStatus.PENDING or (record_refusals and r.hash)]
        insert_transactions(to_save)
        changed = []
        for address in touched:
            account = accounts[address]
            account.available, account.next_nonce = state[address]
            changed.append(account)
        update_accounts(changed, ["available", "next_nonce", "public_key", "kind"])
        admitted = sum(1 for r in rows if r.status == TxStatus.PENDING)
        if admitted:
            transaction.on_commit(_maybe_trigger_sealer)
    return rows


def _check_stateful(p: _Prepared, accounts: dict[str, Account], taken_hashes: set[str], taken_refs: set[str]) -> None:
    tx = p.sub.tx
    if p.hash in taken_hashes:
        raise Refusal("duplicate", "this transaction was already admitted", "hash")
    if p.reference and p.reference in taken_refs:
        if tx.type == encoding.SUBMIT_RESULT:
            raise Refusal("result_already_submitted", "this worker already submitted a result for this task", "payload")
        raise Refusal("duplicate_reference", f"reference {p.reference!r} was already used", "reference")
    sender = accounts.get(tx.sender)
    if sender is None:
        raise Refusal("unknown_sender", "no account has this address; it holds nothing", "from")
    if sender.public_key and sender.public_key != tx.public_key.hex():
        raise Refusal("bad_signature", "the account is bound to another public key", "public_key")
    if tx.type == encoding.REGISTER_WORKER and sender.kind != AccountKind.WORKER:
        raise Refusal("not_a_worker", f"a {sender.kind} account cannot register as a worker", "from")
    if tx.type == encoding.ESCROW_LOCK:
        escrow = accounts[tx.recipient]
        if escrow.kind != AccountKind.ESCROW or escrow.reference != p.task_id:
            raise Refusal("not_escrow", "the recipient is not this task's escrow account", "to")
    elif tx.type in (encoding.ESCROW_RELEASE, encoding.FEE) and (
        sender.kind != AccountKind.ESCROW or sender.reference != p.task_id
    ):
        raise Refusal("not_escrow", "the sender is not this task's escrow account", "from")


def _create_missing_accounts(live: list[_Prepared]) -> None:
    """Receiving needs no sign-up: an unseen recipient (or a registering worker) gets an
    empty worker account. ignore_conflicts makes concurrent creation harmless. An empty
    row (zero balance, zero nonce) may outlive a refusal; it holds and proves nothing."""
    involved = {a for p in live for a in (p.sub.tx.sender, p.sub.tx.recipient)}
    existing = set(Account.objects.filter(address__in=involved).values_list("address", flat=True))
    # Only for a sender that exists (or is registering): a stranger's refused transaction
    # must not leave rows behind.
    wanted = {p.sub.tx.recipient for p in live if p.sub.tx.sender in existing}
    wanted |= {p.sub.tx.sender for p in live if p.sub.tx.type == encoding.REGISTER_WORKER}
    missing = wanted - existing
    if missing:
        Account.objects.bulk_create(
            [Account(address=a, kind=AccountKind.WORKER) for a in sorted(missing)], ignore_conflicts=True
        )


def _maybe_trigger_sealer() -> None:
    """Queue a sealer run at once when the mempool has grown past its trigger size."""
    pending = Transaction.objects.filter(status=TxStatus.PENDING).count()
    if pending < settings.LEDGER_MEMPOOL_SEAL_TRIGGER:
        return
    from ledger.tasks import seal_pending

    try:
        seal_pending.delay()
    except Exception:  # the periodic beat seals anyway; a broker hiccup must not fail admission
        log.exception("could not queue an early sealer run")
