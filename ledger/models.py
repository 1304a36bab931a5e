"""The book of record: accounts, transactions and blocks.

Balances move at sealing. Each account carries two views of itself:
``balance``/``nonce`` are the sealed state (what the chain proves, what state_root
commits to, what ``verify_chain`` replays) and ``available``/``next_nonce`` are the
state after every admitted transaction, sealed or still pending (what admission checks
spending against). Admission writes only the second pair, sealing only the first, and
both apply the same rules (ledger/rules.py) in the same order, so a transaction that
was admissible stays valid when it is sealed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from operator import attrgetter
from typing import Any, ClassVar

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from config.owned import OwnedQuerySet
from protocol import encoding

HASH_LENGTH = 64  # hex of 32 bytes
ADDRESS_LENGTH = 90


class AccountKind(models.TextChoices):
    USER = "user", "User"
    TREASURY = "treasury", "Treasury"
    ESCROW = "escrow", "Escrow"
    WORKER = "worker", "Worker"
    PLATFORM = "platform", "Platform"


class AccountQuerySet(OwnedQuerySet["Account"]):
    owner_field = "user"


class Account(models.Model):
    """One address on the ledger and its balance, in base units (1 credit = 10^9)."""

    Kind = AccountKind

    address = models.CharField(max_length=ADDRESS_LENGTH, unique=True)
    kind = models.CharField(max_length=16, choices=AccountKind.choices)
    public_key = models.CharField(max_length=64, blank=True, help_text="hex; empty until the key is seen")
    # Custodial accounts only (users, escrow): the Fernet-encrypted ed25519 seed.
    # Workers hold their own keys and this stays null.
    encrypted_key = models.BinaryField(null=True, blank=True, editable=False)
    balance = models.BigIntegerField(default=0, help_text="Sealed balance, base units.")
    nonce = models.BigIntegerField(default=0, help_text="Sealed transactions sent.")
    available = models.BigIntegerField(default=0, help_text="Balance after pending transactions.")
    next_nonce = models.BigIntegerField(default=0, help_text="Nonce the next transaction must carry.")
    # Off the chain: the platform's claim on a user account, not part of its state.
    owed = models.BigIntegerField(
        default=0,
        help_text="Debt, base units: credits a refunded or disputed purchase should have burnt but that were "
        "escrowed or spent. Credits arriving at the account pay it first.",
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="ledger_accounts"
    )
    # The task an escrow account holds money for. A plain UUID: the ledger knows nothing of tasks.
    reference = models.UUIDField(null=True, blank=True, db_index=True)
    created_at = models.DateTimeField(default=timezone.now)

    objects: ClassVar[AccountQuerySet] = AccountQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        ordering = ["address"]
        constraints = [
            models.CheckConstraint(condition=Q(balance__gte=0), name="ledger_account_balance_non_negative"),
            models.CheckConstraint(condition=Q(available__gte=0), name="ledger_account_available_non_negative"),
            models.CheckConstraint(condition=Q(owed__gte=0), name="ledger_account_owed_non_negative"),
            models.UniqueConstraint(fields=["user"], condition=Q(kind="user"), name="ledger_one_user_account_per_user"),
            models.UniqueConstraint(
                fields=["reference"], condition=Q(kind="escrow"), name="ledger_one_escrow_per_task"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.address}"


class Block(models.Model):
    """A sealed block: its header, the validator's signature over it, and its hash."""

    height = models.BigIntegerField(unique=True)
    hash = models.CharField(max_length=HASH_LENGTH, unique=True)
    prev_hash = models.CharField(max_length=HASH_LENGTH)
    timestamp = models.DateTimeField()
    chain_id = models.CharField(max_length=64)
    proposer = models.CharField(max_length=ADDRESS_LENGTH)
    proposer_key = models.CharField(max_length=64)
    tx_root = models.CharField(max_length=HASH_LENGTH)
    compute_root = models.CharField(max_length=HASH_LENGTH)
    state_root = models.CharField(max_length=HASH_LENGTH)
    tx_count = models.IntegerField()
    gas_used = models.BigIntegerField()
    signature = models.CharField(max_length=128)

    class Meta:
        ordering = ["-height"]

    def __str__(self) -> str:
        return f"block {self.height}"

    def header(self) -> encoding.Header:
        return encoding.Header(
            height=self.height,
            prev_hash=bytes.fromhex(self.prev_hash),
            timestamp_us=timestamp_us(self.timestamp),
            chain_id=self.chain_id,
            proposer=self.proposer,
            proposer_key=bytes.fromhex(self.proposer_key),
            tx_root=bytes.fromhex(self.tx_root),
            compute_root=bytes.fromhex(self.compute_root),
            state_root=bytes.fromhex(self.state_root),
            tx_count=self.tx_count,
            gas_used=self.gas_used,
        )


def timestamp_us(moment: object) -> int:
    """Microseconds since the epoch: the exact form both databases store."""
    from datetime import datetime

    assert isinstance(moment, datetime)
    delta = moment - datetime(1970, 1, 1, tzinfo=moment.tzinfo)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


# The Transaction columns that store a transaction's signed fields: protocol.encoding.Tx's
# fields, in its order and under its names. Only public_key is stored in another form (hex).
SIGNED_COLUMNS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(encoding.Tx))


def tx_from_columns(values: Iterable[Any]) -> encoding.Tx:
    """The Tx whose SIGNED_COLUMNS hold ``values``, in that order. ValueError when the
    public key is not hex."""
    fields = dict(zip(SIGNED_COLUMNS, values, strict=True))
    fields["public_key"] = bytes.fromhex(fields["public_key"])
    return encoding.Tx(**fields)


def signed_columns(tx: encoding.Tx) -> dict[str, Any]:
    """The SIGNED_COLUMNS values that store ``tx``: what ``tx_from_columns`` reads back."""
    values = {name: getattr(tx, name) for name in SIGNED_COLUMNS}
    values["payload"] = dict(tx.payload)
    values["public_key"] = tx.public_key.hex()
    return values


_signed_values = attrgetter(*SIGNED_COLUMNS)


class TxType(models.TextChoices):
    DEPOSIT = encoding.DEPOSIT, "Deposit"
    TRANSFER = encoding.TRANSFER, "Transfer"
    ESCROW_LOCK = encoding.ESCROW_LOCK, "Escrow lock"
    ESCROW_RELEASE = encoding.ESCROW_RELEASE, "Escrow release"
    FEE = encoding.FEE, "Fee"
    REGISTER_WORKER = encoding.REGISTER_WORKER, "Register worker"
    SUBMIT_RESULT = encoding.SUBMIT_RESULT, "Submit result"
    REJECT_RESULT = encoding.REJECT_RESULT, "Reject result"
    PAYOUT = encoding.PAYOUT, "Payout"
    REVERSAL = encoding.REVERSAL, "Reversal"


class TxStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    SEALED = "sealed", "Sealed"
    REFUSED = "refused", "Refused"


class Transaction(models.Model):
    """A signed transaction: pending in the mempool, sealed in a block, or refused.

    A refused transaction keeps its reason code and changed nothing. Hash and reference
    are unique among transactions that were not refused, so a refused one can be fixed
    (say, after a deposit) and sent again.
    """

    Type = TxType
    Status = TxStatus

    hash = models.CharField(max_length=HASH_LENGTH)
    chain_id = models.CharField(max_length=64)
    type = models.CharField(max_length=16, choices=TxType.choices)
    # Indexed in Meta.indexes: db_index=True would add a second, varchar_pattern_ops
    # index on PostgreSQL for LIKE 'prefix%' queries nobody makes.
    sender = models.CharField(max_length=ADDRESS_LENGTH)
    recipient = models.CharField(max_length=ADDRESS_LENGTH)
    amount = models.BigIntegerField()
    fee = models.BigIntegerField()
    nonce = models.BigIntegerField()
    gas_price = models.BigIntegerField()
    gas_limit = models.BigIntegerField()
    payload = models.JSONField(default=dict, blank=True)
    public_key = models.CharField(max_length=64)
    signature = models.CharField(max_length=128)
    status = models.CharField(max_length=8, choices=TxStatus.choices, default=TxStatus.PENDING)
    reason = models.CharField(max_length=40, blank=True, help_text="Refusal code.")
    reason_detail = models.CharField(max_length=300, blank=True)
    # Idempotency key of the service that created it ("escrow:<task>", "result:<task>:<worker>").
    # NULL, not "", when absent: NULLs never collide under the unique constraint.
    reference = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    # No index of its own: the unique (block, index_in_block) index serves block lookups.
    block = models.ForeignKey(
        Block, null=True, blank=True, on_delete=models.PROTECT, related_name="transactions", db_index=False
    )
    index_in_block = models.IntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    # Not stored: on a refused row admission returns, the transaction field at fault
    # (``Refusal.field``), so the API's 400 can name it; "" on rows read back.
    refusal_field = ""

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(fields=["hash"], condition=~Q(status="refused"), name="ledger_tx_hash_unique"),
            models.UniqueConstraint(
                fields=["reference"], condition=~Q(status="refused"), name="ledger_tx_reference_unique"
            ),
            models.UniqueConstraint(fields=["block", "index_in_block"], name="ledger_tx_position_unique"),
        ]
        # Sealing rewrites every row it seals, and PostgreSQL then adds an entry to each
        # index whose predicate the row matches: partial indexes keep that work small.
        indexes = [
            # An address's history, newest first (ledger.api.views.AddressHistory): a page
            # reads each index backwards from the cursor's id, a range scan as long as the
            # page whatever the address's size. Refused rows are never listed, and anyone
            # can make them name any address: they stay out, so they cannot pad a scan.
            models.Index(fields=["sender", "id"], condition=~Q(status="refused"), name="ledger_tx_sender_id"),
            models.Index(fields=["recipient", "id"], condition=~Q(status="refused"), name="ledger_tx_recipient_id"),
            models.Index(fields=["id"], condition=Q(status="pending"), name="ledger_tx_pending"),
            models.Index(fields=["hash"], condition=Q(status="refused"), name="ledger_tx_refused_hash"),
        ]

    def __str__(self) -> str:
        return f"{self.type} {self.hash[:12]}"

    def as_tx(self) -> encoding.Tx:
        """The signed fields, exactly as encoded."""
        return tx_from_columns(_signed_values(self))
