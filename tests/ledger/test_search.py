"""The explorer's search box: a height, an address, or a hash whole or by the short form
the pages show, leads to its page; several matches are listed; none says why."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from ledger.models import Account, AccountKind, Block, Transaction, TxStatus
from protocol import keys
from tests.ledger.chain import build_chain
from tests.ledger.test_history import insert_rows
from tests.plans import nodes, plan_of

SEARCH = "/explorer/search/"


@pytest.fixture
def chain(db: Any, assignments: set) -> dict[str, Any]:
    return build_chain(assignments)


def lands(client: Client, query: str) -> str:
    response = client.get(SEARCH, {"q": query})
    assert response.status_code == 302, (query, response.status_code)
    return str(response["Location"])


def page(client: Client, query: str) -> str:
    response = client.get(SEARCH, {"q": query})
    assert response.status_code == 200, (query, response.status_code)
    return response.content.decode()


def test_a_short_or_whole_hash_opens_its_transaction(chain: dict[str, Any], client: Client) -> None:
    tx_hash = chain["result_hash"]
    for query in (tx_hash, tx_hash[:8], tx_hash[:12].upper(), f"  {tx_hash[:6]} "):
        assert lands(client, query) == f"/explorer/tx/{tx_hash}/"


def test_a_block_hash_prefix_opens_its_block(chain: dict[str, Any], client: Client) -> None:
    block = Block.objects.get(height=2)
    # Long enough to name one thing even if a transaction hash shares its first digits.
    assert lands(client, block.hash[:16]) == "/explorer/blocks/2/"


def test_a_height_and_an_address_open_their_pages(chain: dict[str, Any], client: Client) -> None:
    assert lands(client, "1") == "/explorer/blocks/1/"
    sender = Transaction.objects.exclude(status=TxStatus.REFUSED).first()
    assert sender is not None
    assert lands(client, sender.sender.upper()) == f"/explorer/address/{sender.sender}/"


def test_a_prefix_several_hashes_share_lists_them(chain: dict[str, Any], client: Client) -> None:
    template = Transaction.objects.filter(status=TxStatus.PENDING).first() or Transaction.objects.first()
    assert template is not None
    fields = {f.attname: getattr(template, f.attname) for f in Transaction._meta.concrete_fields if not f.primary_key}
    twins = ["abcdef" + "0" * 58, "abcdef" + "1" * 58]
    for twin in twins:
        pending = {"hash": twin, "status": TxStatus.PENDING, "block_id": None, "reference": None}
        Transaction.objects.create(**{**fields, **pending})
    text = page(client, "abcdef")
    assert 'id="no-match"' not in text
    for twin in twins:
        assert f"/explorer/tx/{twin}/" in text
    assert lands(client, "abcdef1") == f"/explorer/tx/{twins[1]}/"


def test_no_match_says_why_on_a_page_that_searches_again(chain: dict[str, Any], client: Client) -> None:
    taken = set(Transaction.objects.values_list("hash", flat=True)) | set(Block.objects.values_list("hash", flat=True))
    free = next(p for p in ("ffffff", "fedcba", "eeeeee") if not any(h.startswith(p) for h in taken))
    assert f"No block or transaction hash starts with {free}." in page(client, free)
    digits = next(p for p in ("999999", "123456", "777777") if not any(h.startswith(p) for h in taken))
    assert f"No block or transaction hash starts with {digits}, and no block #{int(digits)} yet." in page(
        client, digits
    )
    assert "No block #999; the latest is #" in page(client, "999")
    huge = "1" * 19  # past a bigint: a number still, not only a hash prefix
    assert f"No block or transaction hash starts with {huge}, and no block #{huge} yet." in page(client, huge)
    refused = page(client, "cpc1nothing")
    assert "Not an address" in refused
    assert ".." not in refused.split('id="search-problem">')[1].split("</p>")[0]
    long = page(client, "f" * 100_000)
    assert "That is longer than any height, address or hash (100,000 characters)." in long
    assert len(long) < 20_000  # not echoed back whole
    text = page(client, "e7de<script>")
    assert "Search by block height" in text
    assert "e7de&lt;script&gt;" in text  # the query is echoed escaped
    assert 'name="q"' in text
    assert client.get(SEARCH, {"q": ""})["Location"] == "/explorer/"


def test_the_explorer_form_searches_on_the_server(chain: dict[str, Any], client: Client) -> None:
    text = client.get("/explorer/").content.decode()
    assert f'action="{SEARCH}"' in text
    assert "onsubmit" not in text


@pytest.mark.django_db(transaction=True)  # VACUUM, as autovacuum would have: it runs outside a transaction
@pytest.mark.skipif(connection.vendor != "postgresql", reason="the plan is PostgreSQL's")
def test_every_lookup_of_a_search_reads_an_index_not_the_table() -> None:
    """Anyone may search: a whole hash (admitted or refused) and a prefix each read a
    partial index, never every row."""
    insert_rows("'a'", "'b'", "CASE WHEN mod(g, 10) = 0 THEN 'refused' ELSE 'sealed' END", 20_000, salt="search")
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE ledger_transaction")
    missing = "f" * 64
    lookups = [
        Transaction.objects.exclude(status=TxStatus.REFUSED).filter(hash=missing),
        Transaction.objects.filter(hash=missing, status=TxStatus.REFUSED).order_by("-id")[:1],
        Transaction.objects.exclude(status=TxStatus.REFUSED)
        .filter(hash__gte="abcdef", hash__lt="abcdefg")
        .order_by("hash")[:21],
    ]
    for rows in lookups:
        kinds = {n["Node Type"] for n in nodes(plan_of(rows))}
        assert "Seq Scan" not in kinds, (str(rows.query), kinds)


def test_a_height_as_the_pages_write_it_opens_its_block(chain: dict[str, Any], client: Client) -> None:
    assert lands(client, "#2") == "/explorer/blocks/2/"
    assert lands(client, " #0 ") == "/explorer/blocks/0/"
    text = page(client, "#8")
    assert "No block, transaction, address or task matches “#8”." in text
    assert "No block #8; the latest is #3." in text
    # "#" marks a height: a number that would also be a hash prefix is not read as one.
    assert "No block #12345678; the latest is #3." in page(client, "#12345678")


def test_a_task_id_opens_the_task_for_its_owner_and_its_escrow_for_anyone(
    chain: dict[str, Any], client: Client
) -> None:
    task = chain["task"]
    escrow = Account.objects.get(kind=AccountKind.ESCROW, reference=task)
    assert lands(client, str(task)) == f"/explorer/address/{escrow.address}/"
    assert lands(client, str(task).upper()) == f"/explorer/address/{escrow.address}/"
    client.force_login(chain["bob"])  # not the owner: the ledger's side only
    assert lands(client, str(task)) == f"/explorer/address/{escrow.address}/"
    client.force_login(chain["alice"])
    assert lands(client, str(task)) == f"/tasks/{task}/"
    unknown = uuid.uuid4()
    text = page(client, str(unknown))
    assert f"No block, transaction, address or task matches “{unknown}”." in text
    assert "No task with this id has locked credits on the ledger." in text


def test_a_search_that_finds_nothing_says_so_in_plain_words(chain: dict[str, Any], client: Client) -> None:
    taken = set(Transaction.objects.values_list("hash", flat=True)) | set(Block.objects.values_list("hash", flat=True))
    free = next(p for p in ("ffffffff", "fedcba98", "eeeeeeee") if not any(h.startswith(p) for h in taken))
    unused = keys.from_seed(b"\x07" * 32).address
    for query in (free, "999", "hello", "cpc1nothing", unused, "f" * 300):
        text = page(client, query)
        assert 'id="no-match"' in text, query
        assert "No block, transaction, address or task matches" in text, query
    assert "nothing was ever sent to or from it" in page(client, unused)
