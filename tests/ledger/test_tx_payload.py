"""A transaction's page shows its payload as indented JSON (what was signed is JSON, not a
Python dict), escaped like any other text the sender chose."""

from __future__ import annotations

import html
import json
import re
from typing import Any

import pytest
from django.test import Client

from ledger import services
from ledger.models import Transaction
from tests.factories import UserFactory
from tests.ledger.chain import build_chain
from tests.ledger.helpers import CREDIT

pytestmark = pytest.mark.django_db


def payload_on_page(client: Client, tx_hash: str) -> tuple[str, str]:
    """The payload block as sent (escaped) and as a reader sees it."""
    page = client.get(f"/explorer/tx/{tx_hash}/").content.decode()
    match = re.search(r'<pre class="json" id="tx-payload">(.*?)</pre>', page, re.S)
    assert match, page
    return match.group(1), html.unescape(match.group(1))


def test_the_payload_is_indented_json_with_sorted_keys(assignments: set, client: Client) -> None:
    chain: dict[str, Any] = build_chain(assignments)
    tx = Transaction.objects.get(hash=chain["result_hash"])
    _, shown = payload_on_page(client, tx.hash)
    assert json.loads(shown) == tx.payload
    assert shown == json.dumps(tx.payload, indent=2, sort_keys=True)
    assert '  "compute_result": {\n' in shown
    assert "'compute_result'" not in shown  # not repr() of a dict


def test_a_payload_the_sender_chose_is_escaped(client: Client) -> None:
    reference = '<script>alert("x")</script> & café'
    deposit = services.deposit(UserFactory(username="mallory"), CREDIT, reference)
    raw, shown = payload_on_page(client, deposit.hash)
    assert "<script>" not in raw
    assert "&lt;script&gt;" in raw
    assert json.loads(shown) == {"reference": reference}
