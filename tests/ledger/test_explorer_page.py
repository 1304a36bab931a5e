"""The explorer's front page as a visitor sees it: network figures, the latest blocks and
transactions side by side, relative times with the absolute time at hand, copy buttons,
and the system accounts named wherever their addresses appear."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

import pytest
from django.test import Client

from ledger import custody, services
from ledger.models import Account, AccountKind, Block, Transaction, TxStatus
from ledger.sealer import seal_block
from tests.ledger.chain import build_chain
from tests.ledger.helpers import CREDIT


@pytest.fixture
def chain(db: Any, assignments: set) -> dict[str, Any]:
    return build_chain(assignments)


def text_of(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200
    return response.content.decode()


def test_the_front_page_shows_the_network_figures(chain: dict[str, Any], client: Client) -> None:
    text = text_of(client, "/explorer/")
    head = Block.objects.order_by("-height").first()
    assert head is not None
    sealed = Transaction.objects.filter(status=TxStatus.SEALED).count()
    pending = Transaction.objects.filter(status=TxStatus.PENDING).count()
    assert pending == 1  # build_chain leaves one deposit waiting
    fees = Account.objects.get(address=custody.validator_keys().address).balance
    assert fees > 0
    assert f'<dd id="stat-height">#{head.height}</dd>' in text
    assert f'<dd id="stat-sealed">{sealed}</dd>' in text
    assert f'<dd id="stat-pending">{pending}</dd>' in text
    assert f'<dd id="stat-accounts">{Account.objects.count()}</dd>' in text
    assert f'<dd id="stat-fees">{fees / CREDIT:g} credits</dd>' in text


def test_an_empty_ledger_says_so_and_does_not_fail(db: Any, client: Client) -> None:
    text = text_of(client, "/explorer/")
    assert '<dd id="stat-height">none yet</dd>' in text
    assert '<dd id="stat-fees">0 credits</dd>' in text
    assert "No blocks yet" in text
    assert "No transactions yet" in text


def test_latest_transactions_are_listed_beside_the_blocks(chain: dict[str, Any], client: Client) -> None:
    text = text_of(client, "/explorer/")
    assert "Latest transactions" in text
    assert "Latest blocks" in text
    assert 'class="explorer-columns"' in text
    latest = text.split('id="latest-txs"')[1]
    pending = Transaction.objects.get(status=TxStatus.PENDING)
    # Newest first: the pending deposit heads the list, marked as pending.
    first_row = latest.split("<tr>")[2]
    assert f"/explorer/tx/{pending.hash}/" in first_row
    assert "Pending" in first_row
    assert f"/explorer/tx/{chain['result_hash']}/" in latest


def test_times_are_relative_with_the_absolute_time_in_a_title(chain: dict[str, Any], client: Client) -> None:
    text = text_of(client, "/explorer/")
    block = Block.objects.get(height=1)
    stamp = block.timestamp.strftime("%Y-%m-%d %H:%M:%S")
    times = re.findall(r'<time datetime="([^"]+)" title="([^"]+)">([^<]+)</time>', text)
    assert (block.timestamp, f"{stamp} UTC") in {(datetime.fromisoformat(d), title) for d, title, _ in times}, times
    assert all(re.fullmatch(r"just now|\d+\xa0\w+ ago", shown) for _, _, shown in times), times
    assert "just now</time>" in text  # the transactions were all made a moment ago


def test_system_accounts_are_named_wherever_their_address_is_shown(chain: dict[str, Any], client: Client) -> None:
    treasury = custody.treasury_keys().address
    escrow = Account.objects.get(kind=AccountKind.ESCROW)
    front = text_of(client, "/explorer/")
    assert "Treasury</span>" in front
    assert f"Escrow of task {str(chain['task'])[:8]}</span>" in front
    assert "Fee collector (validator)</span>" in front
    block = text_of(client, "/explorer/blocks/2/")
    assert "Fee collector (validator)</span>" in block  # the proposer, and every fee's recipient
    assert f"Escrow of task {str(chain['task'])[:8]}</span>" in block
    account = text_of(client, f"/explorer/address/{escrow.address}/")
    assert f'<span id="account-name">Escrow of task {str(chain["task"])[:8]}</span>' in account
    assert '<span id="account-name">Treasury</span>' in text_of(client, f"/explorer/address/{treasury}/")
    deposit = Transaction.objects.filter(sender=treasury).first()
    assert deposit is not None
    assert "Treasury</span>" in text_of(client, f"/explorer/tx/{deposit.hash}/")
    # A user's own account carries no name.
    alice = services.ensure_user_account(chain["alice"])
    assert 'id="account-name"' not in text_of(client, f"/explorer/address/{alice.address}/")


def test_hashes_and_addresses_have_copy_buttons_hidden_without_scripts(chain: dict[str, Any], client: Client) -> None:
    text = text_of(client, "/explorer/")
    block = Block.objects.get(height=2)
    assert f'data-copy-text="{block.hash}"' in text
    assert f'data-copy-text="{chain["result_hash"]}"' in text
    # Rendered hidden: app.js shows them where the clipboard can be used; without it the
    # value stays plain text and no dead button is left.
    for button in re.findall(r"<button[^>]*data-copy-text[^>]*>", text):
        assert " hidden" in button, button
    tx_page = text_of(client, f"/explorer/tx/{chain['result_hash']}/")
    assert f'data-copy-text="{chain["result_hash"]}"' in tx_page


def test_the_front_page_reads_a_fixed_number_of_queries(
    chain: dict[str, Any], client: Client, django_assert_max_num_queries: Any
) -> None:
    """However many blocks, transactions and accounts: a page of blocks (count, rows), the
    latest transactions with their blocks, the escrow names, and three aggregates."""
    with django_assert_max_num_queries(7):
        client.get("/explorer/")
    for n in range(5):
        services.deposit(chain["bob"], CREDIT, f"more-{n}")
        seal_block()
    with django_assert_max_num_queries(7):
        client.get("/explorer/")
