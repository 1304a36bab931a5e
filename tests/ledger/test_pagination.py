"""Paging through a block's transactions and an address's history, as a client does:
the REST API's cursor pages (following ``next``) and the explorer's numbered pages."""

from __future__ import annotations

import base64
import re
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from ledger import custody
from ledger.mempool import admit
from ledger.models import Block, Transaction
from ledger.sealer import ensure_system_accounts, seal_block
from ledger.services import ensure_user_account, next_nonce
from protocol import encoding
from tests.ledger.helpers import CREDIT, follow, signed, worker_keys

pytestmark = pytest.mark.django_db

RECEIVER = worker_keys(501)  # receives the bulk deposits, sends a few transfers
OTHER = worker_keys(502)


def deposits(to: str, n: int) -> list[Transaction]:
    """``n`` treasury deposits to ``to``, admitted in one batch: the cheapest way to make
    many real transactions (signed, checked and, once sealed, in a block)."""
    ensure_system_accounts()
    treasury = custody.treasury_keys()
    first = next_nonce(treasury.address)
    rows = admit(
        [
            signed(treasury, encoding.DEPOSIT, to, CREDIT, first + i, {"reference": f"bulk-{first + i}"})
            for i in range(n)
        ]
    )
    assert {r.status for r in rows} == {"pending"}, rows[0].reason_detail
    return rows


def transfers(n: int) -> list[Transaction]:
    """``n`` transfers from RECEIVER to OTHER (RECEIVER must hold the credits)."""
    first = next_nonce(RECEIVER.address)
    rows = admit([signed(RECEIVER, encoding.TRANSFER, OTHER.address, 1, first + i, {}) for i in range(n)])
    assert {r.status for r in rows} == {"pending"}, rows[0].reason_detail
    return rows


@pytest.fixture
def big_block() -> Block:
    """A block of 250 transactions: two and a half pages of 100."""
    deposits(RECEIVER.address, 250)
    block = seal_block()
    assert block is not None
    assert block.tx_count == 250
    return block


def cursor(text: str) -> str:
    """A cursor as a client could forge one: DRF's are base64 query strings."""
    return base64.b64encode(text.encode()).decode()


# --- REST ----------------------------------------------------------------------


def test_a_block_is_listed_page_by_page_in_block_order(big_block: Block, anon_client: APIClient) -> None:
    detail = anon_client.get(f"/api/v1/ledger/blocks/{big_block.height}/").json()
    assert detail["transactions_total"] == 250
    assert detail["transactions_url"] == f"http://testserver/api/v1/ledger/blocks/{big_block.height}/transactions/"
    assert (len(detail["transactions"]), detail["transactions_shown"]) == (200, 200)  # unchanged

    pages = follow(anon_client, detail["transactions_url"])

    assert [len(p["results"]) for p in pages] == [100, 100, 50]
    listed = [t["hash"] for p in pages for t in p["results"]]
    in_block = list(big_block.transactions.order_by("index_in_block").values_list("hash", flat=True))
    assert listed == in_block
    assert [t["index_in_block"] for p in pages for t in p["results"]] == list(range(250))
    assert {t["block_height"] for p in pages for t in p["results"]} == {big_block.height}
    assert pages[0]["previous"] is None
    # Going back from the second page gives the first again.
    back = anon_client.get(pages[1]["previous"]).json()
    assert [t["hash"] for t in back["results"]] == in_block[:100]


def test_a_client_picks_its_page_size_up_to_500(big_block: Block, anon_client: APIClient) -> None:
    url = f"/api/v1/ledger/blocks/{big_block.height}/transactions/"
    assert [len(p["results"]) for p in follow(anon_client, f"{url}?page_size=120")] == [120, 120, 10]
    deposits(RECEIVER.address, 260)  # RECEIVER's history: 510 transactions
    url = f"/api/v1/ledger/accounts/{RECEIVER.address}/transactions/"
    assert [len(p["results"]) for p in follow(anon_client, f"{url}?page_size=10000")] == [500, 10]
    for junk in ("0", "-5", "many"):
        assert len(anon_client.get(f"{url}?page_size={junk}").json()["results"]) == 100


def test_history_pages_neither_skip_nor_repeat_when_transactions_arrive(anon_client: APIClient) -> None:
    received = deposits(RECEIVER.address, 8)
    seal_block()
    sent = transfers(4)
    refused = admit([signed(RECEIVER, encoding.TRANSFER, OTHER.address, 1, 99, {})])  # a nonce far ahead
    assert refused[0].status == "refused"
    history = [t.hash for t in reversed(received + sent)]  # newest first; the refused one is not shown

    detail = anon_client.get(f"/api/v1/ledger/accounts/{RECEIVER.address}/").json()
    url = f"http://testserver/api/v1/ledger/accounts/{RECEIVER.address}/transactions/"
    assert detail["transactions_url"] == url
    first = anon_client.get(f"{url}?page_size=5").json()
    assert [t["hash"] for t in first["results"]] == history[:5]

    # Between pages: new transactions, and the pending ones get sealed.
    arrived = deposits(RECEIVER.address, 3) + transfers(2)
    seal_block()

    rest = follow(anon_client, first["next"])
    assert [len(p["results"]) for p in rest] == [5, 2]
    assert [t["hash"] for p in [first, *rest] for t in p["results"]] == history
    assert {t["status"] for p in rest for t in p["results"]} == {"sealed"}
    # A client starting over sees the new ones first.
    again = anon_client.get(f"{url}?page_size=5").json()
    assert [t["hash"] for t in again["results"]] == [t.hash for t in reversed(arrived)]


def test_the_wallet_links_to_its_whole_history(alice: Any, alice_client: APIClient) -> None:
    address = ensure_user_account(alice).address
    body = alice_client.get("/api/v1/ledger/wallet/").json()
    assert body["transactions_url"] == f"http://testserver/api/v1/ledger/accounts/{address}/transactions/"
    assert len(alice_client.get(body["transactions_url"]).json()["results"]) == 1  # the persona's funding


def test_an_invalid_address_is_a_400_naming_it(anon_client: APIClient) -> None:
    response = anon_client.get("/api/v1/ledger/accounts/cpc1qqqqqqqq/transactions/")
    assert response.status_code == 400
    assert set(response.json()) == {"address"}


def test_an_unknown_address_or_block_is_a_404(anon_client: APIClient) -> None:
    deposits(RECEIVER.address, 1)
    seal_block()
    unseen = worker_keys(503).address  # a valid address no transaction names
    assert anon_client.get(f"/api/v1/ledger/accounts/{unseen}/transactions/").status_code == 404
    assert anon_client.get("/api/v1/ledger/blocks/99/transactions/").status_code == 404
    assert anon_client.get(f"/api/v1/ledger/blocks/{2**70}/transactions/").status_code == 404


@pytest.mark.parametrize(
    "bad",
    [
        "not base64!",
        cursor("o=-1"),
        cursor("r=yes"),
        cursor("p=abc"),  # DRF would hand these positions to the ORM as they are
        cursor("p=1.5"),
        cursor("p=1_000"),
        cursor("p=" + "9" * 30),
        cursor("p="),
    ],
)
def test_a_bad_cursor_is_a_404(big_block: Block, anon_client: APIClient, bad: str) -> None:
    for url in (
        f"/api/v1/ledger/blocks/{big_block.height}/transactions/",
        f"/api/v1/ledger/accounts/{RECEIVER.address}/transactions/",
    ):
        response = anon_client.get(url, {"cursor": bad})
        assert response.status_code == 404, (url, bad, response.content)


def test_a_page_costs_the_same_queries_whatever_its_size(
    big_block: Block, anon_client: APIClient, django_assert_num_queries: Any
) -> None:
    for size in (5, 100, 250):
        with django_assert_num_queries(2):  # the block (or account), then the page
            anon_client.get(f"/api/v1/ledger/blocks/{big_block.height}/transactions/?page_size={size}")
        with django_assert_num_queries(2):
            anon_client.get(f"/api/v1/ledger/accounts/{RECEIVER.address}/transactions/?page_size={size}")


def test_the_schema_documents_both_listings() -> None:
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    for path in (
        "/api/v1/ledger/blocks/{height}/transactions/",
        "/api/v1/ledger/accounts/{address}/transactions/",
    ):
        get = schema["paths"][path]["get"]
        assert {p["name"] for p in get["parameters"] if p["in"] == "query"} == {"cursor", "page_size"}
        page = get["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
        assert set(schema["components"]["schemas"][page]["properties"]) == {"next", "previous", "results"}
    block = schema["components"]["schemas"]["BlockDetail"]["properties"]
    assert {"transactions", "transactions_total", "transactions_url"} <= set(block)
    assert "transactions_url" in schema["components"]["schemas"]["Account"]["properties"]


# --- Explorer pages ---------------------------------------------------------------


def _linked(text: str, hashes: list[str]) -> set[str]:
    return {h for h in hashes if f'href="/explorer/tx/{h}/"' in text}


def test_the_block_page_shows_page_two(big_block: Block, client: Client) -> None:
    hashes = list(big_block.transactions.order_by("index_in_block").values_list("hash", flat=True))
    url = f"/explorer/blocks/{big_block.height}/"

    first = client.get(url).content.decode()
    assert _linked(first, hashes) == set(hashes[:100])
    assert "Showing the first" not in first
    assert 'href="?page=2#txs-heading" rel="next">Next</a>' in first

    response = client.get(url, {"page": 2})
    assert response.status_code == 200
    text = response.content.decode()
    assert _linked(text, hashes) == set(hashes[100:200])
    assert "101–200 of 250" in text
    assert "Page 2 of 3" in text
    assert 'href="?page=1#txs-heading" rel="prev">Previous</a>' in text
    assert 'href="?page=3#txs-heading" rel="next">Next</a>' in text


@pytest.mark.parametrize(("page", "shown"), [("99", slice(200, 250)), ("junk", slice(0, 100)), ("-1", slice(200, 250))])
def test_a_page_past_the_end_or_not_a_number_is_still_a_page(
    big_block: Block, client: Client, page: str, shown: slice
) -> None:
    hashes = list(big_block.transactions.order_by("index_in_block").values_list("hash", flat=True))
    response = client.get(f"/explorer/blocks/{big_block.height}/", {"page": page})
    assert response.status_code == 200
    assert _linked(response.content.decode(), hashes) == set(hashes[shown])


def _page_link(text: str, label: str) -> str | None:
    """The query string of the address page's "Newer" or "Older" link, if it has one."""
    found = re.search(rf'href="(\?(?:before|after)=[0-9]+)#history-heading" rel="(?:prev|next)">{label}</a>', text)
    return found[1] if found else None


def test_the_address_page_shows_page_two_newest_first(big_block: Block, client: Client) -> None:
    newest_first = [t.hash for t in Transaction.objects.filter(recipient=RECEIVER.address).order_by("-id")]
    url = f"/explorer/address/{RECEIVER.address}/"
    first = client.get(url).content.decode()
    assert _linked(first, newest_first) == set(newest_first[:100])
    assert _page_link(first, "Newer") is None
    older = _page_link(first, "Older")
    assert older is not None

    text = client.get(url + older).content.decode()
    assert _linked(text, newest_first) == set(newest_first[100:200])
    assert "Newest first, 100 on this page." in text
    newer, older = _page_link(text, "Newer"), _page_link(text, "Older")
    assert newer is not None
    assert older is not None
    assert _linked(client.get(url + newer).content.decode(), newest_first) == set(newest_first[:100])
    last = client.get(url + older).content.decode()
    assert _linked(last, newest_first) == set(newest_first[200:])
    assert _page_link(last, "Older") is None
    assert _page_link(last, "Newer") is not None


@pytest.mark.parametrize(
    "query", ["?page=2", "?before=junk", "?after=-1", "?before=" + "9" * 30, "?after=99999999", "?before=1"]
)
def test_an_address_page_link_past_the_end_or_not_an_id_is_still_a_page(
    big_block: Block, client: Client, query: str
) -> None:
    newest_first = [t.hash for t in Transaction.objects.filter(recipient=RECEIVER.address).order_by("-id")]
    response = client.get(f"/explorer/address/{RECEIVER.address}/{query}")
    assert response.status_code == 200
    assert _linked(response.content.decode(), newest_first) == set(newest_first[:100])


def test_a_full_wallet_points_to_the_whole_history(alice: Any, client: Client) -> None:
    address = ensure_user_account(alice).address
    client.force_login(alice)
    link = f'<a href="/explorer/address/{address}/#history-heading">The whole history</a>'
    assert link not in client.get("/wallet/").content.decode()  # one transaction: all of it is here
    deposits(address, 60)
    assert link in client.get("/wallet/").content.decode()
