"""Explorer and wallet pages. Thin: read, render. The explorer is public (the ledger is
an audit log anyone may read); the wallet is the signed-in user's."""

from __future__ import annotations

import json
import re
import uuid

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Count, Max, Q, Sum
from django.db.models.functions import Coalesce
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render

from ledger import custody
from ledger.api.views import HISTORY_LIMIT, AddressHistory, get_transaction, visible_transactions, wallet_of
from ledger.entries import entry
from ledger.labels import labels_for
from ledger.models import Account, AccountKind, Block, Transaction, TxStatus
from ledger.proofs import build_proof, is_verified, verify_proof
from protocol.bech32 import AddressError, decode_address

TX_PAGE_SIZE = 100
LATEST_TXS = 20
_NUMBER = re.compile(r"[0-9]+")
_HEIGHT = re.compile(r"#[0-9]+")
_TASK_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_MAX_ID = 2**63 - 1  # a larger number names no row (and is not a bigint to query)
# The pages shorten hashes to their first 8 hex digits; 6 are enough to search by.
_HASH_PREFIX = re.compile(r"[0-9a-f]{6,64}")
SEARCH_LIMIT = 20
# Longer than any height, address or hash: such a query is refused, not echoed back whole.
QUERY_MAX_CHARS = 200


def network_stats() -> dict[str, int | None]:
    """The explorer's headline figures, from three aggregate queries that stay cheap as the
    ledger grows: blocks (far fewer rows than transactions) give the height and the sealed
    transactions, the pending partial index the mempool's size, and the accounts table the
    number of accounts and the fee collector's sealed balance (every fee is paid to it)."""
    chain = Block.objects.aggregate(height=Max("height"), sealed=Sum("tx_count"))
    pending = Transaction.objects.filter(status=TxStatus.PENDING).count()
    fee_collector = custody.validator_keys().address
    accounts = Account.objects.aggregate(
        accounts=Count("id"), fees=Coalesce(Sum("balance", filter=Q(address=fee_collector)), 0)
    )
    return {
        "height": chain["height"],
        "sealed": chain["sealed"] or 0,
        "pending": pending,
        "accounts": accounts["accounts"],
        "fees": accounts["fees"],
    }


def explorer(request: HttpRequest) -> HttpResponse:
    """Network figures, the latest blocks (updated live over /ws/blocks/) and, on the first
    page, the latest admitted transactions, every address named when it is a system one."""
    page = Paginator(Block.objects.order_by("-height"), 20).get_page(request.GET.get("page"))
    txs = list(visible_transactions().order_by("-id")[:LATEST_TXS]) if page.number == 1 else []
    context = {
        "page": page,
        "txs": txs,
        "stats": network_stats(),
        "labels": labels_for(address for t in txs for address in (t.sender, t.recipient)),
    }
    return render(request, "ledger/explorer.html", context)


def explorer_search(request: HttpRequest) -> HttpResponse:
    """Where the explorer's search box leads: a block height (``8`` or ``#8``), an address,
    a task id, or a block or transaction hash, whole or its first 6 or more hex digits (the
    short form the pages show). One match opens it; several are listed; none says so, on a
    page that searches again. A task id opens the task's page for its owner and its escrow
    account for anyone else. Hash prefixes are index range scans (``hash >= p AND hash < p +
    "g"``)."""
    query = request.GET.get("q", "").strip()
    if not query:
        return redirect("explorer")
    if len(query) > QUERY_MAX_CHARS:
        return _search_page(
            request,
            query[: QUERY_MAX_CHARS - 1] + "…",
            problem=f"That is longer than any height, address or hash ({len(query):,} characters).",
        )
    text = query.lower()
    if text.startswith("cpc1"):
        try:
            # The query as typed: BIP-173 accepts an address all in lower or all in upper
            # case, never mixed (a mixed one is a typo or a forgery, not the same address).
            decode_address(query)
        except AddressError as exc:
            return _search_page(request, query, problem=f"Not an address: {str(exc).rstrip('.')}.")
        if not Account.objects.filter(address=text).exists():
            return _search_page(request, query, problem="This is an address, but nothing was ever sent to or from it.")
        return redirect("explorer-address", address=text)
    if _TASK_ID.fullmatch(text):
        return _task_search(request, query, uuid.UUID(text))
    marked = bool(_HEIGHT.fullmatch(text))  # "#8": a height as the pages write it, never a hash
    if marked:
        text = text[1:]
    height = int(text) if _NUMBER.fullmatch(text) else None
    if height is not None and height <= _MAX_ID and Block.objects.filter(height=height).exists():
        return redirect("explorer-block", height=height)
    if height is not None and (marked or not _HASH_PREFIX.fullmatch(text)):
        head = Block.objects.order_by("-height").values_list("height", flat=True).first()
        latest = "no block is sealed yet" if head is None else f"the latest is #{head}"
        return _search_page(request, query, problem=f"No block #{height}; {latest}.")
    if not _HASH_PREFIX.fullmatch(text):
        return _search_page(
            request,
            query,
            problem="Search by block height (8 or #8), by address (cpc1…), by task id, or by a block or"
            " transaction hash (whole, or its first 6 or more hex digits).",
        )
    past = text + "g"  # just above every hex string that starts with the prefix
    txs = list(
        Transaction.objects.exclude(status=TxStatus.REFUSED)
        .filter(hash__gte=text, hash__lt=past)
        .select_related("block")
        .order_by("hash")[: SEARCH_LIMIT + 1]
    )
    if not txs and len(text) == 64:  # a refused transaction is found by its whole hash only
        # Named with its status: the partial index on refused hashes serves it (hash alone
        # matches neither partial index and would scan the whole table).
        txs = list(Transaction.objects.filter(hash=text, status=TxStatus.REFUSED).order_by("-id")[:1])
    blocks = list(Block.objects.filter(hash__gte=text, hash__lt=past).order_by("hash")[: SEARCH_LIMIT + 1])
    if len(txs) + len(blocks) == 1:
        if blocks:
            return redirect("explorer-block", height=blocks[0].height)
        return redirect("explorer-tx", tx_hash=txs[0].hash)
    return _search_page(
        request,
        query,
        txs=txs[:SEARCH_LIMIT],
        labels=labels_for(address for t in txs[:SEARCH_LIMIT] for address in (t.sender, t.recipient)),
        blocks=blocks[:SEARCH_LIMIT],
        more=len(txs) > SEARCH_LIMIT or len(blocks) > SEARCH_LIMIT,
        problem=""
        if txs or blocks
        else f"No block or transaction hash starts with {text}" + (f", and no block #{height} yet." if height else "."),
    )


def _task_search(request: HttpRequest, query: str, task_id: uuid.UUID) -> HttpResponse:
    """A task id: the task's own page for its owner, its escrow account (every credit the
    task locked, paid and refunded) for anyone else."""
    escrow = Account.objects.filter(kind=AccountKind.ESCROW, reference=task_id).first()
    if escrow is None:
        return _search_page(request, query, problem="No task with this id has locked credits on the ledger.")
    if request.user.is_authenticated and escrow.user_id == request.user.pk:
        return redirect("task-detail", pk=task_id)
    return redirect("explorer-address", address=escrow.address)


def _search_page(request: HttpRequest, query: str, **found: object) -> HttpResponse:
    """The search page: what was found, or why nothing was (``problem``)."""
    nothing = not found.get("txs") and not found.get("blocks")
    return render(request, "ledger/search.html", {"query": query, "nothing": nothing, **found})


def block_detail(request: HttpRequest, height: int) -> HttpResponse:
    """A block's header and its transactions in block order, 100 a page."""
    block = get_object_or_404(Block, height=height)
    # get_page: a page past the end shows the last, anything not a number the first.
    page = Paginator(block.transactions.order_by("index_in_block"), TX_PAGE_SIZE).get_page(request.GET.get("page"))
    later = Block.objects.filter(height=height + 1).exists()  # the head links to no next block
    labels = labels_for([block.proposer, *(address for t in page for address in (t.sender, t.recipient))])
    return render(request, "ledger/block.html", {"blk": block, "page": page, "later": later, "labels": labels})


def tx_detail(request: HttpRequest, tx_hash: str) -> HttpResponse:
    """A transaction's fields, its payload as indented JSON, and its checked inclusion proof."""
    tx = get_transaction(tx_hash)
    proof = build_proof(tx)
    checks = verify_proof(proof, custody.validator_keys().public_key) if proof else {}
    context = {
        "tx": tx,
        # Plain text, escaped by the template like any other: the payload is the sender's data.
        "payload": json.dumps(tx.payload, indent=2, sort_keys=True, ensure_ascii=False),
        "proof": proof,
        "checks": checks,
        "verified": bool(proof) and is_verified(checks),
        "labels": labels_for([tx.sender, tx.recipient]),
    }
    return render(request, "ledger/transaction.html", context)


def address_detail(request: HttpRequest, address: str) -> HttpResponse:
    """An address's balances and its whole history, newest first, 100 a page. Pages are
    linked by id (``?before=`` the oldest shown, ``?after=`` the newest), as the API's
    cursors are: no page counts or skips the rows before it."""
    try:
        decode_address(address)
    except AddressError as exc:
        return render(request, "ledger/address.html", {"error": str(exc), "address": address}, status=400)
    account = Account.objects.filter(address=address.lower()).first()
    if account is None:
        raise Http404("No account has this address yet.")
    history = AddressHistory(account.address)
    before, after = _position(request.GET.get("before")), _position(request.GET.get("after"))
    if after is not None:
        rows = history.page(TX_PAGE_SIZE + 1, newest_first=False, past=after)
        txs, newer, older = rows[:TX_PAGE_SIZE][::-1], len(rows) > TX_PAGE_SIZE, True
    else:
        rows = history.page(TX_PAGE_SIZE + 1, past=before)
        txs, newer, older = rows[:TX_PAGE_SIZE], before is not None, len(rows) > TX_PAGE_SIZE
    if not txs and (newer or older):  # a link past either end (stale or forged): the newest page
        rows = history.page(TX_PAGE_SIZE + 1)
        txs, newer, older = rows[:TX_PAGE_SIZE], False, len(rows) > TX_PAGE_SIZE
    pages = {
        "newer": f"?after={txs[0].pk}" if newer else None,
        "older": f"?before={txs[-1].pk}" if older else None,
    }
    labels = labels_for([account.address, *(address for t in txs for address in (t.sender, t.recipient))])
    context = {"account": account, "txs": txs, "pages": pages, "labels": labels}
    return render(request, "ledger/address.html", context)


def _position(value: str | None) -> int | None:
    """A page link's id; anything else (absent, not a number) names no position."""
    if value is None or not _NUMBER.fullmatch(value) or len(value) > 19:
        return None
    number = int(value)
    return number if number <= _MAX_ID else None


@login_required
def wallet(request: HttpRequest) -> HttpResponse:
    """The user's balances and history; how to get credits when there are none (buying them
    only where payments are configured)."""
    wallet = wallet_of(request.user)
    context = {
        "wallet": wallet,
        "entries": [entry(t, wallet["address"]) for t in wallet["transactions"]],
        "limit": HISTORY_LIMIT,
        "payments_enabled": bool(settings.PAYMENTS_ENABLED),
    }
    return render(request, "ledger/wallet.html", context)
