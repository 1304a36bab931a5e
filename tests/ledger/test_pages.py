"""Explorer and wallet pages as a visitor sees them, and /ws/blocks/ live updates."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from config.asgi import application
from ledger import services
from ledger.models import Block
from ledger.sealer import seal_block
from tests.factories import PASSWORD, UserFactory
from tests.ledger.chain import build_chain
from tests.ledger.helpers import CREDIT


@pytest.fixture
def chain(db: Any, assignments: set) -> dict[str, Any]:
    return build_chain(assignments)


def test_explorer_lists_blocks_and_links_to_them(chain: dict[str, Any], client: Client) -> None:
    res = client.get("/explorer/")
    assert res.status_code == 200
    text = res.content.decode()
    assert "Latest blocks" in text
    for height in range(4):
        assert f'href="/explorer/blocks/{height}/"' in text
    assert "/ws/blocks/" in text


def test_block_page_shows_the_header_and_transactions(chain: dict[str, Any], client: Client) -> None:
    block = Block.objects.get(height=2)
    text = client.get("/explorer/blocks/2/").content.decode()
    assert block.compute_root in text
    assert "Submit result" in text
    assert "Escrow lock" in text
    assert client.get("/explorer/blocks/42/").status_code == 404


def test_block_pages_link_to_blocks_that_exist(chain: dict[str, Any], client: Client) -> None:
    head = Block.objects.order_by("-height").first()
    assert head is not None
    middle = client.get(f"/explorer/blocks/{head.height - 1}/").content.decode()
    assert f'href="/explorer/blocks/{head.height}/"' in middle
    newest = client.get(f"/explorer/blocks/{head.height}/").content.decode()
    assert f'href="/explorer/blocks/{head.height + 1}/"' not in newest  # it would 404
    assert f'href="/explorer/blocks/{head.height - 1}/"' in newest


def test_transaction_page_shows_a_verified_proof(chain: dict[str, Any], client: Client) -> None:
    text = client.get(f"/explorer/tx/{chain['result_hash']}/").content.decode()
    assert "Sealed · proof verified" in text
    assert "ComputeResult under compute_root" in text
    pending = services.deposit(chain["bob"], CREDIT, "late")
    assert "Pending" in client.get(f"/explorer/tx/{pending.hash}/").content.decode()
    assert client.get("/explorer/tx/deadbeef/").status_code == 404


def test_address_page_and_a_bad_address(chain: dict[str, Any], client: Client) -> None:
    text = client.get(f"/explorer/address/{chain['worker'].address}/").content.decode()
    assert "Worker account" in text
    assert "2.8496 credits" in text  # 3 × 0.95 reward − 0.0004 gas
    bad = client.get("/explorer/address/cpc1notreal/")
    assert bad.status_code == 400
    assert "Not an address" in bad.content.decode()


def test_wallet_needs_a_login_and_shows_balance_and_escrow(db: Any, client: Client) -> None:
    assert client.get("/wallet/").status_code == 302
    carol: Any = UserFactory(username="carol")
    services.deposit(carol, 10 * CREDIT, "d")
    import uuid

    task = uuid.uuid4()
    services.lock_escrow(task, carol, 4 * CREDIT, f"escrow:{task}")
    assert client.login(username="carol", password=PASSWORD)
    text = client.get("/wallet/").content.decode()
    assert '<dd id="wallet-balance">6 credits</dd>' in text
    assert '<dd id="wallet-escrow">4 credits</dd>' in text
    assert f"Escrow for task {str(task)[:8]}" in text


def test_a_new_user_sees_how_to_get_credits(db: Any, client: Client) -> None:
    UserFactory(username="dave")
    assert client.login(username="dave", password=PASSWORD)
    text = client.get("/wallet/").content.decode()
    assert "No credits yet" in text
    assert '<dd id="wallet-balance">0 credits</dd>' in text


@pytest.mark.django_db(transaction=True)
def test_ws_blocks_pushes_each_sealed_block() -> None:
    async_to_sync(_ws_blocks)()


async def _ws_blocks() -> None:
    ws = WebsocketCommunicator(application, "/ws/blocks/", headers=[(b"origin", b"http://testserver")])
    connected, _ = await ws.connect()
    assert connected
    erin = await database_sync_to_async(UserFactory)(username="erin")
    await database_sync_to_async(services.deposit)(erin, CREDIT, "d")
    block = await database_sync_to_async(seal_block)()
    event = await ws.receive_json_from(timeout=5)
    assert event["type"] == "block.sealed"
    assert event["height"] == block.height == 1
    assert event["tx_count"] == 1
    assert event["hash"] == block.hash
    await ws.disconnect()
