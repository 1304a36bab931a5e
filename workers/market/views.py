"""The market pages: ``/market/``, each kind's market at a glance, and ``/market/<kind>/``,
its order book. Public, like the explorer: they show prices and counts, never who."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from marketplace import pricing
from marketplace.kinds import KINDS
from workers.market.book import OrderBook, order_book
from workers.market.offers import default_job_tflop


def _book(kind: str) -> OrderBook:
    return order_book(kind, default_job_tflop(kind))


def market_index(request: HttpRequest) -> HttpResponse:
    """Every kind: nodes online and free, the lowest ask, the highest bid, the last price."""
    rows: list[dict[str, Any]] = []
    for name, kind in KINDS.items():
        book = _book(name)
        rows.append(
            {
                "kind": kind,
                "book": book,
                "lowest_ask": book.asks[0].charge if book.asks else None,
                "highest_bid": book.bids[0].charge if book.bids else None,
                "waiting": sum(level.count for level in book.bids),
                "last_price": pricing.charge(book.recent[0][0]) if book.recent else None,
            }
        )
    return render(request, "workers/market_index.html", {"rows": rows})


def market_kind(request: HttpRequest, kind: str) -> HttpResponse:
    """One kind's order book: the asks of its online nodes as price levels (what a
    requester pays for the kind's default-spec job, fee included), the bids of its waiting
    tasks, and the prices its latest verified jobs paid their nodes."""
    spec_kind = KINDS.get(kind)
    if spec_kind is None:
        raise Http404("No such kind.")
    book = _book(kind)
    recent = [
        {"price": price, "charge": pricing.charge(price), "at": datetime.fromtimestamp(at, UTC)}
        for price, at in book.recent
    ]
    context = {
        "kind": spec_kind,
        "book": book,
        "recent": recent,
        "tflop": book.tflop,
        "fee_percent": settings.LEDGER_PLATFORM_FEE_BPS / 100,
        "reference_charge": pricing.charge(pricing.reference_ask().price(book.tflop)),
        "asks_nodes": sum(level.count for level in book.asks),
        "waiting": sum(level.count for level in book.bids),
    }
    return render(request, "workers/market_kind.html", context)
