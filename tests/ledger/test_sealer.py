"""The sealer: genesis, block contents and roots, signatures, the Celery task, mint."""

from __future__ import annotations

import io
import uuid
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError, connection, transaction

from config.celery import app
from ledger import custody, gas, services
from ledger.bulk import overlapped
from ledger.mempool import admit
from ledger.models import Account, Block, Transaction, TxStatus
from ledger.sealer import genesis_header, seal_block
from ledger.tasks import seal_pending
from protocol import encoding, keys, merkle
from tests.factories import UserFactory
from tests.ledger.helpers import CREDIT, submit_result, worker_keys

pytestmark = pytest.mark.django_db


def test_nothing_pending_seals_nothing_but_genesis_exists(db: Any) -> None:
    assert seal_block() is None
    genesis = Block.objects.get(height=0)
    assert genesis.header() == genesis_header()
    assert genesis.state_root == merkle.EMPTY_ROOT.hex()


def test_a_block_commits_to_its_transactions_results_and_state(assignments: set) -> None:
    alice: Any = UserFactory(username="alice")
    worker = worker_keys(5)
    services.deposit(alice, 10 * CREDIT, "d")
    task = uuid.uuid4()
    services.lock_escrow(task, alice, 2 * CREDIT, f"escrow:{task}")
    services.release_to_worker(task, worker.address, CREDIT, f"reward:{task}")
    assignments.add((task, worker.address))
    (result,) = admit([submit_result(worker, 0, task)])
    block = seal_block()
    assert block is not None
    assert block.height == 1
    assert block.prev_hash == Block.objects.get(height=0).hash
    txs = list(block.transactions.order_by("index_in_block"))
    assert [t.type for t in txs] == ["DEPOSIT", "ESCROW_LOCK", "ESCROW_RELEASE", "FEE", "SUBMIT_RESULT"]
    assert block.tx_count == 5
    assert block.gas_used == 80_000
    assert not Transaction.objects.filter(status=TxStatus.PENDING).exists()

    tx_leaves = [merkle.leaf_hash(bytes.fromhex(t.hash) + bytes.fromhex(t.signature)) for t in txs]
    assert block.tx_root == merkle.root_from_leaf_hashes(tx_leaves).hex()
    cr = encoding.parse_compute_result(result.payload["compute_result"])
    assert block.compute_root == merkle.root([cr.leaf()]).hex()
    accounts = Account.objects.exclude(balance=0, nonce=0).order_by("address")
    state = [encoding.state_leaf(a.address, a.balance, a.nonce) for a in accounts]
    assert block.state_root == merkle.root(state).hex()
    # The worker was paid 0.95 credits and paid the gas of its result out of it.
    submit_fee = gas.fee_for(encoding.SUBMIT_RESULT, settings.LEDGER_GAS_PRICE)
    assert Account.objects.get(address=worker.address).balance == CREDIT * 95 // 100 - submit_fee

    validator = custody.validator_keys()
    assert block.proposer == validator.address
    assert keys.verify(validator.public_key, block.header().encode(), bytes.fromhex(block.signature))
    assert seal_block() is None


def test_blocks_hold_at_most_the_configured_number_of_transactions(db: Any, settings: Any) -> None:
    settings.LEDGER_MAX_BLOCK_TXS = 2
    alice: Any = UserFactory(username="alice")
    for i in range(5):
        services.deposit(alice, CREDIT, f"d{i}")
    assert seal_pending() == 3
    assert list(Block.objects.order_by("height").values_list("tx_count", flat=True)) == [0, 2, 2, 1]
    assert seal_pending() == 0  # running it twice is harmless


def test_the_sealer_is_on_the_beat_schedule_every_block_time() -> None:
    entry = settings.CELERY_BEAT_SCHEDULE["ledger-seal-block"]
    assert entry["task"] == "ledger.tasks.seal_pending"
    assert entry["schedule"] == float(settings.LEDGER_BLOCK_TIME)
    assert "ledger.tasks.seal_pending" in app.tasks


@pytest.fixture
def debug(settings: Any) -> None:
    settings.DEBUG = True  # pytest-django turns DEBUG off; mint needs it on


def test_mint_gives_development_credits(db: Any, debug: None) -> None:
    UserFactory(username="dev")
    out = io.StringIO()
    call_command("mint", "--user", "dev", "--credits", "12.5", stdout=out)
    assert "Minted 12.5 credits to dev" in out.getvalue()
    assert Account.objects.get(user__username="dev").balance == 12_500_000_000


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--user", "nobody", "--credits", "1"], "--user: no user named 'nobody'"),
        (["--user", "dev", "--credits", "abc"], "--credits"),
        (["--user", "dev", "--credits", "-1"], "--credits: must be positive"),
    ],
)
def test_mint_refuses_bad_arguments_clearly(db: Any, debug: None, args: list[str], message: str) -> None:
    UserFactory(username="dev")
    with pytest.raises(CommandError, match=message):
        call_command("mint", *args)


def test_mint_is_refused_when_debug_is_off(db: Any, settings: Any) -> None:
    settings.DEBUG = False
    UserFactory(username="dev")
    with pytest.raises(CommandError, match="development only"):
        call_command("mint", "--user", "dev", "--credits", "5")
    assert not Account.objects.filter(balance__gt=0).exists()


def test_a_full_mempool_queues_a_sealer_run_at_once(
    db: Any, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    # No broker runs in tests: Celery executes the queued task inline (eager mode).
    settings.LEDGER_MEMPOOL_SEAL_TRIGGER = 3
    app.conf.task_always_eager = True
    try:
        alice: Any = UserFactory(username="alice")
        with django_capture_on_commit_callbacks(execute=True):
            services.deposit(alice, CREDIT, "d1")
            services.deposit(alice, CREDIT, "d2")
        assert Block.objects.filter(height__gte=1).count() == 0  # below the trigger
        with django_capture_on_commit_callbacks(execute=True):
            services.deposit(alice, CREDIT, "d3")
        assert Block.objects.get(height=1).tx_count == 3
    finally:
        app.conf.task_always_eager = False


def _sealed_state() -> list[tuple[str, int, int]]:
    return list(Account.objects.order_by("address").values_list("address", "balance", "nonce"))


def test_a_block_that_cannot_be_built_writes_nothing(assignments: set) -> None:
    alice: Any = UserFactory(username="alice")
    worker = worker_keys(5)
    services.deposit(alice, 10 * CREDIT, "d")
    services.transfer(alice, worker.address, CREDIT, "pay")
    seal_block()
    task = uuid.uuid4()
    assignments.add((task, worker.address))
    (result,) = admit([submit_result(worker, 0, task)])
    services.deposit(alice, CREDIT, "d2")
    before = _sealed_state()
    # Tampered with in the mempool: its ComputeResult no longer encodes, so no compute
    # root can be built. The failure comes while the row updates are already under way.
    payload = result.payload
    payload["compute_result"]["proof"] = {"x": 0.5}
    Transaction.objects.filter(pk=result.pk).update(payload=payload)
    with pytest.raises(encoding.EncodingError):
        seal_block()
    assert Block.objects.count() == 2
    assert Transaction.objects.filter(status=TxStatus.PENDING).count() == 2
    assert not Transaction.objects.filter(status=TxStatus.PENDING, block__isnull=False).exists()
    assert _sealed_state() == before


def _write_then_break(account: Account) -> None:
    with transaction.atomic():
        Account.objects.filter(pk=account.pk).update(balance=5)
        with overlapped(), connection.cursor() as cursor:
            cursor.execute("UPDATE ledger_account SET balance = -1 WHERE id = %s", [account.pk])


def test_an_error_in_overlapped_writes_rolls_the_transaction_back(db: Any) -> None:
    alice: Any = UserFactory(username="alice")
    account = services.ensure_user_account(alice)
    with pytest.raises(DatabaseError):
        _write_then_break(account)
    account.refresh_from_db()
    assert account.balance == 0
