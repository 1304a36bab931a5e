"""A big batch goes into the ledger with PostgreSQL's COPY (``ledger.bulk``): every row
it writes reads back as the transaction that was signed, hash and payload included, and
seals into a chain that verifies. Smaller batches, and SQLite, insert row by row."""

from __future__ import annotations

import pytest
from django.db import connection

from ledger import bulk, custody
from ledger.mempool import admit_batches
from ledger.models import Transaction
from ledger.replay import verify_chain
from ledger.sealer import ensure_genesis, seal_all
from protocol import encoding
from tests.ledger.helpers import CREDIT, signed, worker_keys

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="COPY is PostgreSQL's"),
]


def test_a_batch_written_with_copy_reads_back_as_signed_and_seals() -> None:
    ensure_genesis()
    treasury = custody.treasury_keys()
    count = bulk.COPY_MIN + 36
    subs = [
        signed(treasury, encoding.DEPOSIT, worker_keys(500 + i).address, CREDIT + i, i, {"reference": f"bulk-{i}"})
        for i in range(count)
    ]
    (rows,) = list(admit_batches([subs]))
    assert [r.status for r in rows] == ["pending"] * count
    stored = {t.hash: t for t in Transaction.objects.filter(pk__in=[r.pk for r in rows])}
    assert len(stored) == count
    for sub, row in zip(subs, rows, strict=True):
        back = stored[row.hash]
        assert back.as_tx() == sub.tx
        assert back.signature == sub.signature.hex()
        assert back.payload == {"reference": f"bulk-{sub.tx.nonce}"}
    assert [r.pk for r in rows] == sorted(r.pk for r in rows)  # admission order
    seal_all()
    summary = verify_chain()
    assert summary.pending == 0
    assert summary.transactions >= count
