"""Mempool admission: what is admitted, what is refused and why, and that a refusal
changes nothing."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.conf import settings
from django.db import IntegrityError, transaction

from ledger import custody, gas, services
from ledger.mempool import admit
from ledger.models import SIGNED_COLUMNS, Account, Transaction, TxStatus, signed_columns, tx_from_columns
from ledger.replay import verify_chain
from ledger.sealer import ensure_genesis, seal_block
from protocol import encoding
from protocol.encoding import ComputeResult
from protocol.signing import sign_compute_result
from tests.factories import UserFactory
from tests.ledger.helpers import CREDIT, signed, submit_result, worker_keys

pytestmark = pytest.mark.django_db

W = worker_keys(7)
FEE = gas.fee_for(encoding.SUBMIT_RESULT, settings.LEDGER_GAS_PRICE)


@pytest.fixture
def funded_worker(db: Any) -> Account:
    """A worker that was paid 1 credit, as settlement would pay it before its result."""
    alice: Any = UserFactory(username="alice")
    services.deposit(alice, 5 * CREDIT, "dep-alice")
    services.transfer(alice, W.address, CREDIT, "pay-w")
    return Account.objects.get(address=W.address)


def test_submit_result_with_an_assignment_is_admitted_and_charges_the_fee(
    funded_worker: Account, assignments: set
) -> None:
    task = uuid.uuid4()
    assignments.add((task, W.address))
    (row,) = admit([submit_result(W, 0, task)])
    assert row.status == TxStatus.PENDING, row.reason_detail
    assert row.fee == FEE
    assert row.gas_limit == 80_000
    assert row.gas_price == settings.LEDGER_GAS_PRICE
    funded_worker.refresh_from_db()
    assert funded_worker.available == CREDIT - FEE
    assert funded_worker.next_nonce == 1
    assert funded_worker.public_key == W.public_key.hex()


def test_a_stored_transaction_reads_back_as_the_one_signed(funded_worker: Account, assignments: set) -> None:
    """The row holds every signed field: the Tx built from it (and from the sealer's
    tuple of its columns) is the one submitted, to the byte."""
    task = uuid.uuid4()
    assignments.add((task, W.address))
    sub = submit_result(W, 0, task)
    admit([sub])
    row = Transaction.objects.get(hash=sub.tx.hash().hex())
    assert row.as_tx() == sub.tx
    columns = Transaction.objects.filter(pk=row.pk).values_list(*SIGNED_COLUMNS).get()
    assert tx_from_columns(columns) == sub.tx
    assert tuple(signed_columns(sub.tx).values()) == columns


def _balances() -> list[tuple[str, int, int]]:
    """Every non-empty account's spendable state (an empty account row proves nothing)."""
    rows = Account.objects.order_by("address").values_list("address", "available", "next_nonce", "balance", "nonce")
    return [r[:3] for r in rows if any(r[1:])]


def _refused(sub: Any, code: str) -> Transaction:
    before = _balances()
    (row,) = admit([sub])
    assert row.status == TxStatus.REFUSED
    assert row.reason == code, row.reason_detail
    after = _balances()
    assert after == before, "a refused transaction changed balances"
    return row


def test_refusals_have_codes_and_change_nothing(funded_worker: Account, assignments: set) -> None:
    task = uuid.uuid4()
    assignments.add((task, W.address))
    _refused(submit_result(W, 0, uuid.uuid4()), "no_assignment")
    _refused(submit_result(W, 1, task), "bad_nonce")
    _refused(submit_result(W, 0, task, chain_id="another-chain"), "wrong_chain")
    _refused(submit_result(W, 0, task, gas_limit=1), "bad_gas")
    _refused(submit_result(W, 0, task, fee=1), "bad_fee")
    _refused(submit_result(W, 0, task, gas_price=1), "bad_gas")
    # Signed by another worker's key while claiming W's address.
    other = worker_keys(8)
    sub = submit_result(W, 0, task)
    forged = type(sub)(sub.tx, other.sign(sub.tx.encode()))
    row = _refused(forged, "bad_signature")
    assert Transaction.objects.filter(pk=row.pk, status="refused", reason="bad_signature").exists()


def test_compute_result_must_name_the_sender_as_worker(funded_worker: Account, assignments: set) -> None:
    task = uuid.uuid4()
    other = worker_keys(9)
    assignments.add((task, W.address))
    # W signs a ComputeResult that names another worker, and wraps it in its own tx.
    result = sign_compute_result(ComputeResult(str(task), other.address, "ab" * 32, {}, 0), W)
    sub = signed(W, encoding.SUBMIT_RESULT, W.address, 0, 0, {"compute_result": result.to_json()})
    row = _refused(sub, "bad_compute_result")
    assert "worker_address" in row.reason_detail
    # A result signed by another worker's key is refused too.
    stolen = sign_compute_result(ComputeResult(str(task), W.address, "ab" * 32, {}, 0), other)
    sub = signed(W, encoding.SUBMIT_RESULT, W.address, 0, 0, {"compute_result": stolen.to_json()})
    assert "signature" in _refused(sub, "bad_compute_result").reason_detail


def test_replay_and_second_result_are_refused(funded_worker: Account, assignments: set) -> None:
    task = uuid.uuid4()
    assignments.add((task, W.address))
    first = submit_result(W, 0, task)
    assert admit([first])[0].status == TxStatus.PENDING
    _refused(first, "duplicate")
    _refused(submit_result(W, 1, task), "result_already_submitted")


def test_the_fee_must_be_covered(db: Any, assignments: set) -> None:
    poor = worker_keys(10)
    task = uuid.uuid4()
    assignments.add((task, poor.address))
    alice: Any = UserFactory(username="alice")
    services.deposit(alice, CREDIT, "dep")
    services.transfer(alice, poor.address, FEE - 1, "almost")
    _refused(submit_result(poor, 0, task), "insufficient_funds")


def test_unknown_sender_and_no_checker(db: Any, no_assignment_checker: None) -> None:
    stranger = worker_keys(11)
    _refused(submit_result(stranger, 0), "assignment_unverifiable")
    _refused(signed(stranger, encoding.TRANSFER, W.address, 5, 0, {}), "unknown_sender")


def test_only_the_treasury_deposits(db: Any) -> None:
    services.ensure_user_account(UserFactory(username="alice"))
    mallory = worker_keys(12)
    _refused(signed(mallory, encoding.DEPOSIT, mallory.address, 10**12, 0, {}), "bad_sender")


def test_a_batch_applies_in_order_and_refuses_only_the_bad_ones(funded_worker: Account, assignments: set) -> None:
    tasks = [uuid.uuid4() for _ in range(3)]
    for t in tasks:
        assignments.add((t, W.address))
    rows = admit([submit_result(W, 0, tasks[0]), submit_result(W, 2, tasks[1]), submit_result(W, 1, tasks[2])])
    assert [r.status for r in rows] == ["pending", "refused", "pending"]
    assert rows[1].reason == "bad_nonce"


def test_the_database_itself_refuses_a_second_admitted_transaction_with_a_hash(
    funded_worker: Account, assignments: set
) -> None:
    task = uuid.uuid4()
    assignments.add((task, W.address))
    (row,) = admit([submit_result(W, 0, task)])
    copy = Transaction.objects.get(pk=row.pk)
    copy.pk = None
    copy.reference = None
    copy.status = TxStatus.REFUSED  # refused copies may repeat a hash: they can be fixed and resent
    copy.save()
    copy.pk = None
    copy.status = TxStatus.PENDING
    with pytest.raises(IntegrityError), transaction.atomic():
        copy.save()


def _deposit(to: str, amount: int, nonce: int) -> Any:
    """A DEPOSIT signed by the treasury, as the platform signs it."""
    return signed(custody.treasury_keys(), encoding.DEPOSIT, to, amount, nonce, {})


def test_a_batch_can_spend_what_an_earlier_transaction_of_it_created(db: Any) -> None:
    ensure_genesis()
    alice, bob = worker_keys(20), worker_keys(21)  # neither has an account yet
    transfer_fee = gas.fee_for(encoding.TRANSFER, settings.LEDGER_GAS_PRICE)
    rows = admit([_deposit(alice.address, CREDIT, 0), signed(alice, encoding.TRANSFER, bob.address, 5, 0, {})])
    assert [(r.status, r.reason) for r in rows] == [("pending", ""), ("pending", "")]
    held = dict(Account.objects.filter(address__in=[alice.address, bob.address]).values_list("address", "available"))
    assert held == {alice.address: CREDIT - 5 - transfer_fee, bob.address: 5}
    seal_block()
    assert verify_chain().transactions == 2


def test_a_batch_refuses_a_sender_whose_account_only_a_later_transaction_creates(db: Any) -> None:
    ensure_genesis()
    alice, bob = worker_keys(20), worker_keys(21)
    rows = admit([signed(alice, encoding.TRANSFER, bob.address, 5, 0, {}), _deposit(alice.address, CREDIT, 0)])
    # As if admitted one at a time: alice had no account when her transfer came.
    assert [(r.status, r.reason) for r in rows] == [("refused", "unknown_sender"), ("pending", "")]
    assert Account.objects.get(address=alice.address).available == CREDIT
    assert not Account.objects.filter(address=bob.address).exists()
