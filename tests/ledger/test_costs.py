"""A task's cost summary, summed from its ledger transactions (ledger/costs.py)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.conf import settings

from ledger import gas, services
from ledger.costs import task_costs
from ledger.mempool import admit
from ledger.models import Transaction, TxStatus
from protocol import encoding
from tests.factories import UserFactory
from tests.ledger.helpers import CREDIT, submit_result, worker_keys

ESCROW, OWNER, WORKER, PLATFORM = "escrow", "owner", "worker", "platform"


def _tx(tx_type: str, sender: str, recipient: str, amount: int, fee: int = 0, **payload: Any) -> Transaction:
    return Transaction(
        type=tx_type, sender=sender, recipient=recipient, amount=amount, fee=fee, payload=payload, status="sealed"
    )


def test_the_fee_is_what_the_fee_transactions_took_however_it_is_charged() -> None:
    """Charged out of the reward or on top of it, the summary reads the FEE transactions
    and the releases: no fee rate enters, and the parts add up to the escrow."""
    out_of_reward = [
        _tx(encoding.ESCROW_LOCK, OWNER, ESCROW, 1_000),
        _tx(encoding.ESCROW_RELEASE, ESCROW, WORKER, 570, kind="reward"),
        _tx(encoding.FEE, ESCROW, PLATFORM, 30),
        _tx(encoding.SUBMIT_RESULT, WORKER, WORKER, 0, fee=4),
        _tx(encoding.ESCROW_RELEASE, ESCROW, OWNER, 400, kind="refund"),
    ]
    on_top = [
        _tx(encoding.ESCROW_LOCK, OWNER, ESCROW, 1_000),
        _tx(encoding.ESCROW_RELEASE, ESCROW, WORKER, 600, kind="reward"),
        _tx(encoding.FEE, ESCROW, PLATFORM, 30),
        _tx(encoding.SUBMIT_RESULT, WORKER, WORKER, 0, fee=4),
        _tx(encoding.ESCROW_RELEASE, ESCROW, OWNER, 370, kind="refund"),
    ]
    a, b = task_costs(out_of_reward), task_costs(on_top)
    assert (a.paid_to_workers, a.platform_fee, a.worker_gas, a.refunded, a.held) == (570, 30, 4, 400, 0)
    assert (b.paid_to_workers, b.platform_fee, b.worker_gas, b.refunded, b.held) == (600, 30, 4, 370, 0)
    for c in (a, b):
        assert c.paid_to_workers + c.platform_fee + c.refunded + c.held == c.escrowed == 1_000
        assert c.spent == c.escrowed - c.refunded
        assert c.workers_kept == c.paid_to_workers - c.worker_gas


def test_refused_transactions_and_unsettled_escrow() -> None:
    refused = _tx(encoding.ESCROW_RELEASE, ESCROW, WORKER, 500, kind="reward")
    refused.status = TxStatus.REFUSED
    costs = task_costs([_tx(encoding.ESCROW_LOCK, OWNER, ESCROW, 1_000), refused])
    assert (costs.paid_to_workers, costs.held, costs.spent) == (0, 1_000, 0)
    assert task_costs([]).escrowed == 0


@pytest.mark.django_db
def test_a_settled_task_through_the_real_services(assignments: set) -> None:
    alice: Any = UserFactory(username="alice")
    services.deposit(alice, 5 * CREDIT, "d")
    worker = worker_keys(61)
    task = uuid.uuid4()
    services.lock_escrow(task, alice, 2 * CREDIT, f"escrow:{task}")
    services.release_to_worker(task, worker.address, CREDIT, f"reward:{task}")
    assignments.add((task, worker.address))
    (result,) = admit([submit_result(worker, 0, task)])
    assert result.status == TxStatus.PENDING, result.reason_detail
    services.refund(task, f"refund:{task}")

    costs = task_costs(services.task_transactions(task, [worker.address]))
    assert costs.escrowed == 2 * CREDIT
    assert costs.worker_gas == gas.fee_for(encoding.SUBMIT_RESULT, settings.LEDGER_GAS_PRICE)
    fees = Transaction.objects.filter(type=encoding.FEE, payload__task_id=str(task))
    assert costs.platform_fee == sum(t.amount for t in fees)
    assert costs.paid_to_workers + costs.platform_fee + costs.refunded == 2 * CREDIT
    assert costs.held == 0
    assert services.balance(alice) == 5 * CREDIT - costs.spent
