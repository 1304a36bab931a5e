"""What other apps ask of the ledger. Each function is atomic and, where it takes a
``reference``, idempotent: calling it again with the same reference returns the first
result and moves nothing.

Locks: every function locks every account its transaction touches (the platform
account only when it collects a fee) with select_for_update in address order (the order admission and the sealer
use too, so they never deadlock), inside its own transaction; callers may wrap it in
theirs (the marketplace locks escrow in the same transaction that opens a task).
Money moves in ``available`` at once and in the sealed ``balance`` when the next block
is sealed (see ledger/models.py).

Debt: a refund or dispute that finds the credits it burns escrowed or spent leaves the
rest as the account's ``owed`` (``reverse_deposit``). Whatever then arrives at the account
(a DEPOSIT, an escrow refund, a transfer) pays the debt first: ``_send`` and
``submit_transaction`` end with ``_pay_debt``, which burns up to the debt with a REVERSAL
in the same transaction, so those credits are never spendable. A debtor may not open tasks
nor be paid out (``check_not_owing``).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q, Sum

from ledger import custody, gas
from ledger.chain import context
from ledger.mempool import Submission, admit
from ledger.models import Account, AccountKind, Transaction, TxStatus
from ledger.sealer import ensure_system_accounts
from ledger.units import format_credits
from protocol import encoding, keys
from protocol.bech32 import AddressError, normalize_address
from protocol.encoding import Tx
from protocol.signing import sign_tx


class LedgerError(Exception):
    """A ledger operation was refused. ``code`` is the refusal code, ``field`` the
    argument or transaction field at fault (for a 4xx naming it)."""

    def __init__(self, code: str, message: str, field: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.field = field


class InsufficientFunds(LedgerError):
    """The account cannot cover the amount (plus fee)."""


class Owes(LedgerError):
    """The account owes the platform credits (``Account.owed``): refused until it is paid."""


def _check_amount(amount: int, field: str = "amount") -> None:
    if type(amount) is not int or amount <= 0 or amount > encoding.MAX_UINT:
        raise LedgerError("bad_amount", "The amount must be a positive whole number of base units.", field)


def _existing(reference: str) -> Transaction | None:
    return Transaction.objects.filter(reference=reference).exclude(status=TxStatus.REFUSED).first()


def find_by_reference(reference: str) -> Transaction | None:
    """The admitted (pending or sealed) transaction made with this reference, if any."""
    return _existing(reference)


def _custodial_pair(account: Account) -> keys.KeyPair:
    if account.encrypted_key is None:
        raise LedgerError("not_custodial", f"The platform holds no key for {account.address}.")
    return keys.from_seed(custody.decrypt_seed(bytes(account.encrypted_key)))


def _send(
    account: Account, pair: keys.KeyPair, tx_type: str, to: str, amount: int, payload: dict[str, Any], reference: str
) -> Transaction:
    """Sign and admit one transaction from a locked account; raise on refusal."""
    ctx = context()
    gas_price = ctx.min_gas_price
    unsigned = Tx(
        chain_id=ctx.chain_id,
        type=tx_type,
        sender=account.address,
        recipient=to,
        amount=amount,
        fee=gas.fee_for(tx_type, gas_price),
        nonce=account.next_nonce,
        gas_price=gas_price,
        gas_limit=gas.gas_limit(tx_type),
        payload=payload,
    )
    signed, signature = sign_tx(unsigned, pair)
    (row,) = admit([Submission(signed, signature, reference)], record_refusals=False)
    if row.status == TxStatus.REFUSED:
        cls = InsufficientFunds if row.reason == "insufficient_funds" else LedgerError
        raise cls(row.reason, row.reason_detail or row.reason, "amount" if row.reason == "insufficient_funds" else "")
    account.refresh_from_db(fields=["available", "next_nonce"])
    if amount:
        _pay_debt(to, row.hash)
    return row


def _pay_debt(address: str, arrival: str) -> Transaction | None:
    """Credits just arrived at ``address`` (transaction hash ``arrival``): if it is a user
    account that owes, burn up to the debt with a REVERSAL at once and lower the debt by
    as much, so the arriving credits never become spendable. The one place debt is paid.
    Locks the account and the treasury in address order; a caller that holds other rows
    has locked the treasury already when the account owes (``_treasury_if_owing``)."""
    if not Account.objects.filter(address=address, kind=AccountKind.USER, owed__gt=0).exists():
        return None
    treasury = custody.treasury_keys().address
    with transaction.atomic():
        account = _lock_accounts(address, treasury)[address]
        take = min(account.owed, account.available)
        if take <= 0:
            return None
        reference = f"debt:{arrival}"
        payload = {"reference": reference, "reason": "debt"}
        row = _send(account, _custodial_pair(account), encoding.REVERSAL, treasury, take, payload, reference)
        Account.objects.filter(pk=account.pk).update(owed=F("owed") - take)
        return row


def _treasury_if_owing(*addresses: str) -> list[str]:
    """The treasury's address when one of ``addresses`` is a user account that owes: a
    caller about to credit it locks the treasury with its other rows, in address order,
    for the REVERSAL that pays the debt (``_pay_debt``)."""
    if Account.objects.filter(address__in=addresses, kind=AccountKind.USER, owed__gt=0).exists():
        return [custody.treasury_keys().address]
    return []


def _ensure_receivers(*addresses: str) -> None:
    """Create the empty account of a recipient the ledger has never seen, before any lock
    is taken: creating it later, while holding other rows, could wait on a concurrent
    creator that waits on us."""
    existing = set(Account.objects.filter(address__in=addresses).values_list("address", flat=True))
    missing = sorted(set(addresses) - existing)
    if missing:
        Account.objects.bulk_create(
            [Account(address=a, kind=AccountKind.WORKER) for a in missing], ignore_conflicts=True
        )


def _lock_accounts(*addresses: str, fee: bool = False) -> dict[str, Account]:
    """Lock these accounts (and, when a fee will be paid, the platform's) in address
    order: the order admission and the sealer lock in, so two of them never wait on each
    other in a cycle. Admission then re-locks them for free (same transaction)."""
    wanted = sorted({*addresses, *([custody.validator_keys().address] if fee else [])})
    return {a.address: a for a in Account.objects.select_for_update().filter(address__in=wanted).order_by("address")}


def lock_task_accounts(task_id: uuid.UUID, *addresses: str) -> None:
    """Lock, in one statement and in address order, every account that settling the task
    can touch: its escrow, the escrow's owner (a refund), the platform account (fees and
    REJECT_RESULT) and ``addresses`` (the worker). A caller that moves money in several
    steps (pay, admit the worker's transaction, refund) calls this first, so the steps
    re-lock rows it already holds and it never holds one account while waiting for a
    lower one, which a sealer locking the same accounts in address order would deadlock
    against. Unseen ``addresses`` get empty accounts first (see ``_ensure_receivers``)."""
    ensure_system_accounts()
    escrow = escrow_account(task_id)
    wanted = [*addresses, context().validator]
    if escrow is not None:
        wanted.append(escrow.address)
        if escrow.user_id is not None:
            wanted.extend(
                Account.objects.filter(user_id=escrow.user_id, kind=AccountKind.USER).values_list("address", flat=True)
            )
    wanted.extend(_treasury_if_owing(*wanted))
    _ensure_receivers(*addresses)
    _lock_accounts(*wanted)


def ensure_user_account(user: Any) -> Account:
    """The user's custodial account, created with a fresh key pair on first call.
    Call at sign-up; every other service calls it too, so it is never missing."""
    account = Account.objects.owned_by(user).filter(kind=AccountKind.USER).first()
    if account is not None:
        return account
    pair = keys.generate()
    with transaction.atomic():
        account, _ = Account.objects.get_or_create(
            user=user,
            kind=AccountKind.USER,
            defaults={
                "address": pair.address,
                "public_key": pair.public_key.hex(),
                "encrypted_key": custody.encrypt_seed(pair.seed),
            },
        )
    return account


def deposit(user: Any, amount: int, reference: str) -> Transaction:
    """Credit ``amount`` base units to the user (money entering: Stripe, or ``mint``).
    Signed by the treasury. Idempotent per reference."""
    _check_amount(amount)
    account = ensure_user_account(user)
    ensure_system_accounts()
    treasury_pair = custody.treasury_keys()
    with transaction.atomic():
        treasury = _lock_accounts(treasury_pair.address, account.address)[treasury_pair.address]
        existing = _existing(reference)
        if existing is not None:
            return existing
        return _send(
            treasury,
            treasury_pair,
            encoding.DEPOSIT,
            account.address,
            amount,
            {"reference": reference[:200]},
            reference,
        )


def escrow_account(task_id: uuid.UUID) -> Account | None:
    return Account.objects.filter(kind=AccountKind.ESCROW, reference=task_id).first()


def lock_escrow(task_id: uuid.UUID, owner: Any, amount: int, reference: str) -> Transaction:
    """Move ``amount`` from the owner's account into the task's escrow account (created
    on first lock). Raises InsufficientFunds, changing nothing, when the owner's
    available balance does not cover it. Idempotent per reference; 100 concurrent calls
    against one account serialise on its row lock and never overdraw it."""
    _check_amount(amount)
    task_id = uuid.UUID(str(task_id))
    account = ensure_user_account(owner)
    with transaction.atomic():
        known = escrow_account(task_id)
        account = _lock_accounts(account.address, *([known.address] if known else []))[account.address]
        existing = _existing(reference)
        if existing is not None:
            return existing
        escrow = escrow_account(task_id)
        if escrow is None:
            pair = keys.generate()
            escrow = Account.objects.create(
                address=pair.address,
                kind=AccountKind.ESCROW,
                public_key=pair.public_key.hex(),
                encrypted_key=custody.encrypt_seed(pair.seed),
                user=owner,
                reference=task_id,
            )
        elif escrow.user_id != account.user_id:
            raise LedgerError("not_escrow", "This task's escrow belongs to another user.", "task_id")
        payload = {"task_id": str(task_id)}
        return _send(
            account, _custodial_pair(account), encoding.ESCROW_LOCK, escrow.address, amount, payload, reference
        )


def release_to_worker(
    task_id: uuid.UUID, worker_address: str, amount: int, reference: str, *, fee: int | None = None
) -> Transaction:
    """Pay a job out of the task's escrow: ``amount`` to the worker as ESCROW_RELEASE and
    ``fee`` on top to the platform account as a FEE transaction (the market's terms:
    marketplace/pricing.py). With ``fee`` None (a job offered before the market), the
    platform's share (LEDGER_PLATFORM_FEE_BPS) comes out of ``amount`` instead. Returns
    the release. Idempotent per reference."""
    _check_amount(amount)
    if fee is not None and fee < 0:
        raise LedgerError("bad_amount", "A fee is not negative.", "fee")
    try:
        worker_address = normalize_address(worker_address)
    except AddressError as exc:
        raise LedgerError("bad_address", str(exc), "worker_address") from None
    with transaction.atomic():
        escrow = escrow_account(task_id)
        if escrow is None:
            raise LedgerError("no_escrow", "This task has no escrow.", "task_id")
        _ensure_receivers(worker_address)
        escrow = _lock_accounts(escrow.address, worker_address, context().validator)[escrow.address]
        existing = _existing(reference)
        if existing is not None:
            return existing
        fee_share = amount * settings.LEDGER_PLATFORM_FEE_BPS // 10_000 if fee is None else fee
        paid = amount - fee_share if fee is None else amount
        if paid + fee_share > escrow.available:
            raise InsufficientFunds(
                "insufficient_funds", f"The escrow holds {escrow.available} units, not {paid + fee_share}.", "amount"
            )
        pair = _custodial_pair(escrow)
        payload = {"task_id": str(task_id), "kind": "reward"}
        release = _send(escrow, pair, encoding.ESCROW_RELEASE, worker_address, paid, payload, reference)
        if fee_share:
            _send(
                escrow,
                pair,
                encoding.FEE,
                context().validator,
                fee_share,
                {"task_id": str(task_id)},
                f"{reference}:fee",
            )
        return release


def refund(task_id: uuid.UUID, reference: str) -> Transaction | None:
    """Return whatever is left in the task's escrow to its owner. None when nothing is
    left (or the task never had escrow). Idempotent per reference."""
    with transaction.atomic():
        escrow = escrow_account(task_id)
        if escrow is None or escrow.user_id is None:
            return None
        owner = Account.objects.get(user_id=escrow.user_id, kind=AccountKind.USER)
        escrow = _lock_accounts(escrow.address, owner.address, *_treasury_if_owing(owner.address))[escrow.address]
        existing = _existing(reference)
        if existing is not None:
            return existing
        if escrow.available == 0:
            return None
        payload = {"task_id": str(task_id), "kind": "refund"}
        return _send(
            escrow,
            _custodial_pair(escrow),
            encoding.ESCROW_RELEASE,
            owner.address,
            escrow.available,
            payload,
            reference,
        )


def payout(user: Any, amount: int, reference: str) -> Transaction:
    """Take ``amount`` out of the ledger for the user (money leaving: bank payout).
    The user also pays the PAYOUT gas fee. Idempotent per reference."""
    _check_amount(amount)
    account = ensure_user_account(user)
    ensure_system_accounts()
    to = custody.treasury_keys().address
    with transaction.atomic():
        account = _lock_accounts(account.address, to, fee=True)[account.address]
        existing = _existing(reference)
        if existing is not None:
            return existing
        return _send(
            account, _custodial_pair(account), encoding.PAYOUT, to, amount, {"reference": reference[:200]}, reference
        )


def reverse_deposit(user: Any, amount: int, reference: str, reason: str) -> Transaction | None:
    """Burn up to ``amount`` of the user's credits because the card payment that bought
    them was refunded or disputed (money leaving, as with a payout, but without gas: the
    platform sends it, not the user). Takes what is available; the rest, escrowed or
    spent already, becomes the account's debt (``owed``), which credits arriving later pay
    first. Returns the REVERSAL, or None when nothing was available. Idempotent per
    reference when a REVERSAL was made; the caller records each claim once."""
    _check_amount(amount)
    account = ensure_user_account(user)
    ensure_system_accounts()
    to = custody.treasury_keys().address
    with transaction.atomic():
        account = _lock_accounts(account.address, to)[account.address]
        existing = _existing(reference)
        if existing is not None:
            return existing
        take = min(amount, account.available)
        if take < amount:
            Account.objects.filter(pk=account.pk).update(owed=F("owed") + (amount - take))
        if take <= 0:
            return None
        payload = {"reference": reference[:200], "reason": reason[:100]}
        return _send(account, _custodial_pair(account), encoding.REVERSAL, to, take, payload, reference)


def forgive_debt(user: Any, amount: int) -> int:
    """Forget up to ``amount`` of what the user's account owes (a dispute the platform won
    claims nothing any more). Returns how much was forgotten; the caller gives back, as a
    DEPOSIT, the part of its claim that was paid already."""
    _check_amount(amount)
    account = ensure_user_account(user)
    with transaction.atomic():
        account = _lock_accounts(account.address)[account.address]
        forgiven = min(amount, account.owed)
        if forgiven:
            Account.objects.filter(pk=account.pk).update(owed=F("owed") - forgiven)
        return forgiven


def owed(user: Any) -> int:
    """What the user's account owes the platform, base units (0 when nothing)."""
    return Account.objects.owned_by(user).filter(kind=AccountKind.USER).values_list("owed", flat=True).first() or 0


def check_not_owing(user: Any, action: str) -> None:
    """Raise Owes, naming the debt, when the user's account owes credits: a debtor may
    not ``action`` (open a task, be paid out) until credits it receives have paid it."""
    debt = owed(user)
    if debt:
        raise Owes(
            "owes_debt",
            f"Your account owes {format_credits(debt)} credits from a refunded or disputed purchase; "
            f"you cannot {action} until it is paid. Credits you buy or get back from escrow pay it first.",
            "account",
        )


def transfer(user: Any, to_address: str, amount: int, reference: str) -> Transaction:
    """Send ``amount`` from the user's account to any address; the user pays the
    TRANSFER gas fee. Idempotent per reference."""
    _check_amount(amount)
    try:
        to_address = normalize_address(to_address)
    except AddressError as exc:
        raise LedgerError("bad_address", str(exc), "to") from None
    account = ensure_user_account(user)
    with transaction.atomic():
        _ensure_receivers(to_address)
        account = _lock_accounts(account.address, to_address, *_treasury_if_owing(to_address), fee=True)[
            account.address
        ]
        existing = _existing(reference)
        if existing is not None:
            return existing
        return _send(account, _custodial_pair(account), encoding.TRANSFER, to_address, amount, {}, reference)


def reject_result(task_id: uuid.UUID, worker_address: str, reason: str, reference: str) -> Transaction:
    """Record on the chain that the platform rejected a worker's result. Idempotent."""
    try:
        worker_address = normalize_address(worker_address)
    except AddressError as exc:
        raise LedgerError("bad_address", str(exc), "worker_address") from None
    ensure_system_accounts()
    pair = custody.validator_keys()
    with transaction.atomic():
        _ensure_receivers(worker_address)
        platform = _lock_accounts(pair.address, worker_address)[pair.address]
        existing = _existing(reference)
        if existing is not None:
            return existing
        payload = {"task_id": str(task_id), "worker_address": worker_address, "reason": reason[:300]}
        return _send(platform, pair, encoding.REJECT_RESULT, worker_address, 0, payload, reference)


def submit_transaction(tx: Tx, signature: bytes, reference: str | None = None) -> Transaction:
    """Admit a transaction a worker signed itself (REGISTER_WORKER, SUBMIT_RESULT,
    TRANSFER, …). Returns the row, pending or refused with its reason code: the caller
    turns a refusal into a 4xx. Sending the same signed transaction again returns the
    first row. A SUBMIT_RESULT's reference is always ``result:<task>:<worker>`` (one
    accepted result per task and worker), whatever ``reference`` says."""
    ensure_system_accounts()
    try:
        existing = Transaction.objects.filter(hash=tx.hash().hex()).exclude(status=TxStatus.REFUSED).first()
    except encoding.EncodingError:
        existing = None  # admit() refuses it with the field named
    if existing is not None and existing.signature == signature.hex():
        return existing  # the same signed transaction again: idempotent
    (row,) = admit([Submission(tx, signature, reference)])
    if row.status != TxStatus.REFUSED and row.amount:
        _pay_debt(row.recipient, row.hash)
    return row


def next_nonce(address: str) -> int:
    """The nonce the next transaction from ``address`` must carry (0 for a new one)."""
    return Account.objects.filter(address=address).values_list("next_nonce", flat=True).first() or 0


def address_balance(address: str) -> int:
    """What ``address`` can spend now, in base units (pending transactions included);
    0 for an address the ledger has never seen."""
    return Account.objects.filter(address=address).values_list("available", flat=True).first() or 0


def balance(user: Any) -> int:
    """What the user can spend now, in base units (pending transactions included)."""
    return Account.objects.owned_by(user).filter(kind=AccountKind.USER).values_list("available", flat=True).first() or 0


def escrowed(user: Any) -> int:
    """Units the user has locked in the escrow of their tasks, not yet released."""
    total = Account.objects.owned_by(user).filter(kind=AccountKind.ESCROW).aggregate(s=Sum("available"))["s"]
    return int(total or 0)


def task_transactions(task_id: uuid.UUID, worker_addresses: Sequence[str] = ()) -> list[Transaction]:
    """Every admitted transaction of one task, oldest first: the escrow lock, the results
    and rejections of the given workers, the rewards, the platform's fee and the refund.
    Every condition is an equality on an indexed column (the ledger knows no assignments:
    the caller names the workers)."""
    matches = Q(reference__in=[f"result:{task_id}:{address}" for address in worker_addresses]) | Q(
        type=encoding.REJECT_RESULT, recipient__in=list(worker_addresses), payload__task_id=str(task_id)
    )
    escrow = escrow_account(task_id)
    if escrow is not None:
        matches |= Q(sender=escrow.address) | Q(recipient=escrow.address)
    rows = Transaction.objects.exclude(status=TxStatus.REFUSED).filter(matches).select_related("block")
    return list(rows.order_by("id"))
