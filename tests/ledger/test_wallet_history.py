"""The wallet's history as its owner reads it: when, what in plain words, in or out with a
signed amount, a link to the task a line is about, and balances named without jargon."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from ledger import services
from ledger.entries import entry
from ledger.models import Transaction, TxType
from tests.ledger.chain import build_chain


@pytest.fixture
def chain(db: Any, assignments: set) -> dict[str, Any]:
    return build_chain(assignments)


def rows_of(client: Client, user: Any) -> list[str]:
    client.force_login(user)
    response = client.get("/wallet/")
    assert response.status_code == 200
    table = response.content.decode().split('id="wallet-history"')[1].split("</table>")[0]
    return [re.sub(r"\s+", " ", row) for row in table.split("<tr>")[2:]]


def row_with(rows: list[str], words: str) -> str:
    (row,) = [r for r in rows if words in r]
    return row


def test_each_line_says_what_it_was_which_way_and_when(chain: dict[str, Any], client: Client) -> None:
    task = str(chain["task"])
    rows = rows_of(client, chain["alice"])
    deposit = row_with(rows, "Deposit (card payment)")
    assert "<td>In</td>" in deposit
    assert ">+20<" in deposit
    assert re.search(r'<time datetime="[^"]+" title="\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC">just now</time>', deposit)
    lock = row_with(rows, f"Escrow for task {task[:8]}")
    assert "<td>Out</td>" in lock
    assert 'class="num amount-out">−8<' in lock
    assert f'href="/tasks/{task}/"' in lock
    refund = row_with(rows, f"Refund from task {task[:8]}")
    assert "<td>In</td>" in refund
    assert 'class="num amount-in">+' in refund
    assert f'href="/tasks/{task}/"' in refund
    # A line about no task links to none.
    assert "/tasks/" not in deposit


def test_payouts_and_signed_amounts_add_up(chain: dict[str, Any], client: Client) -> None:
    rows = rows_of(client, chain["bob"])
    payout = row_with(rows, "Payout to your bank")
    assert "<td>Out</td>" in payout
    assert "fee</span>" in payout  # what left the account: the amount and the gas fee
    tx = Transaction.objects.get(type=TxType.PAYOUT)
    bob = services.ensure_user_account(chain["bob"])
    line = entry(tx, bob.address)
    assert line.amount == -(tx.amount + tx.fee)
    # Bob's balance is what his lines add up to.
    history = Transaction.objects.exclude(status="refused").filter(sender=bob.address) | Transaction.objects.exclude(
        status="refused"
    ).filter(recipient=bob.address)
    assert sum(entry(t, bob.address).amount for t in history) == bob.available


def test_balances_are_named_in_plain_words(chain: dict[str, Any], client: Client) -> None:
    client.force_login(chain["alice"])
    text = client.get("/wallet/").content.decode()
    assert "Sealed balance" not in text
    assert "Confirmed balance (in sealed blocks)" in text
    assert 'id="balance-help"' in text


def test_the_worker_side_reads_as_rewards(chain: dict[str, Any]) -> None:
    worker = chain["worker"].address
    reward = Transaction.objects.get(type=TxType.ESCROW_RELEASE, recipient=worker)
    line = entry(reward, worker)
    assert line.words == f"Reward for task {str(chain['task'])[:8]}"
    assert line.direction == "in"
    result = Transaction.objects.get(type=TxType.SUBMIT_RESULT)
    line = entry(result, worker)
    assert line.task_id == str(chain["task"])
    assert line.direction == ""
    assert line.amount == -result.fee


def test_a_payload_with_a_bad_task_id_links_to_nothing(chain: dict[str, Any]) -> None:
    tx = Transaction.objects.get(type=TxType.PAYOUT)
    tx.payload = {"task_id": "../../admin"}
    assert entry(tx, tx.sender).task_id is None
