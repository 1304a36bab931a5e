"""The chain audit against a live platform: it reads one snapshot, so a block sealed or a
transaction admitted while it replays is not a divergence. Runs on both databases: the
test database is a file on SQLite too, so the second thread's connection is another
process's view, as in ``make run``."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connections

from ledger import services as ledger
from ledger.replay import verify_chain
from ledger.sealer import seal_block
from marketplace.units import UNITS_PER_CREDIT
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_audit_reads_one_snapshot_while_blocks_are_sealed(alice: Any) -> None:
    """A deposit admitted and a block sealed while verify_chain replays. Before it read one
    snapshot, the replay did not see the new block but the account comparison did:
    "account … holds …, replay gives …" on a healthy chain."""
    for i in range(3):
        ledger.deposit(alice, UNITS_PER_CREDIT, reference=f"before:{i}")
        seal_block()
    zed = ledger.ensure_user_account(UserFactory(username="zed")).address
    sealed: list[Any] = []

    def meanwhile(done: int, total: int) -> None:
        if sealed:
            return

        def elsewhere() -> None:  # another process's connection: the platform goes on
            try:
                ledger.deposit(alice, UNITS_PER_CREDIT, reference="during")
                sealed.append(seal_block())
                ledger.transfer(alice, zed, 1, "t")
            finally:
                connections.close_all()

        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join(30)
        assert not thread.is_alive(), "the platform's writes waited on the audit"

    during = verify_chain(progress=meanwhile)
    assert len(sealed) == 1
    assert sealed[0] is not None
    assert during.blocks == 4  # genesis and the three sealed before the audit began
    assert during.pending == 0
    after = verify_chain()
    assert (after.blocks, after.pending) == (during.blocks + 1, 1)
    assert after.deposits == during.deposits + UNITS_PER_CREDIT
