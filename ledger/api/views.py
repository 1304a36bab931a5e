"""Ledger REST API: the explorer (public, read-only), the wallet, and signed submissions."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, cast

from django.db.models import QuerySet
from django.http import Http404
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import generics, permissions, status, throttling
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import Cursor, CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response

from config.api.parsers import JSONParser  # the project's, as in DEFAULT_PARSER_CLASSES
from config.filters import StrictOrderingFilter
from ledger import custody, hooks, services
from ledger.api import serializers as s
from ledger.models import Account, AccountKind, Block, Transaction, TxStatus
from ledger.proofs import build_proof, is_verified, verify_proof
from protocol.bech32 import AddressError, decode_address

BLOCK_TX_LIMIT = 200
_TX_HASH = re.compile(r"[0-9a-fA-F]{64}")
HISTORY_LIMIT = 50


def admitted() -> QuerySet[Transaction]:
    """Transactions the mempool admitted: pending or sealed, not refused. The address
    indexes hold these rows only (their predicate is this filter)."""
    return Transaction.objects.exclude(status=TxStatus.REFUSED)


def visible_transactions() -> QuerySet[Transaction]:
    """What the explorer shows: admitted transactions (refused ones only by hash)."""
    return admitted().select_related("block")


class AddressHistory:
    """An address's admitted transactions, sent or received, newest first, a page at a time.

    One query over ``sender = a OR recipient = a`` has no index in id order: for each page
    PostgreSQL either reads every row of the address (a BitmapOr over two indexes) and
    sorts them, or walks the primary key down through every newer row of the ledger
    until it has a page; the treasury's and the fee collector's histories gain a row a
    task, and an address gone quiet lies below every newer row.

    A page here reads the ``offset + limit`` nearest ids past its cursor from each of the
    indexes on (sender, id) and (recipient, id), two range scans as long as the page, and
    keeps the nearest of their union: each row of the page is among the nearest of an
    index it is in, so the union holds the whole page. A self-transfer is in both, and
    listed once."""

    def __init__(self, address: str) -> None:
        self.address = address

    def page(
        self, limit: int, *, newest_first: bool = True, past: int | None = None, offset: int = 0
    ) -> list[Transaction]:
        """Up to ``limit`` transactions after skipping ``offset``, from the newest down (or
        from the oldest up) or, given ``past``, from the id past it: below it newest
        first, above it oldest first."""
        return list(self.page_rows(limit, newest_first=newest_first, past=past, offset=offset))

    def page_rows(
        self, limit: int, *, newest_first: bool = True, past: int | None = None, offset: int = 0
    ) -> QuerySet[Transaction]:
        """The one query that reads ``page(...)``."""
        if limit <= 0:
            return Transaction.objects.none()
        nearest = offset + limit
        order = "-id" if newest_first else "id"
        beyond = {} if past is None else {"id__lt": past} if newest_first else {"id__gt": past}

        def nearest_ids(column: str) -> QuerySet[Transaction, Any]:
            ids = admitted().filter(**{column: self.address}, **beyond).order_by(order).values("id")[:nearest]
            # Django compiles no LIMIT in a UNION's arm for SQLite, but one in an IN is fine.
            return Transaction.objects.filter(id__in=ids).order_by().values("id")

        rows = visible_transactions().filter(id__in=nearest_ids("sender").union(nearest_ids("recipient"), all=True))
        return rows.order_by(order)[offset:nearest]


def history(address: str, limit: int = HISTORY_LIMIT) -> list[Transaction]:
    """The address's latest ``limit`` transactions, newest first."""
    return AddressHistory(address).page(limit)


def get_account(address: str) -> Account:
    """The account at ``address``: a 400 naming the field when it is no address, a 404
    when the ledger has not seen it (admission creates the account of every address a
    transaction names, so an unseen address has no history either)."""
    try:
        decode_address(address)
    except AddressError as exc:
        raise ValidationError({"address": [str(exc)]}) from None
    account = Account.objects.filter(address=address.lower()).first()
    if account is None:
        raise Http404("No account has this address yet.")
    return account


def get_transaction(tx_hash: str) -> Transaction:
    """The admitted transaction with this hash, else the latest refused one.

    Anything but 64 hex characters names no transaction: it is not looked up (PostgreSQL
    refuses a NUL from the path in a text parameter)."""
    if not _TX_HASH.fullmatch(tx_hash):
        raise Http404("No such transaction.")
    rows = Transaction.objects.filter(hash=tx_hash.lower()).select_related("block")
    # Each with its status named, so each reads its partial index (hash alone reads neither).
    tx = rows.exclude(status=TxStatus.REFUSED).first() or rows.filter(status=TxStatus.REFUSED).order_by("-id").first()
    if tx is None:
        raise Http404("No such transaction.")
    return tx


class BlockList(generics.ListAPIView[Block]):
    """Latest blocks first."""

    permission_classes = [permissions.AllowAny]
    serializer_class = s.BlockSerializer
    queryset = Block.objects.order_by("-height")
    ordering_fields = ["height"]  # unique, indexed: oldest first pages in index order too


class TransactionCursor(CursorPagination):
    """Pages of transactions, 100 by default, ``?page_size=`` up to 500. A cursor is a
    position in a unique, indexed ordering rather than an offset: a client paging through
    a large block reads it in index range scans, and one paging through a history that
    grows meanwhile sees each transaction exactly once."""

    page_size = 100
    page_size_query_param = "page_size"
    page_size_query_description = "Transactions a page: 100 unless given, at most 500."
    max_page_size = 500

    def decode_cursor(self, request: Request) -> Cursor | None:
        cursor = super().decode_cursor(request)
        if cursor is None or cursor.position is None:
            return cursor
        # DRF hands the position to the ORM unchecked: a forged one that is not a 64-bit
        # integer (every ordering here is an integer column) would be a 500, not a 404.
        position = str(cursor.position)  # the text from the query string (the stubs say int)
        if not re.fullmatch(r"-?[0-9]{1,19}", position) or not -(2**63) <= int(position) < 2**63:
            raise NotFound(self.invalid_cursor_message)
        return cursor


class BlockOrderCursor(TransactionCursor):
    ordering = "index_in_block"  # unique in a block: (block, index_in_block) is indexed


class NewestFirstCursor(TransactionCursor):
    # Unique, and a row keeps its id when sealed: whatever is admitted meanwhile, pages
    # neither repeat nor skip a row (a new one, with a higher id, comes before page one).
    ordering = "-id"


class HistoryCursor(NewestFirstCursor):
    """NewestFirstCursor's pages, cursors and links, read from an AddressHistory rather
    than from a queryset (see AddressHistory for why)."""

    def paginate_history(self, history: AddressHistory, request: Request, view: Any = None) -> list[Transaction]:
        # paginate_queryset does three things to what it is given: order_by the ordering
        # (or its reverse), filter past the cursor's position, slice a page. _Pages does
        # them to the history; its page is a list either way.
        page = self.paginate_queryset(cast("QuerySet[Transaction]", _Pages(history)), request, view)
        assert page is not None  # page_size is never 0
        return page


@dataclass(frozen=True)
class _Pages:
    """An AddressHistory as CursorPagination.paginate_queryset uses a queryset ordered by
    id; anything else it might ask is a TypeError, not a silently different page."""

    history: AddressHistory
    newest_first: bool = True
    past: int | None = None

    def order_by(self, *fields: str) -> _Pages:
        if fields not in (("-id",), ("id",)):
            raise TypeError(f"an address's history is ordered by id, not {fields}")
        return replace(self, newest_first=fields == ("-id",))

    def filter(self, **lookup: str) -> _Pages:
        ((name, position),) = lookup.items()
        if name != ("id__lt" if self.newest_first else "id__gt"):
            raise TypeError(f"an address's history pages past an id in its order, not by {name}")
        return replace(self, past=int(position))

    def __getitem__(self, window: slice) -> list[Transaction]:
        start, stop = window.start or 0, window.stop
        if window.step is not None or stop is None:
            raise TypeError("a page of an address's history has an end and no step")
        return self.history.page(stop - start, newest_first=self.newest_first, past=self.past, offset=start)


class BlockDetail(generics.RetrieveAPIView[Block]):
    """One block with (up to 200 of) its transactions; ``transactions_url`` pages
    through all of them."""

    permission_classes = [permissions.AllowAny]
    serializer_class = s.BlockDetailSerializer
    queryset = Block.objects.all()
    lookup_field = "height"

    def get_object(self) -> Block:
        block = super().get_object()
        listed = list(block.transactions.select_related("block").order_by("index_in_block")[:BLOCK_TX_LIMIT])
        block.listed_transactions = listed  # type: ignore[attr-defined]
        block.transactions_shown = len(listed)  # type: ignore[attr-defined]
        return block


class TransactionPages(generics.ListAPIView[Transaction]):
    """A public listing of transactions, a cursor page at a time (``next`` is null on the
    last page); subclasses name the rows (``transactions``) and the cursor's ordering."""

    permission_classes = [permissions.AllowAny]
    serializer_class = s.TransactionSerializer
    # No ordering_fields: the cursor's ordering is the only one that pages correctly, and
    # this filter answers an ?ordering= with a 400 saying so.
    filter_backends = [StrictOrderingFilter]

    def get_queryset(self) -> QuerySet[Transaction]:
        if getattr(self, "swagger_fake_view", False):  # drf-spectacular, reading the model
            return Transaction.objects.none()
        return self.transactions()

    def transactions(self) -> QuerySet[Transaction]:
        raise NotImplementedError


class BlockTransactions(TransactionPages):
    """Every transaction of a block in block order. 404 for a block not sealed yet."""

    pagination_class = BlockOrderCursor

    def transactions(self) -> QuerySet[Transaction]:
        block = get_object_or_404(Block, height=self.kwargs["height"])
        return visible_transactions().filter(block=block)


class SubmitThrottle(throttling.UserRateThrottle):
    """A refused transaction is stored for the explorer: a client looping on bad ones
    would fill the table. 60 a minute per user is far above what a wallet sends."""

    rate = "60/min"


class TransactionSubmit(generics.GenericAPIView[Any]):
    """Submit a TRANSFER signed by its sender (every other type has its own path; see
    SubmitTransactionSerializer). 202 when admitted to the mempool, 400 naming the field
    and the refusal code otherwise; 429 past 60 submissions a minute."""

    serializer_class = s.SubmitTransactionSerializer
    throttle_classes = [SubmitThrottle]
    # JSON only: a form has no way to send the payload object (DRF's DictField reads a
    # form's "payload" as absent), so a signed payload would silently become {}.
    parser_classes = [JSONParser]

    @extend_schema(request=s.SubmitTransactionSerializer, responses={202: s.TransactionSerializer})
    def post(self, request: Request) -> Response:
        form = s.SubmitTransactionSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        tx, signature = form.to_tx()
        refused = hooks.check_transfer(tx.sender, tx.recipient)
        if refused is not None:
            raise ValidationError({"from": [refused], "code": "owes_debt"})
        row = services.submit_transaction(tx, signature)
        if row.status == TxStatus.REFUSED:
            raise ValidationError(refusal_errors(row))
        return Response(s.TransactionSerializer(row).data, status=status.HTTP_202_ACCEPTED)


# A refusal that names one of the fields a client submits is answered under it.
_SUBMITTED_FIELDS = frozenset(s.SubmitTransactionSerializer().get_fields())


def refusal_errors(row: Transaction) -> dict[str, Any]:
    """The 400 body for a transaction the mempool refused: the field at fault, and the code.
    The refusal names it (a code alone is ambiguous: bad_address is "from" or "to",
    bad_gas "gas_limit" or "gas_price"); a row read back from the table carries only
    its code."""
    if row.refusal_field in _SUBMITTED_FIELDS:
        return {row.refusal_field: [row.reason_detail or row.reason], "code": row.reason}
    field = {
        "bad_signature": "signature",
        "bad_nonce": "nonce",
        "insufficient_funds": "amount",
        "wrong_chain": "chain_id",
        "bad_fee": "fee",
        "bad_gas": "gas_limit",
        "unknown_sender": "from",
        "bad_sender": "from",
        "bad_recipient": "to",
        "bad_amount": "amount",
        "duplicate": "signature",
    }.get(row.reason, "payload")
    return {field: [row.reason_detail or row.reason], "code": row.reason}


class TransactionDetail(generics.RetrieveAPIView[Transaction]):
    """One transaction, with its status (and refusal code) and block."""

    permission_classes = [permissions.AllowAny]
    serializer_class = s.TransactionSerializer
    queryset = Transaction.objects.all()
    lookup_field = "hash"

    def get_object(self) -> Transaction:
        return get_transaction(self.kwargs["hash"])


class TransactionProof(generics.GenericAPIView[Any]):
    """The block header and the audit path of the transaction under tx_root (and, for a
    SUBMIT_RESULT, of its ComputeResult under compute_root), checked as a client would:
    against the platform's validator key, not whichever key the block names.
    409 while the transaction is still pending."""

    permission_classes = [permissions.AllowAny]
    serializer_class = s.ProofSerializer
    queryset = Transaction.objects.all()
    lookup_field = "hash"

    def get(self, request: Request, hash: str) -> Response:
        tx = get_transaction(hash)
        proof = build_proof(tx)
        if proof is None:
            return Response(
                {"status": [f"This transaction is {tx.status}; a proof exists once it is sealed."], "code": tx.status},
                status=status.HTTP_409_CONFLICT,
            )
        checks = verify_proof(proof, custody.validator_keys().public_key)
        return Response(s.ProofSerializer({"proof": proof, "checks": checks, "verified": is_verified(checks)}).data)


class AccountDetail(generics.RetrieveAPIView[Account]):
    """An address: balances, nonces and its latest transactions."""

    permission_classes = [permissions.AllowAny]
    serializer_class = s.AccountSerializer
    queryset = Account.objects.all()
    lookup_field = "address"

    def get_object(self) -> Account:
        account = get_account(self.kwargs["address"])
        account.recent_transactions = history(account.address)  # type: ignore[attr-defined]
        return account


class AccountTransactions(TransactionPages):
    """An address's whole history, newest first. Transactions that arrive while a client
    pages through come before its first page, so the pages it fetches next neither
    repeat nor skip any. 400 naming ``address`` when it is not an address, 404 when the
    ledger has not seen it."""

    pagination_class = HistoryCursor

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        history = AddressHistory(get_account(self.kwargs["address"]).address)
        assert isinstance(self.paginator, HistoryCursor)
        page = self.paginator.paginate_history(history, request, view=self)
        return self.paginator.get_paginated_response(self.get_serializer(page, many=True).data)

    def transactions(self) -> QuerySet[Transaction]:
        # list() pages the history itself; only the browsable API's filter forms ask for
        # a queryset here, and this view has no filters.
        return Transaction.objects.none()


class Wallet(generics.GenericAPIView[Any]):
    """The signed-in user's wallet: balance, escrow and history."""

    serializer_class = s.WalletSerializer

    def get(self, request: Request) -> Response:
        return Response(s.WalletSerializer(wallet_of(request.user), context={"request": request}).data)


def wallet_of(user: Any) -> dict[str, Any]:
    account = services.ensure_user_account(user)
    escrow_addresses = list(
        Account.objects.owned_by(user).filter(kind=AccountKind.ESCROW).values_list("address", flat=True)
    )
    txs = history(account.address)
    return {
        "address": account.address,
        "balance": account.available,
        "sealed_balance": account.balance,
        "escrowed": services.escrowed(user),
        "owed": account.owed,
        "escrow_accounts": escrow_addresses,
        "transactions": txs,
    }
