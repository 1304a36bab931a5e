"""Mempool admission: signed transactions in, pending or refused rows out.

``admit`` takes a batch so that a busy platform (or the benchmark) pays one round of
queries per batch, not per transaction: signatures are checked before any lock, the
accounts involved are locked once in address order (the order the sealer locks in too,
so the two never deadlock), and the rows are written with one bulk insert and one bulk
update. ``admit_batches`` runs batch after batch, with the next batch's signatures
verified (in the pool, ledger.batchverify) while this one is written.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections import deque
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from config.celery import enqueue
from ledger import hooks
from ledger.bulk import insert_transactions, taken, update_accounts
from ledger.chain import context
from ledger.models import Account, AccountKind, Transaction, TxStatus, signed_columns
from ledger.rules import ChainContext, Refusal, SignatureChecks, apply, check_stateless, start_signature_checks
from protocol import encoding
from protocol.encoding import ComputeResult, EncodingError, Tx

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


# Transaction(*values) in field order skips Model.__init__'s keyword matching, most of
# the cost of building thousands of rows. The order is read from the model; a field
# added to it without a value in _row fails loudly (KeyError), never silently.
_ROW_FIELDS = tuple(f.attname for f in Transaction._meta.concrete_fields)
_new_row: Callable[..., Transaction] = Transaction  # django-stubs cannot type Model(*args)


def _row(p: _Prepared, status: str, now: datetime) -> Transaction:
    tx = p.sub.tx
    values: dict[str, Any] = {
        "id": None,
        "hash": p.hash,
        **signed_columns(tx),
        "signature": p.sub.signature.hex(),
        "status": status,
        "reason": p.refusal.code if p.refusal else "",
        "reason_detail": p.refusal.detail[:300] if p.refusal else "",
        "reference": p.reference,
        "block_id": None,
        "index_in_block": None,
        "created_at": now,
    }
    row = _new_row(*[values[name] for name in _ROW_FIELDS])
    if p.refusal:
        row.refusal_field = p.refusal.field
    return row


@dataclass
class _Started:
    """A batch whose per-type rules are checked and whose signatures are being verified."""

    prepared: list[_Prepared]
    live: list[int]  # positions of the encodable ones, in the order signatures were sent
    rules: list[Refusal | ComputeResult | None]  # per live one: check_stateless's verdict
    signatures: SignatureChecks


def _start(subs: Sequence[Submission], ctx: ChainContext) -> _Started:
    """Stateless front half of admission: encode each transaction, send every signature
    to be verified in one batch (ledger.batchverify, in the pool when there is one) and,
    while that runs, check the per-type rules, which need neither state nor signatures."""
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
    signatures = start_signature_checks(
        [(prepared[i].sub.tx, prepared[i].sub.signature, messages[i]) for i in live], parsed
    )
    rules: list[Refusal | ComputeResult | None] = []
    for i, result in zip(live, parsed, strict=True):
        sub = prepared[i].sub
        try:
            rules.append(
                check_stateless(sub.tx, sub.signature, ctx, messages[i], signatures_checked=True, parsed=result)
            )
        except Refusal as refusal:
            rules.append(refusal)
    return _Started(prepared, live, rules, signatures)


def _finish(started: _Started) -> list[_Prepared]:
    """Wait for the signature verdicts (a bad signature is the reason given even when a
    rule failed too); then, for what passed both, note the task it concerns and ask
    the assignment hook about a result."""
    prepared = started.prepared
    verdicts = started.signatures.refusals()
    for i, verdict, rule in zip(started.live, verdicts, started.rules, strict=True):
        p = prepared[i]
        if verdict is not None:
            p.refusal = verdict
            continue
        if isinstance(rule, Refusal):
            p.refusal = rule
            continue
        tx = p.sub.tx
        if rule is not None:
            task_id = uuid.UUID(rule.task_id)
            p.task_id = task_id
            p.reference = f"result:{task_id}:{tx.sender}"
            code = hooks.check_assignment(task_id, tx.sender)
            if code is not None:
                p.refusal = Refusal(code, "the assignment check refused this result", "payload")
        elif tx.type in (encoding.ESCROW_LOCK, encoding.ESCROW_RELEASE, encoding.FEE):
            p.task_id = uuid.UUID(tx.payload["task_id"])
    return prepared


def admit(submissions: Sequence[Submission], *, record_refusals: bool = True) -> list[Transaction]:
    """Admit a batch in order. Returns one Transaction per submission: status pending
    when admitted, refused (with ``reason``) otherwise; a refusal changes no balance.

    Refused rows are stored for the explorer when ``record_refusals`` (those whose bytes
    could not even be encoded are returned unsaved). Runs in its own transaction, or in
    the caller's: a service that must fail as a whole calls it inside its own atomic
    block and raises on a refusal.
    """
    ctx = context()
    return _write(_finish(_start(submissions, ctx)), ctx, record_refusals)


def admit_batches(
    batches: Iterable[Sequence[Submission]], *, record_refusals: bool = True
) -> Generator[list[Transaction], None, None]:
    """``admit`` each batch in turn, yielding its rows: the same checks, the same rows
    and one transaction per batch, as if admit were called on each. Faster on a machine
    with a verification pool, which checks the next batch's signatures while this one
    is written (and none of a batch is written before all its signatures verified)."""
    ctx = context()
    source = iter(batches)
    pending: deque[_Started] = deque()
    try:
        first = next(source, None)
        if first is not None:
            pending.append(_start(first, ctx))
        while pending:
            # Queue the next batch's signatures behind this one's before waiting for
            # this one's verdicts, so the pool never runs dry while rows are written.
            following = next(source, None)
            if following is not None:
                pending.append(_start(following, ctx))
            yield _write(_finish(pending.popleft()), ctx, record_refusals)
    finally:
        for started in pending:
            started.signatures.cancel()


def _write(prepared: list[_Prepared], ctx: ChainContext, record_refusals: bool) -> list[Transaction]:
    """The stateful half of admission, in one database transaction: lock the accounts,
    check nonces, balances and duplicates in order, write the rows."""
    now = timezone.now()
    with transaction.atomic():
        live = [p for p in prepared if p.refusal is None]
        # The batch's accounts that exist before it; below, each transaction adds the
        # ones it opens, replaying _create_missing_accounts' pass step by step, so a
        # sender counts only from the transaction that opened its account on.
        opened = _create_missing_accounts(live)
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
                _open_accounts(p.sub.tx, opened)
                try:
                    _check_stateful(p, accounts, opened, taken_hashes, taken_refs)
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


def _check_stateful(
    p: _Prepared, accounts: dict[str, Account], opened: set[str], taken_hashes: set[str], taken_refs: set[str]
) -> None:
    """The checks that need state, against the accounts as they stand at this point of
    the batch: ``opened`` holds the addresses that have an account by now."""
    tx = p.sub.tx
    if p.hash in taken_hashes:
        raise Refusal("duplicate", "this transaction was already admitted", "hash")
    if p.reference and p.reference in taken_refs:
        if tx.type == encoding.SUBMIT_RESULT:
            raise Refusal("result_already_submitted", "this worker already submitted a result for this task", "payload")
        raise Refusal("duplicate_reference", f"reference {p.reference!r} was already used", "reference")
    sender = accounts.get(tx.sender) if tx.sender in opened else None
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


def _open_accounts(tx: Tx, opened: set[str]) -> None:
    """Add to ``opened`` the accounts admitting ``tx`` opens, whether or not it is then
    admitted: an unseen recipient of a sender that has an account (receiving needs no
    sign-up), and a registering worker. Run over a batch in order, as admission checks
    it, so that a batch opens the same accounts, at the same points, as its transactions
    admitted one at a time: an account a transaction opens is there for the ones after
    it, never for the ones before."""
    if tx.type == encoding.REGISTER_WORKER:
        opened.add(tx.sender)
    if tx.sender in opened:
        opened.add(tx.recipient)


def _create_missing_accounts(live: list[_Prepared]) -> set[str]:
    """Create the empty worker accounts the batch opens (see ``_open_accounts``), before
    any lock is taken; return the addresses of the batch that had an account before it.
    ignore_conflicts makes concurrent creation harmless. An empty row (zero balance,
    zero nonce) may outlive a refusal; it holds and proves nothing. A stranger's refused
    transaction leaves no row behind."""
    involved = {a for p in live for a in (p.sub.tx.sender, p.sub.tx.recipient)}
    existing = set(Account.objects.filter(address__in=involved).values_list("address", flat=True))
    opened = set(existing)
    for p in live:
        _open_accounts(p.sub.tx, opened)
    missing = opened - existing
    if missing:
        Account.objects.bulk_create(
            [Account(address=a, kind=AccountKind.WORKER) for a in sorted(missing)], ignore_conflicts=True
        )
    return existing


def _maybe_trigger_sealer() -> None:
    """Queue a sealer run at once when the mempool has grown past its trigger size."""
    pending = Transaction.objects.filter(status=TxStatus.PENDING).count()
    if pending < settings.LEDGER_MEMPOOL_SEAL_TRIGGER:
        return
    try:
        enqueue("ledger.tasks.seal_pending")
    except Exception:  # the periodic beat seals anyway; a broker hiccup must not fail admission
        log.exception("could not queue an early sealer run")
