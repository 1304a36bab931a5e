"""The chain audit against a live platform: it reads one snapshot, so a block sealed or a
transaction admitted while it replays is not a divergence. Runs on both databases: the
test database is a file on SQLite too, so the second thread's connection is another
process's view, as in ``make run``."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, connections

from ledger import services as ledger
from ledger.replay import verify_chain
from ledger.sealer import seal_block
from ledger.units import UNITS_PER_CREDIT
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _in_db_transaction() -> bool:
    """Whether this thread's connection has a database transaction open right now."""
    raw = connection.connection
    if raw is None:
        return False
    if connection.vendor == "sqlite":
        return bool(raw.in_transaction)
    from psycopg import pq

    return bool(raw.info.transaction_status != pq.TransactionStatus.IDLE)


def test_the_audit_holds_no_snapshot_over_the_old_blocks_and_one_over_the_rest(alice: Any) -> None:
    """A deposit admitted and a block sealed while verify_chain replays. Before it read one
    snapshot, the replay did not see the new block but the account comparison did:
    "account … holds …, replay gives …" on a healthy chain. Before it replayed the blocks
    it found outside a transaction, it held one snapshot for the whole audit (on
    PostgreSQL, holding back vacuum for as long)."""
    for i in range(3):
        ledger.deposit(alice, UNITS_PER_CREDIT, reference=f"before:{i}")
        seal_block()
    zed = ledger.ensure_user_account(UserFactory(username="zed")).address
    sealed: list[Any] = []
    open_during: list[bool] = []

    def meanwhile(done: int, total: int) -> None:
        open_during.append(_in_db_transaction())
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
    # Genesis and the three blocks sealed before: replayed with no transaction open. The
    # block sealed meanwhile: replayed in the snapshot the comparison reads.
    assert open_during == [False, False, False, False, True]
    assert during.blocks == 5
    assert during.pending == 1  # the transfer admitted meanwhile, replayed on top
    after = verify_chain()
    assert (after.blocks, after.pending, after.deposits) == (during.blocks, 1, during.deposits)
