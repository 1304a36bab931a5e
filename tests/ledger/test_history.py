"""An address's history read a page at a time from its two composite indexes: the REST
API's cursor pages, the explorer's Newer/Older pages, and (on PostgreSQL) the plan a
page costs for an address with many rows."""

from __future__ import annotations

import base64
import json
import re
import uuid
from typing import Any

import pytest
from django.db import connection
from django.db.models import Q, QuerySet
from django.test import Client
from django.test.utils import CaptureQueriesContext
from rest_framework.request import Request
from rest_framework.test import APIClient, APIRequestFactory

from ledger import custody
from ledger.api.views import AddressHistory, NewestFirstCursor
from ledger.mempool import admit
from ledger.models import Transaction, TxStatus
from ledger.sealer import ensure_system_accounts, seal_block
from ledger.services import next_nonce
from protocol import encoding
from tests.ledger.helpers import CREDIT, follow, signed, submit_result, worker_keys
from tests.plans import nodes, plan_of

pytestmark = pytest.mark.django_db

OWNER = worker_keys(601)  # the address whose history is read
OTHER = worker_keys(602)
ROUNDS = 9


def everything_of(address: str) -> QuerySet[Transaction]:
    """The history as one plain query, newest first: what the pages must add up to."""
    return Transaction.objects.filter(Q(sender=address) | Q(recipient=address)).exclude(status=TxStatus.REFUSED)


@pytest.fixture
def mixed(assignments: set[tuple[uuid.UUID, str]]) -> list[str]:
    """OWNER's history, newest first (hashes): sent, received and self-transfers
    interleaved with transactions of others, some sealed and some pending, beside refused
    ones that name OWNER and are never listed."""
    ensure_system_accounts()
    treasury = custody.treasury_keys()
    first = next_nonce(treasury.address)
    funded = admit(
        [
            signed(treasury, encoding.DEPOSIT, OWNER.address, 100 * CREDIT, first, {"reference": "history-owner"}),
            signed(treasury, encoding.DEPOSIT, OTHER.address, 100 * CREDIT, first + 1, {"reference": "history-other"}),
        ]
    )
    assert {r.status for r in funded} == {TxStatus.PENDING}
    seal_block()
    for n in range(ROUNDS):
        task = uuid.uuid4()
        assignments.add((task, OWNER.address))
        rows = admit(
            [
                signed(OWNER, encoding.TRANSFER, OTHER.address, 1, 2 * n, {}),  # sent
                submit_result(OWNER, 2 * n + 1, task),  # to itself, as every result is
                signed(OTHER, encoding.TRANSFER, OWNER.address, 1, 2 * n, {}),  # received
                signed(OTHER, encoding.TRANSFER, treasury.address, 1, 2 * n + 1, {}),  # not OWNER's
            ]
        )
        assert {r.status for r in rows} == {TxStatus.PENDING}, [(r.reason, r.reason_detail) for r in rows]
        if n % 2:
            seal_block()
    refused = admit(
        [
            signed(OWNER, encoding.TRANSFER, OTHER.address, 1, 999, {}),  # a nonce far ahead
            signed(OTHER, encoding.TRANSFER, OWNER.address, 1, 999, {}),
        ]
    )
    assert {r.status for r in refused} == {TxStatus.REFUSED}
    history = list(everything_of(OWNER.address).order_by("-id").values_list("hash", flat=True))
    assert len(history) == 1 + 3 * ROUNDS
    assert everything_of(OWNER.address).filter(recipient=OWNER.address, sender=OWNER.address).count() == ROUNDS
    return history


def hashes(pages: list[dict[str, Any]]) -> list[str]:
    return [t["hash"] for p in pages for t in p["results"]]


# --- REST ------------------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 4, 7, 100])
def test_pages_list_each_transaction_once_newest_first_and_back(
    mixed: list[str], anon_client: APIClient, size: int
) -> None:
    url = f"/api/v1/ledger/accounts/{OWNER.address}/transactions/?page_size={size}"
    pages = follow(anon_client, url)

    assert hashes(pages) == mixed  # every self-transfer once, no refused one
    assert [len(p["results"]) for p in pages[:-1]] == [size] * (len(pages) - 1)
    assert pages[-1]["next"] is None
    assert pages[0]["previous"] is None
    # Back from the last page, through ``previous``: the same pages in reverse.
    back = follow(anon_client, pages[-1]["previous"], key="previous") if len(pages) > 1 else []
    assert [hashes([p]) for p in reversed(back)] == [hashes([p]) for p in pages[:-1]]


def query(cursor: str) -> dict[str, str]:
    return {"cursor": cursor, "page_size": "4"} if cursor else {"page_size": "4"}


def drf_page(url: str, cursor: str) -> dict[str, Any]:
    """What DRF's own cursor pagination answers for ``cursor`` over the plain query."""
    request = Request(APIRequestFactory().get(url, query(cursor)))
    paginator = NewestFirstCursor()
    rows = paginator.paginate_queryset(everything_of(OWNER.address), request)
    assert rows is not None
    return {
        "results": [t.hash for t in rows],
        "next": paginator.get_next_link(),
        "previous": paginator.get_previous_link(),
    }


@pytest.mark.parametrize(
    "tokens",
    ["", "p={mid}", "r=1&p={mid}", "o=2&p={mid}", "o=3&r=1&p={mid}", "r=1", "o=5", "p=0", "r=1&p=0", "p=99999999"],
)
def test_any_cursor_gets_the_page_drfs_cursor_pagination_would(
    mixed: list[str], anon_client: APIClient, tokens: str
) -> None:
    mid = Transaction.objects.get(hash=mixed[len(mixed) // 2]).pk
    cursor = base64.b64encode(tokens.format(mid=mid).encode()).decode() if tokens else ""
    url = f"http://testserver/api/v1/ledger/accounts/{OWNER.address}/transactions/"
    response = anon_client.get(url, query(cursor))
    assert response.status_code == 200
    body = response.json()
    assert {"results": [t["hash"] for t in body["results"]], "next": body["next"], "previous": body["previous"]} == (
        drf_page(url, cursor)
    )


def test_a_page_reads_only_past_its_cursor(mixed: list[str]) -> None:
    history = AddressHistory(OWNER.address)
    ids = list(everything_of(OWNER.address).order_by("-id").values_list("id", flat=True))
    assert [t.pk for t in history.page(5, past=ids[3])] == ids[4:9]
    assert [t.pk for t in history.page(5, newest_first=False, past=ids[-3])] == ids[-4:-9:-1]
    assert [t.pk for t in history.page(3, past=ids[3], offset=2)] == ids[6:9]
    assert [t.pk for t in history.page(100)] == ids
    assert history.page(0) == []
    assert AddressHistory(worker_keys(603).address).page(10) == []


# --- Explorer pages ---------------------------------------------------------------


def listed(text: str) -> list[str]:
    return re.findall(r'href="/explorer/tx/([0-9a-f]{64})/"', text)


def link(text: str, label: str) -> str | None:
    found = re.search(rf'href="(\?(?:before|after)=[0-9]+)#history-heading" rel="(?:prev|next)">{label}</a>', text)
    return found[1] if found else None


def test_the_address_page_walks_older_to_the_end_and_newer_back(
    mixed: list[str], client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("ledger.views.TX_PAGE_SIZE", 5)
    url = f"/explorer/address/{OWNER.address}/"
    pages: list[list[str]] = []
    query: str | None = ""
    while query is not None:
        text = client.get(url + query).content.decode()
        pages.append(listed(text))
        assert (link(text, "Newer") is None) == (len(pages) == 1)
        query = link(text, "Older")
    assert [h for page in pages for h in page] == mixed
    assert [len(p) for p in pages] == [5] * (len(pages) - 1) + [len(mixed) - 5 * (len(pages) - 1)]

    back: list[list[str]] = []
    query = link(text, "Newer")
    while query is not None:
        text = client.get(url + query).content.decode()
        back.append(listed(text))
        query = link(text, "Newer")
    assert list(reversed(back)) == pages[:-1]


def test_the_address_page_neither_counts_nor_skips_rows(mixed: list[str], client: Client) -> None:
    url = f"/explorer/address/{OWNER.address}/"
    older = f"?before={Transaction.objects.get(hash=mixed[10]).pk}"
    counts = []
    for query in ("", older):
        with CaptureQueriesContext(connection) as queries:
            assert client.get(url + query).status_code == 200
        sql = " ".join(q["sql"] for q in queries.captured_queries).upper()
        assert "COUNT(" not in sql
        assert "OFFSET" not in sql
        counts.append(len(queries))
    assert counts[0] == counts[1]


# --- PostgreSQL: the plan of a page -------------------------------------------------

BIG = 3_000  # OWNER's rows, among the first 15,000 of the table
NEWER = 45_000  # others' rows, all newer than OWNER's
PAGE = 10


def insert_rows(sender: str, recipient: str, status: str, count: int, **params: Any) -> None:
    """``count`` rows in one INSERT … SELECT: a real history this long would take minutes
    to sign and admit. The SQL expressions see the row's number as ``g``."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO ledger_transaction (hash, chain_id, type, sender, recipient, amount, fee, nonce,
                gas_price, gas_limit, payload, public_key, signature, status, reason, reason_detail, created_at)
            SELECT md5(%(salt)s || g) || md5(g || %(salt)s), 'plan', 'TRANSFER', {sender}, {recipient},
                1, 0, g, 0, 0, '{{}}'::jsonb, repeat('0', 64), repeat('0', 128), {status}, '', '', now()
            FROM generate_series(1, %(count)s) AS g ORDER BY g
            """,  # noqa: S608 (the expressions are this file's; the values are parameters)
            {"count": count, **params},
        )


def rows_read(plan: dict[str, Any]) -> int:
    """Rows of ledger_transaction the plan's scans touched, kept or filtered out."""
    return sum(
        (n["Actual Rows"] + n.get("Rows Removed by Filter", 0) + n.get("Rows Removed by Index Recheck", 0))
        * n["Actual Loops"]
        for n in nodes(plan)
        if n.get("Relation Name") == "ledger_transaction"
    )


@pytest.mark.django_db(transaction=True)  # VACUUM, as autovacuum would have: it runs outside a transaction
@pytest.mark.skipif(connection.vendor != "postgresql", reason="the plan is PostgreSQL's")
def test_a_page_of_a_long_history_reads_index_ranges_not_every_row_of_the_address() -> None:
    owner, b, c = OWNER.address, OTHER.address, worker_keys(604).address
    # OWNER: one row in five of the first 15,000, by turns sent, received and to itself;
    # one in ten of those refused. Then 45,000 newer rows of others.
    insert_rows(
        "CASE WHEN mod(g, 5) = 0 AND mod(g / 5, 3) <> 1 THEN %(owner)s ELSE %(b)s END",
        "CASE WHEN mod(g, 5) = 0 AND mod(g / 5, 3) <> 0 THEN %(owner)s ELSE %(c)s END",
        "CASE WHEN mod(g, 50) = 0 THEN 'refused' ELSE 'sealed' END",
        5 * BIG,
        salt="old",
        owner=owner,
        b=b,
        c=c,
    )
    insert_rows("%(c)s", "%(b)s", "'sealed'", NEWER, salt="new", b=b, c=c)
    with connection.cursor() as cursor:
        # Statistics, and the visibility map the planner reads to cost index-only scans.
        cursor.execute("VACUUM ANALYZE ledger_transaction")
    history = AddressHistory(owner)
    visible = list(everything_of(owner).order_by("-id").values_list("id", flat=True))
    assert len(visible) == BIG - BIG // 10

    # The plain query over sender OR recipient reads every row of the address (or
    # every newer row) for its first page: the data shows the problem.
    plain = everything_of(owner).select_related("block").order_by("-id")[: PAGE + 1]
    assert rows_read(plan_of(plain)) >= BIG

    for past in (None, visible[len(visible) // 2]):
        plan = plan_of(history.page_rows(PAGE + 1, past=past))
        kinds = {n["Node Type"] for n in nodes(plan)}
        scans = {n.get("Index Name") for n in nodes(plan) if n.get("Relation Name") == "ledger_transaction"}
        assert not kinds & {"BitmapOr", "Bitmap Heap Scan", "Seq Scan"}, kinds
        for sort in (n for n in nodes(plan) if n["Node Type"] == "Sort"):  # of two index ranges at most
            assert sum(child["Actual Rows"] for child in sort["Plans"]) <= 2 * (PAGE + 1)
        assert rows_read(plan) <= 50 * (PAGE + 1), json.dumps(plan, indent=1)
        if past is None:  # the newest page of an address gone quiet: only these reach it cheaply
            assert {"ledger_tx_sender_id", "ledger_tx_recipient_id"} <= scans, scans
        start = 0 if past is None else visible.index(past) + 1
        assert [t.pk for t in history.page(PAGE + 1, past=past)] == visible[start : start + PAGE + 1]
