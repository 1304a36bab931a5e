"""The services other apps call: deposit, escrow, release, refund, balances."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.conf import settings

from ledger import custody, gas, services
from ledger.models import Account, AccountKind, Transaction
from ledger.sealer import seal_block
from ledger.services import InsufficientFunds, LedgerError
from protocol import encoding, keys
from tests.factories import UserFactory
from tests.ledger.helpers import CREDIT, worker_keys

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice(db: Any) -> Any:
    return UserFactory(username="alice")


def test_user_account_is_custodial_with_the_key_encrypted(alice: Any) -> None:
    account = services.ensure_user_account(alice)
    assert services.ensure_user_account(alice).pk == account.pk
    assert account.address.startswith("cpc1")
    raw = Account.objects.get(pk=account.pk).encrypted_key
    assert raw is not None
    stored = bytes(raw)
    pair = keys.from_seed(custody.decrypt_seed(stored))
    assert pair.address == account.address
    assert pair.seed not in stored


def test_deposit_is_idempotent_and_seals_into_the_balance(alice: Any) -> None:
    first = services.deposit(alice, 3 * CREDIT, "stripe:pi_1")
    again = services.deposit(alice, 3 * CREDIT, "stripe:pi_1")
    assert again.pk == first.pk
    assert services.balance(alice) == 3 * CREDIT
    account = Account.objects.get(user=alice)
    assert account.balance == 0  # not sealed yet
    seal_block()
    account.refresh_from_db()
    assert (account.balance, account.available) == (3 * CREDIT, 3 * CREDIT)
    assert Transaction.objects.filter(reference="stripe:pi_1").count() == 1


@pytest.mark.parametrize("amount", [0, -5, 1.5, "10"])
def test_bad_amounts_are_refused_naming_the_field(alice: Any, amount: Any) -> None:
    with pytest.raises(LedgerError) as err:
        services.deposit(alice, amount, "x")
    assert err.value.field == "amount"


def test_lock_escrow_moves_money_and_refuses_an_overdraft(alice: Any) -> None:
    services.deposit(alice, 5 * CREDIT, "d1")
    task = uuid.uuid4()
    tx = services.lock_escrow(task, alice, 4 * CREDIT, f"escrow:{task}")
    assert services.lock_escrow(task, alice, 4 * CREDIT, f"escrow:{task}").pk == tx.pk
    assert services.balance(alice) == CREDIT
    assert services.escrowed(alice) == 4 * CREDIT
    other = uuid.uuid4()
    with pytest.raises(InsufficientFunds):
        services.lock_escrow(other, alice, 2 * CREDIT, f"escrow:{other}")
    assert services.balance(alice) == CREDIT
    assert not Account.objects.filter(kind=AccountKind.ESCROW, reference=other).exists()


def test_release_pays_the_worker_minus_the_platform_fee_then_refund_returns_the_rest(alice: Any, settings: Any) -> None:
    settings.LEDGER_PLATFORM_FEE_BPS = 500
    worker = worker_keys(3)
    services.deposit(alice, 10 * CREDIT, "d1")
    task = uuid.uuid4()
    services.lock_escrow(task, alice, 6 * CREDIT, f"escrow:{task}")
    release = services.release_to_worker(task, worker.address, 4 * CREDIT, f"reward:{task}:1")
    assert release.amount == 4 * CREDIT * 95 // 100
    assert services.release_to_worker(task, worker.address, 4 * CREDIT, f"reward:{task}:1").pk == release.pk
    with pytest.raises(InsufficientFunds):
        services.release_to_worker(task, worker.address, 3 * CREDIT, f"reward:{task}:2")
    refund = services.refund(task, f"refund:{task}")
    assert refund is not None
    assert refund.amount == 2 * CREDIT
    assert services.refund(task, f"refund:{task}").pk == refund.pk  # type: ignore[union-attr]
    assert services.refund(task, f"refund:{task}:again") is None
    seal_block()
    balances = dict(Account.objects.values_list("address", "balance"))
    assert balances[worker.address] == 4 * CREDIT * 95 // 100
    assert balances[custody.validator_keys().address] == 4 * CREDIT * 5 // 100
    assert services.balance(alice) == 6 * CREDIT
    assert services.escrowed(alice) == 0


def test_release_refuses_a_bad_address_and_a_task_without_escrow(alice: Any) -> None:
    with pytest.raises(LedgerError) as err:
        services.release_to_worker(uuid.uuid4(), "cpc1notanaddress", CREDIT, "r")
    assert err.value.field == "worker_address"
    with pytest.raises(LedgerError) as err:
        services.release_to_worker(uuid.uuid4(), worker_keys(1).address, CREDIT, "r")
    assert err.value.code == "no_escrow"
    assert services.refund(uuid.uuid4(), "nothing") is None


def test_payout_destroys_money_and_charges_gas(alice: Any) -> None:
    services.deposit(alice, 2 * CREDIT, "d")
    services.payout(alice, CREDIT, "bank:1")
    assert services.balance(alice) == CREDIT - gas.fee_for(encoding.PAYOUT, settings.LEDGER_GAS_PRICE)


def test_a_debt_is_paid_by_whatever_credits_arrive_first(alice: Any) -> None:
    """A reversal that finds the credits escrowed leaves a debt; a transfer, a worker's own
    signed transfer and the escrow's refund each pay it before anything is spendable."""
    from ledger.replay import verify_chain
    from ledger.sealer import seal_all
    from tests.ledger.helpers import signed

    bob = UserFactory(username="bob")
    services.deposit(bob, 10 * CREDIT, reference="bob-funds")
    services.deposit(alice, 10 * CREDIT, reference="alice-funds")
    task_id = uuid.uuid4()
    services.lock_escrow(task_id, alice, 10 * CREDIT, reference="lock")
    assert services.reverse_deposit(alice, 10 * CREDIT, reference="refunded", reason="refund") is None
    assert (services.balance(alice), services.owed(alice)) == (0, 10 * CREDIT)
    with pytest.raises(services.Owes, match="owes 10 credits"):
        services.check_not_owing(alice, "open tasks")

    alice_address = services.ensure_user_account(alice).address
    services.transfer(bob, alice_address, 3 * CREDIT, reference="gift")
    assert (services.balance(alice), services.owed(alice)) == (0, 7 * CREDIT)

    worker = worker_keys(77)
    services.release_to_worker(task_id, worker.address, 4 * CREDIT, reference="reward")
    sub = signed(worker, "TRANSFER", alice_address, 2 * CREDIT, services.next_nonce(worker.address), {})
    row = services.submit_transaction(sub.tx, sub.signature)
    assert row.status == "pending", row.reason
    assert (services.balance(alice), services.owed(alice)) == (0, 5 * CREDIT)

    services.refund(task_id, reference="refund")  # the 6 left in escrow: 5 pay the debt
    assert (services.balance(alice), services.owed(alice)) == (1 * CREDIT, 0)
    services.check_not_owing(alice, "open tasks")
    debt_paid = Transaction.objects.filter(type="REVERSAL", reference__startswith="debt:")
    assert sorted(debt_paid.values_list("amount", flat=True)) == [2 * CREDIT, 3 * CREDIT, 5 * CREDIT]
    assert services.forgive_debt(alice, CREDIT) == 0
    seal_all()
    summary = verify_chain()
    assert summary.reversals == 10 * CREDIT
