"""The chain audit: replay every block from genesis and recompute everything.

Checks, block by block: height and prev_hash links, the genesis block against
settings, the proposer's key and signature, every transaction's hash (recomputed from
its stored fields), signature and rules, the balances it moves (replayed in a fresh
state that starts empty), tx_root, compute_root, state_root, tx_count, gas_used and the
block hash. After the last block the replayed state must equal every account's sealed
balance and nonce, and replaying the pending transactions on top must give their
available balance and next nonce. The first divergence raises ``Divergence`` naming
the block height, the transaction hash and the field.

The audit runs against a live platform. The blocks sealed when it starts never change
(a block is committed with its transactions), so they are replayed outside any
transaction: a long audit holds no snapshot. The rest is read in one read-only snapshot
(REPEATABLE READ on PostgreSQL; a DEFERRED transaction on SQLite, whose WAL journal
gives a reader a snapshot without holding up writers): the blocks sealed meanwhile, the
accounts and the mempool. Otherwise each query would see the database as of its own
start, and a block sealed (or a transaction admitted) between reading the blocks, the
accounts and the mempool would be a "divergence" of a healthy chain. Called inside a transaction, it
reads everything in the caller's, which keeps its isolation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from django.db import connection, transaction

from ledger import custody
from ledger.chain import context
from ledger.models import Account, Block, Transaction, TxStatus
from ledger.rules import ChainContext, Refusal, apply, check_signatures, check_stateless
from ledger.sealer import compute_leaf_hashes, genesis_header, tx_leaf_hashes
from ledger.statetree import StateTree
from protocol import encoding, keys, merkle
from protocol.bech32 import address_from_public_key


class Divergence(Exception):
    """The first place the stored chain disagrees with its replay."""

    def __init__(self, height: int | None, tx_hash: str, field: str, detail: str) -> None:
        where = f"block {height}" if height is not None else "account state"
        tx = f", transaction {tx_hash}" if tx_hash else ""
        super().__init__(f"{where}{tx}, field {field}: {detail}")
        self.height = height
        self.tx_hash = tx_hash
        self.field = field
        self.detail = detail


@dataclass(frozen=True)
class Summary:
    """What a clean replay found."""

    blocks: int
    transactions: int
    pending: int
    accounts: int
    total_balance: int
    deposits: int
    payouts: int
    head_hash: str
    seconds: float
    reversals: int = 0  # credits burnt because their card payment was refunded or disputed


def _check(ok: bool, height: int | None, tx_hash: str, field: str, detail: str) -> None:
    if not ok:
        raise Divergence(height, tx_hash, field, detail)


def _replay_block(
    txs: list[Transaction], state: dict[str, list[int]], ctx: ChainContext, collector: str, height: int | None
) -> None:
    """Recompute each transaction's hash, check its signatures (in one batch) and rules,
    and apply it to ``state``, in order."""
    encoded: list[tuple[Transaction, encoding.Tx, bytes, bytes]] = []
    for t in txs:
        try:
            tx = t.as_tx()
        except ValueError as exc:  # the only column as_tx decodes
            raise Divergence(height, t.hash, "public_key", str(exc)) from None
        try:
            message = tx.encode()
            signature = bytes.fromhex(t.signature)
        except encoding.EncodingError as exc:
            raise Divergence(height, t.hash, exc.field, str(exc)) from None
        except ValueError as exc:  # a signature that is not even hex
            raise Divergence(height, t.hash, "signature", str(exc)) from None
        _check(
            hashlib.sha256(message).hexdigest() == t.hash,
            height,
            t.hash,
            "hash",
            "the stored fields (amount, fee, payload, addresses, …) no longer hash to the stored hash",
        )
        encoded.append((t, tx, message, signature))
    parsed: list[encoding.ComputeResult | None] = []
    verdicts = check_signatures([(tx, sig, m) for _, tx, m, sig in encoded], parsed)
    for (t, tx, message, signature), verdict, result in zip(encoded, verdicts, parsed, strict=True):
        try:
            if verdict is not None:
                raise verdict
            check_stateless(tx, signature, ctx, message, signatures_checked=True, parsed=result)
            apply(state, tx, collector)
        except Refusal as refusal:
            raise Divergence(height, t.hash, refusal.field or refusal.code, refusal.detail) from None


@contextmanager
def _snapshot() -> Iterator[None]:
    """One consistent view of the ledger for the whole replay (see the module docstring)."""
    if connection.in_atomic_block:
        yield
    elif connection.vendor == "postgresql":
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            yield
    elif connection.vendor == "sqlite":
        # Not atomic(): this project's SQLite transactions BEGIN IMMEDIATE, taking the write
        # lock, which would stop the platform for the audit's length. A DEFERRED
        # transaction that only reads takes no lock in WAL mode; Django is in autocommit
        # (the driver issues no BEGIN of its own), so the transaction is ours to end.
        connection.ensure_connection()
        with connection.cursor() as cursor:
            cursor.execute("BEGIN DEFERRED")
        try:
            yield
        finally:
            # It only read, so ending it either way is the same. Only if it is still open
            # (a reset connection has none), and never hiding the audit's own exception.
            raw = connection.connection
            if raw is not None and raw.in_transaction:
                with contextlib.suppress(Exception), connection.cursor() as cursor:
                    cursor.execute("ROLLBACK")
    else:
        yield


def _audit_context() -> ChainContext:
    """The rules as the audit applies them: this chain's, without the least gas price.
    That is what admission accepts from now on (LEDGER_GAS_PRICE), not a rule of the
    chain: transactions sealed, or pending, at an earlier, lower price stay valid."""
    return dataclasses.replace(context(), min_gas_price=0)


def verify_chain(progress: Callable[[int, int], None] | None = None) -> Summary:
    """Replay the whole chain; raise Divergence at the first disagreement.

    Sealed blocks never change, so the blocks there are when it starts are replayed
    outside any transaction: a long audit holds no snapshot (on PostgreSQL one would hold
    back vacuum for the audit's length; on SQLite it would stop WAL checkpoints). Then,
    in one snapshot, the blocks sealed meanwhile and the comparison with the accounts and
    the mempool, which must all be of one moment.
    """
    replay = _Replay(progress)
    if not connection.in_atomic_block:
        head = Block.objects.order_by("-height").values_list("height", flat=True).first()
        if head is not None:
            replay.advance(upto=head)
    with _snapshot():
        replay.advance(upto=None)
        return replay.finish()


# The header columns decoded from hex (to encode the header, check the signature).
_HEX_COLUMNS = ("prev_hash", "proposer_key", "tx_root", "compute_root", "state_root", "signature")


def _is_hex(text: str) -> bool:
    try:
        bytes.fromhex(text)
    except ValueError:
        return False
    return True


class _Replay:
    """The chain replayed so far: a fresh state that starts empty, block after block."""

    def __init__(self, progress: Callable[[int, int], None] | None) -> None:
        self.started = time.perf_counter()
        self.progress = progress
        self.ctx = _audit_context()
        self.validator_key = custody.validator_keys().public_key
        self.state: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        self.tree = StateTree()
        self.deposits = self.payouts = self.reversals = self.transactions = 0
        self.prev: Block | None = None
        self.count = 0

    def advance(self, upto: int | None) -> None:
        """Replay the blocks after the last one replayed, up to height ``upto`` (None: all)."""
        after = -1 if self.prev is None else self.prev.height
        total = Block.objects.count()
        for block in _blocks(after, upto):
            self._block(block)
            self.count += 1
            if self.progress is not None:
                self.progress(self.count, max(total, self.count))

    def _block(self, block: Block) -> None:
        h, count, prev, ctx, validator_key = block.height, self.count, self.prev, self.ctx, self.validator_key
        _check(h == count, h, "", "height", f"expected height {count} after block {count - 1}")
        for name in _HEX_COLUMNS:
            _check(_is_hex(getattr(block, name)), h, "", name, "is not hexadecimal")
        if prev is None:
            expected = genesis_header()
            stored = block.header()
            for name in expected.__dataclass_fields__:
                _check(
                    getattr(stored, name) == getattr(expected, name),
                    h,
                    "",
                    name,
                    "the genesis block differs from the one settings define",
                )
        else:
            _check(block.prev_hash == prev.hash, h, "", "prev_hash", "does not link to the previous block")
            _check(block.timestamp > prev.timestamp, h, "", "timestamp", "is not after the previous block's")
        _check(block.chain_id == ctx.chain_id, h, "", "chain_id", f"is not {ctx.chain_id!r}")
        _check(block.proposer_key == validator_key.hex(), h, "", "proposer_key", "is not the platform validator's key")
        _check(
            block.proposer == address_from_public_key(validator_key), h, "", "proposer", "is not the validator address"
        )
        txs = list(Transaction.objects.filter(block=block).order_by("index_in_block"))
        _check(len(txs) == block.tx_count, h, "", "tx_count", f"the block holds {len(txs)} transactions")
        for i, t in enumerate(txs):
            _check(t.index_in_block == i, h, t.hash, "index_in_block", f"expected position {i}")
            _check(t.status == TxStatus.SEALED, h, t.hash, "status", "a transaction in a block is sealed")
        _replay_block(txs, self.state, ctx, block.proposer, h)
        for t in txs:
            if t.type == encoding.DEPOSIT:
                self.deposits += t.amount
            elif t.type == encoding.PAYOUT:
                self.payouts += t.amount
            elif t.type == encoding.REVERSAL:
                self.reversals += t.amount
        self.transactions += len(txs)
        _check(block.gas_used == sum(t.gas_limit for t in txs), h, "", "gas_used", "differs from the transactions'")
        if h > 0:
            # The accounts a transaction moves: its sender, recipient and the fee collector.
            for address in {a for t in txs for a in (t.sender, t.recipient)} | {block.proposer}:
                balance, nonce = self.state.get(address, (0, 0))
                self.tree.update(address, balance, nonce)
            roots = {
                "tx_root": merkle.root_from_leaf_hashes(tx_leaf_hashes(txs)),
                "compute_root": merkle.root_from_leaf_hashes(compute_leaf_hashes(txs)),
                "state_root": self.tree.root(),
            }
            for name, value in roots.items():
                _check(getattr(block, name) == value.hex(), h, "", name, "differs from the recomputed root")
        message = block.header().encode()
        _check(hashlib.sha256(message).hexdigest() == block.hash, h, "", "hash", "the header no longer hashes to it")
        _check(
            keys.verify(validator_key, message, bytes.fromhex(block.signature)),
            h,
            "",
            "signature",
            "the validator's signature does not verify",
        )
        self.prev = block

    def finish(self) -> Summary:
        """Compare the replayed state with the accounts and the mempool (in the caller's
        snapshot, with every block of that snapshot replayed)."""
        state, prev = self.state, self.prev
        _compare_accounts(state, prev)
        pending = _compare_pending(state, self.ctx.validator)
        total = sum(b for b, _ in state.values())
        _check(
            total == self.deposits - self.payouts - self.reversals,
            None,
            "",
            "balance",
            "sum of balances ≠ deposits − payouts − reversals",
        )
        return Summary(
            blocks=0 if prev is None else prev.height + 1,
            transactions=self.transactions,
            pending=pending,
            accounts=Account.objects.count(),
            total_balance=total,
            deposits=self.deposits,
            payouts=self.payouts,
            head_hash="" if prev is None else prev.hash,
            seconds=time.perf_counter() - self.started,
            reversals=self.reversals,
        )


def _blocks(after: int, upto: int | None, chunk: int = 200) -> Iterator[Block]:
    """Blocks above height ``after`` (up to ``upto``, or all), by height, a page at a time.
    Plain queries, not a server-side cursor, so a divergence raised mid-way leaves no
    cursor open in the caller's transaction."""
    while True:
        rows = Block.objects.filter(height__gt=after)
        if upto is not None:
            rows = rows.filter(height__lte=upto)
        page = list(rows.order_by("height")[:chunk])
        yield from page
        if len(page) < chunk:
            return
        after = page[-1].height


def _compare_accounts(state: dict[str, list[int]], head: Block | None) -> None:
    height = None if head is None else head.height
    for address, bal, nonce in Account.objects.values_list("address", "balance", "nonce"):
        want = state.get(address, [0, 0])
        _check(bal == want[0], height, "", "balance", f"account {address} holds {bal}, replay gives {want[0]}")
        _check(nonce == want[1], height, "", "nonce", f"account {address} has nonce {nonce}, replay gives {want[1]}")
    known = set(Account.objects.values_list("address", flat=True))
    for address, (bal, nonce) in state.items():
        _check(address in known or (bal == 0 and nonce == 0), height, "", "balance", f"account {address} is missing")


def _compare_pending(state: dict[str, list[int]], collector: str) -> int:
    """Replay the mempool on top of the sealed state: it must give available/next_nonce."""
    ctx = _audit_context()
    after = defaultdict(lambda: [0, 0], {a: list(v) for a, v in state.items()})
    pending = list(Transaction.objects.filter(status=TxStatus.PENDING).order_by("id"))
    _replay_block(pending, after, ctx, collector, None)
    for address, avail, next_nonce in Account.objects.values_list("address", "available", "next_nonce"):
        want = after.get(address, [0, 0])
        _check(avail == want[0], None, "", "available", f"account {address} shows {avail}, replay gives {want[0]}")
        _check(next_nonce == want[1], None, "", "next_nonce", f"account {address} shows {next_nonce}, replay {want[1]}")
    return len(pending)
