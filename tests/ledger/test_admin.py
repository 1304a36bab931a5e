"""The admin shows the ledger but cannot change it."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from ledger import services
from ledger.models import Block, Transaction
from ledger.sealer import seal_block
from marketplace.models import User
from tests.ledger.helpers import CREDIT

pytestmark = pytest.mark.django_db


def test_blocks_and_transactions_are_read_only_in_the_admin(client: Client) -> None:
    admin: Any = User.objects.create_superuser("root", "root@example.com", "pw-root-123456")
    services.deposit(admin, CREDIT, "d")
    block = seal_block()
    assert block is not None
    tx = Transaction.objects.get(reference="d")
    client.force_login(admin)
    assert client.get("/admin/ledger/block/").status_code == 200
    assert tx.hash[:12] in client.get("/admin/ledger/transaction/").content.decode()
    assert client.get("/admin/ledger/block/add/").status_code == 403
    page = client.get(f"/admin/ledger/transaction/{tx.pk}/change/")
    assert page.status_code == 200
    assert 'type="submit"' not in page.content.decode().split('id="transaction_form"')[-1].split("</form>")[0]
    client.post(f"/admin/ledger/block/{block.pk}/delete/", {"post": "yes"})
    assert Block.objects.filter(pk=block.pk).exists()
