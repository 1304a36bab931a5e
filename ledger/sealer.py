"""The sealer: pending transactions → one signed block, in one database transaction.

Exactly one sealer wins when several run: on PostgreSQL a transaction-scoped advisory
lock (a loser returns at once, it does not queue), on SQLite the IMMEDIATE transaction
that already serialises writers; the unique height is the last line of defence. Either
the block, its transactions' status and the sealed balances are all written, or none.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple, Protocol

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from ledger import custody
from ledger.bulk import mark_sealed, overlapped, reserve_block_id, update_accounts
from ledger.events import BlockSealedEvent, send_block_event
from ledger.models import (
    SIGNED_COLUMNS,
    Account,
    AccountKind,
    Block,
    Transaction,
    TxStatus,
    timestamp_us,
    tx_from_columns,
)
from ledger.rules import Refusal, apply
from ledger.statetree import StateTree
from protocol import encoding, merkle

SEALER_LOCK_KEY = 0x63_70_63_5F_73_65_61_6C  # "cpc_seal"
ZERO_HASH = "00" * 32


class LedgerCorrupt(RuntimeError):
    """Sealing met a transaction admission should never have let in."""


def genesis_header() -> encoding.Header:
    """The genesis block, entirely determined by settings: anyone can recompute it."""
    validator = custody.validator_keys()
    when = datetime.fromisoformat(settings.LEDGER_GENESIS_TIME)
    return encoding.Header(
        height=0,
        prev_hash=bytes(32),
        timestamp_us=timestamp_us(when),
        chain_id=settings.LEDGER_CHAIN_ID,
        proposer=validator.address,
        proposer_key=validator.public_key,
        tx_root=merkle.EMPTY_ROOT,
        compute_root=merkle.EMPTY_ROOT,
        state_root=merkle.EMPTY_ROOT,
        tx_count=0,
        gas_used=0,
    )


def _save_block(header: encoding.Header, when: datetime, pk: int | None = None) -> Block:
    validator = custody.validator_keys()
    message = header.encode()
    return Block.objects.create(
        pk=pk,
        height=header.height,
        hash=hashlib.sha256(message).hexdigest(),
        prev_hash=header.prev_hash.hex(),
        timestamp=when,
        chain_id=header.chain_id,
        proposer=header.proposer,
        proposer_key=header.proposer_key.hex(),
        tx_root=header.tx_root.hex(),
        compute_root=header.compute_root.hex(),
        state_root=header.state_root.hex(),
        tx_count=header.tx_count,
        gas_used=header.gas_used,
        signature=validator.sign(message).hex(),
    )


def ensure_system_accounts() -> None:
    """The treasury and the platform (validator, fee collector) accounts exist."""
    for pair, kind in (
        (custody.treasury_keys(), AccountKind.TREASURY),
        (custody.validator_keys(), AccountKind.PLATFORM),
    ):
        Account.objects.get_or_create(
            address=pair.address, defaults={"kind": kind, "public_key": pair.public_key.hex()}
        )


def _ensure_genesis_locked() -> Block:
    head = Block.objects.order_by("-height").first()
    if head is not None:
        return head
    header = genesis_header()
    return _save_block(header, datetime.fromisoformat(settings.LEDGER_GENESIS_TIME))


def _try_lock() -> bool:
    if connection.vendor != "postgresql":
        return True
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [SEALER_LOCK_KEY])
        row = cursor.fetchone()
    return bool(row and row[0])


def ensure_genesis() -> Block:
    """Create the genesis block if the chain is empty; return the head."""
    with transaction.atomic():
        if not _try_lock():
            return Block.objects.order_by("-height").first() or Block.objects.get(height=0)
        ensure_system_accounts()
        return _ensure_genesis_locked()


class _Leafy(Protocol):
    """A model row or a PendingRow: what the Merkle leaves are made of."""

    @property
    def hash(self) -> str: ...
    @property
    def signature(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def payload(self) -> Any: ...


class PendingRow(NamedTuple):
    """A pending transaction as the sealer reads it: a tuple, no model instance."""

    pk: int
    hash: str
    signature: str
    tx: encoding.Tx

    @property
    def type(self) -> str:
        return self.tx.type

    @property
    def payload(self) -> Any:
        return self.tx.payload


def tx_leaf_hashes(txs: Sequence[_Leafy]) -> list[bytes]:
    return [merkle.leaf_hash(encoding.tx_leaf(bytes.fromhex(t.hash), bytes.fromhex(t.signature))) for t in txs]


def compute_leaf_hashes(txs: Sequence[_Leafy]) -> list[bytes]:
    """ComputeResults of the SUBMIT_RESULT transactions, in block order."""
    leaves = []
    for t in txs:
        if t.type == encoding.SUBMIT_RESULT:
            result, message = encoding.parse_signed_compute_result(t.payload["compute_result"])
            leaves.append(merkle.leaf_hash(encoding.compute_result_leaf(result, message)))
    return leaves


def seal_block(max_txs: int | None = None) -> Block | None:
    """Seal the oldest pending transactions into the next block.

    Returns the block, or None when there was nothing to seal or another sealer holds
    the lock. Takes the sealer lock itself; call it outside any transaction.
    """
    limit = max_txs or settings.LEDGER_MAX_BLOCK_TXS
    validator = custody.validator_keys()
    with transaction.atomic():
        if not _try_lock():
            return None
        ensure_system_accounts()
        head = _ensure_genesis_locked()
        rows = (
            Transaction.objects.filter(status=TxStatus.PENDING)
            .order_by("id")
            .values_list("pk", "hash", "signature", *SIGNED_COLUMNS)[:limit]
        )
        pending = [PendingRow(pk, hash_, signature, tx_from_columns(signed)) for pk, hash_, signature, *signed in rows]
        if not pending:
            return None
        collector = {validator.address} if any(t.tx.fee for t in pending) else set()
        addresses = sorted({a for t in pending for a in (t.tx.sender, t.tx.recipient)} | collector)
        accounts = list(Account.objects.select_for_update().filter(address__in=addresses).order_by("address"))
        state = {a.address: [a.balance, a.nonce] for a in accounts}
        for t in pending:
            try:
                apply(state, t.tx, validator.address)
            except (Refusal, KeyError) as exc:
                raise LedgerCorrupt(f"pending transaction {t.hash} cannot be sealed: {exc}") from exc
        for account in accounts:
            account.balance, account.nonce = state[account.address]
        block_id = reserve_block_id()
        with overlapped():
            # PostgreSQL rewrites the rows while the Merkle leaves are hashed here.
            update_accounts(accounts, ["balance", "nonce"])
            mark_sealed(block_id, [t.pk for t in pending])
            tx_root = merkle.root_from_leaf_hashes(tx_leaf_hashes(pending))
            compute_root = merkle.root_from_leaf_hashes(compute_leaf_hashes(pending))

        tree = _take_state_tree(head.hash)
        if tree is None:
            tree = StateTree(
                Account.objects.filter(~Q(balance=0) | ~Q(nonce=0)).values_list("address", "balance", "nonce")
            )
        else:
            for account in accounts:
                tree.update(account.address, account.balance, account.nonce)
        now = max(timezone.now(), head.timestamp + timedelta(microseconds=1))
        header = encoding.Header(
            height=head.height + 1,
            prev_hash=bytes.fromhex(head.hash),
            timestamp_us=timestamp_us(now),
            chain_id=settings.LEDGER_CHAIN_ID,
            proposer=validator.address,
            proposer_key=validator.public_key,
            tx_root=tx_root,
            compute_root=compute_root,
            state_root=tree.root(),
            tx_count=len(pending),
            gas_used=sum(t.tx.gas_limit for t in pending),
        )
        block = _save_block(header, now, pk=block_id)
        event = BlockSealedEvent(
            type="block.sealed",
            height=block.height,
            hash=block.hash,
            timestamp=block.timestamp.isoformat(),
            tx_count=block.tx_count,
            gas_used=block.gas_used,
        )
        transaction.on_commit(lambda: send_block_event(event))
        transaction.on_commit(lambda: _keep_state_tree(block.hash, tree))
    return block


# The state tree as of the last block this process sealed, keyed by that block's hash:
# the next block here changes only the accounts it touches (ledger/statetree.py). Only
# the sealer writes sealed balances, under its lock, so a tree whose block is still the
# head is the sealed state. Another process's block, or a rolled-back one, changes the
# head, and the tree is rebuilt from the accounts.
_state_tree: tuple[str, StateTree] | None = None


def _take_state_tree(head_hash: str) -> StateTree | None:
    """The cached tree if it is the head's state, else None; the cache is emptied
    either way, and refilled only once the next block commits."""
    global _state_tree
    cached, _state_tree = _state_tree, None
    return cached[1] if cached is not None and cached[0] == head_hash else None


def _keep_state_tree(block_hash: str, tree: StateTree) -> None:
    global _state_tree
    _state_tree = (block_hash, tree)


def seal_all(max_blocks: int = 100) -> list[Block]:
    """Seal until the mempool is empty (or ``max_blocks`` blocks), returning the blocks."""
    blocks: list[Block] = []
    for _ in range(max_blocks):
        block = seal_block()
        if block is None:
            break
        blocks.append(block)
    return blocks
