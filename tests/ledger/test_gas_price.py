"""The gas price: small enough that gas never eats a provider's pay, and a chain built
under the old price of 1,000 units per gas still verifies, and its mempool still seals,
after the price drops to the default."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from config.settings import LEDGER_GAS_PRICE as DEFAULT_GAS_PRICE
from config.settings import MIN_TASK_PRICE_UNITS as DEFAULT_MIN_TASK_PRICE
from ledger import gas, services
from ledger.mempool import admit
from ledger.models import Account, Transaction, TxStatus
from ledger.replay import verify_chain
from ledger.sealer import seal_block
from protocol import encoding
from tests.ledger.chain import build_chain
from tests.ledger.helpers import CREDIT, signed, submit_result, worker_keys

OLD_PRICE = 1_000


def test_a_result_and_a_sweep_cost_at_most_one_percent_of_the_cheapest_task() -> None:
    """At the shipped defaults a provider keeps at least 99 % of the cheapest job after the
    gas of its SUBMIT_RESULT and of one sweep."""
    submit = gas.fee_for(encoding.SUBMIT_RESULT, DEFAULT_GAS_PRICE)
    sweep = gas.fee_for(encoding.TRANSFER, DEFAULT_GAS_PRICE)
    assert gas.gas_limit(encoding.SUBMIT_RESULT) == 80_000
    assert submit * 100 <= DEFAULT_MIN_TASK_PRICE
    assert sweep * 100 <= DEFAULT_MIN_TASK_PRICE
    assert (submit + sweep) * 100 <= DEFAULT_MIN_TASK_PRICE
    assert (submit, sweep) == (400_000, 105_000)


def test_the_node_signs_at_the_default_gas_price() -> None:
    """The node's own ceiling (workers/agent/trust.py) accepts the platform's default."""
    from workers.agent.trust import DEFAULT_MAX_GAS_PRICE

    assert DEFAULT_GAS_PRICE <= DEFAULT_MAX_GAS_PRICE
    assert OLD_PRICE <= DEFAULT_MAX_GAS_PRICE


def _settle(task: uuid.UUID, worker: Any, nonce: int, requester: Any, assignments: set) -> Transaction:
    """Escrow, reward and the worker's signed result (at the gas price in force), as
    settlement does; the result row is returned pending."""
    services.lock_escrow(task, requester, 2 * CREDIT, f"escrow:{task}")
    services.release_to_worker(task, worker.address, CREDIT, f"reward:{task}")
    assignments.add((task, worker.address))
    (row,) = admit([submit_result(worker, nonce, task)])
    assert row.status == TxStatus.PENDING, row.reason_detail
    return row


@pytest.mark.django_db
def test_a_chain_built_at_the_old_price_verifies_and_seals_after_the_change(assignments: set) -> None:
    worker = worker_keys(42)
    with override_settings(LEDGER_GAS_PRICE=OLD_PRICE):
        chain = build_chain(assignments)  # deposits, escrow, a settled SUBMIT_RESULT, refund, payout; sealed
        old_sealed = Transaction.objects.get(hash=chain["result_hash"])
        # Left in the mempool at the old price: a second result and a sweep-like TRANSFER.
        old_result = _settle(uuid.uuid4(), worker, 1, chain["alice"], assignments)
        owner = services.ensure_user_account(chain["alice"]).address
        (old_sweep,) = admit([signed(worker, encoding.TRANSFER, owner, CREDIT // 2, 2, {"memo": "sweep"})])
        assert old_sweep.status == TxStatus.PENDING, old_sweep.reason_detail
        # Signed at the old price but submitted only after the change (a node that fetched
        # its template before the restart): made here, admitted below.
        late = signed(worker, encoding.TRANSFER, owner, 1, 3, {"memo": "sweep"})
    assert old_sealed.gas_price == OLD_PRICE
    assert old_sealed.fee == 80_000_000

    assert settings.LEDGER_GAS_PRICE == DEFAULT_GAS_PRICE
    (late_row,) = admit([late])
    assert late_row.status == TxStatus.PENDING, late_row.reason_detail
    new_result = _settle(uuid.uuid4(), worker, 4, chain["bob"], assignments)
    assert new_result.gas_price == DEFAULT_GAS_PRICE
    assert new_result.fee == gas.fee_for(encoding.SUBMIT_RESULT, DEFAULT_GAS_PRICE)
    # Before sealing: the mempool replays on top of the sealed state at both prices.
    verify_chain()
    assert seal_block() is not None
    for row in (old_result, old_sweep, late_row, new_result):
        row.refresh_from_db()
        assert row.status == TxStatus.SEALED
    assert {old_result.gas_price, old_sweep.gas_price, late_row.gas_price} == {OLD_PRICE}

    summary = verify_chain()
    assert summary.pending == 0
    assert summary.total_balance == summary.deposits - summary.payouts - summary.reversals
    balances = dict(Account.objects.values_list("address", "balance"))
    assert sum(balances.values()) == summary.total_balance
    # The worker paid each transaction's own fee: two results and two transfers at the
    # old price, one result at the new one, out of its rewards.
    rewards = sum(
        t.amount
        for t in Transaction.objects.filter(type=encoding.ESCROW_RELEASE, recipient=worker.address)
        if t.payload["kind"] == "reward"
    )
    paid_gas = (
        gas.fee_for(encoding.SUBMIT_RESULT, OLD_PRICE) * 2
        + gas.fee_for(encoding.TRANSFER, OLD_PRICE) * 2
        + gas.fee_for(encoding.SUBMIT_RESULT, DEFAULT_GAS_PRICE)
    )
    assert balances[worker.address] == rewards - paid_gas - (CREDIT // 2 + 1)


@pytest.mark.django_db
def test_a_transaction_below_the_new_price_is_still_refused(assignments: set) -> None:
    """Lowering the price lowers the floor; it does not remove it."""
    worker = worker_keys(50)
    task = uuid.uuid4()
    assignments.add((task, worker.address))
    (row,) = admit([submit_result(worker, 0, task, gas_price=DEFAULT_GAS_PRICE - 1)])
    assert (row.status, row.reason) == (TxStatus.REFUSED, "bad_gas")
