"""Build a small but complete chain through the real services, for audit tests."""

from __future__ import annotations

import uuid
from typing import Any

from ledger import services
from ledger.mempool import admit
from ledger.sealer import seal_block
from tests.factories import UserFactory
from tests.ledger.helpers import CREDIT, submit_result, worker_keys


def build_chain(assignments: set[tuple[uuid.UUID, str]]) -> dict[str, Any]:
    """Three blocks: deposits; escrow + reward + a worker's SUBMIT_RESULT; refund + payout."""
    alice: Any = UserFactory(username="alice")
    bob: Any = UserFactory(username="bob")
    worker = worker_keys(42)
    services.deposit(alice, 20 * CREDIT, "d-alice")
    services.deposit(bob, 5 * CREDIT, "d-bob")
    seal_block()
    task = uuid.uuid4()
    services.lock_escrow(task, alice, 8 * CREDIT, f"escrow:{task}")
    services.release_to_worker(task, worker.address, 3 * CREDIT, f"reward:{task}")
    assignments.add((task, worker.address))
    (result,) = admit([submit_result(worker, 0, task)])
    assert result.status == "pending", result.reason_detail
    seal_block()
    services.refund(task, f"refund:{task}")
    services.payout(bob, 2 * CREDIT, "bank:bob")
    seal_block()
    services.deposit(bob, CREDIT, "d-bob-2")  # left pending (same reference: idempotent)
    return {"alice": alice, "bob": bob, "worker": worker, "task": task, "result_hash": result.hash}
