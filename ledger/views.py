"""Explorer and wallet pages. Thin: read, render. The explorer is public (the ledger is
an audit log anyone may read); the wallet is the signed-in user's."""

from __future__ import annotations

import re

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from ledger import custody
from ledger.api.views import HISTORY_LIMIT, AddressHistory, get_transaction, wallet_of
from ledger.bech32 import AddressError, decode_address
from ledger.models import Account, Block
from ledger.proofs import build_proof, is_verified, verify_proof

TX_PAGE_SIZE = 100
_ID = re.compile(r"[0-9]{1,18}")  # a positive 64-bit id: a longer number names no row


def explorer(request: HttpRequest) -> HttpResponse:
    """Latest blocks, updated live over /ws/blocks/."""
    page = Paginator(Block.objects.order_by("-height"), 20).get_page(request.GET.get("page"))
    return render(request, "ledger/explorer.html", {"page": page})


def block_detail(request: HttpRequest, height: int) -> HttpResponse:
    """A block's header and its transactions in block order, 100 a page."""
    block = get_object_or_404(Block, height=height)
    # get_page: a page past the end shows the last, anything not a number the first.
    page = Paginator(block.transactions.order_by("index_in_block"), TX_PAGE_SIZE).get_page(request.GET.get("page"))
    later = Block.objects.filter(height=height + 1).exists()  # the head links to no next block
    return render(request, "ledger/block.html", {"blk": block, "page": page, "later": later})


def tx_detail(request: HttpRequest, tx_hash: str) -> HttpResponse:
    tx = get_transaction(tx_hash)
    proof = build_proof(tx)
    checks = verify_proof(proof, custody.validator_keys().public_key) if proof else {}
    return render(
        request,
        "ledger/transaction.html",
        {"tx": tx, "proof": proof, "checks": checks, "verified": bool(proof) and is_verified(checks)},
    )


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
    return render(request, "ledger/address.html", {"account": account, "txs": txs, "pages": pages})


def _position(value: str | None) -> int | None:
    """A page link's id; anything else (absent, not a number) names no position."""
    return int(value) if value is not None and _ID.fullmatch(value) else None


@login_required
def wallet(request: HttpRequest) -> HttpResponse:
    return render(request, "ledger/wallet.html", {"wallet": wallet_of(request.user), "limit": HISTORY_LIMIT})
