"""Ledger REST API: the explorer (public, read-only), the wallet, and signed submissions."""

from __future__ import annotations

import re
from typing import Any

from django.db.models import Q, QuerySet
from django.http import Http404
from drf_spectacular.utils import extend_schema
from rest_framework import generics, permissions, status, throttling
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from ledger import custody, services
from ledger.api import serializers as s
from ledger.bech32 import AddressError, decode_address
from ledger.models import Account, AccountKind, Block, Transaction, TxStatus
from ledger.proofs import build_proof, is_verified, verify_proof

BLOCK_TX_LIMIT = 200
_TX_HASH = re.compile(r"[0-9a-fA-F]{64}")
HISTORY_LIMIT = 50


def visible_transactions() -> QuerySet[Transaction]:
    """What the explorer shows: admitted transactions (refused ones only by hash)."""
    return Transaction.objects.exclude(status=TxStatus.REFUSED).select_related("block")


def history(address: str, limit: int = HISTORY_LIMIT) -> list[Transaction]:
    return list(visible_transactions().filter(Q(sender=address) | Q(recipient=address)).order_by("-id")[:limit])


def get_transaction(tx_hash: str) -> Transaction:
    """The admitted transaction with this hash, else the latest refused one.

    Anything but 64 hex characters names no transaction: it is not looked up (a NUL in
    the path was a 500 on PostgreSQL, which refuses it in a text parameter)."""
    if not _TX_HASH.fullmatch(tx_hash):
        raise Http404("No such transaction.")
    rows = Transaction.objects.filter(hash=tx_hash.lower()).select_related("block")
    tx = rows.exclude(status=TxStatus.REFUSED).first() or rows.order_by("-id").first()
    if tx is None:
        raise Http404("No such transaction.")
    return tx


class BlockList(generics.ListAPIView[Block]):
    """Latest blocks first."""

    permission_classes = [permissions.AllowAny]
    serializer_class = s.BlockSerializer
    queryset = Block.objects.order_by("-height")


class BlockDetail(generics.RetrieveAPIView[Block]):
    """One block with (up to 200 of) its transactions."""

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

    @extend_schema(request=s.SubmitTransactionSerializer, responses={202: s.TransactionSerializer})
    def post(self, request: Request) -> Response:
        form = s.SubmitTransactionSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        tx, signature = form.to_tx()
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
        address = self.kwargs["address"]
        try:
            decode_address(address)
        except AddressError as exc:
            raise ValidationError({"address": [str(exc)]}) from None
        account = Account.objects.filter(address=address.lower()).first()
        if account is None:
            raise Http404("No account has this address yet.")
        account.recent_transactions = history(account.address)  # type: ignore[attr-defined]
        return account


class Wallet(generics.GenericAPIView[Any]):
    """The signed-in user's wallet: balance, escrow and history."""

    serializer_class = s.WalletSerializer

    def get(self, request: Request) -> Response:
        return Response(s.WalletSerializer(wallet_of(request.user)).data)


def wallet_of(user: Any) -> dict[str, Any]:
    account = services.ensure_user_account(user)
    escrow_addresses = list(
        Account.objects.filter(user=user, kind=AccountKind.ESCROW).values_list("address", flat=True)
    )
    txs = list(
        visible_transactions()
        .filter(Q(sender=account.address) | Q(recipient=account.address))
        .order_by("-id")[:HISTORY_LIMIT]
    )
    return {
        "address": account.address,
        "balance": account.available,
        "sealed_balance": account.balance,
        "escrowed": services.escrowed(user),
        "escrow_accounts": escrow_addresses,
        "transactions": txs,
    }
