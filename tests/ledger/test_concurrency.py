"""Concurrency on real PostgreSQL: escrow locks never overdraw, one sealer wins."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, connections

from ledger import services
from ledger.models import Account, AccountKind, Block, Transaction, TxStatus
from ledger.replay import verify_chain
from ledger.sealer import seal_block
from tests.factories import UserFactory
from tests.ledger.helpers import CREDIT, worker_keys

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql",
        reason="row locks and advisory locks need PostgreSQL (set DATABASE_URL); SQLite serialises every writer",
    ),
]


def _in_threads(n: int, fn: Callable[[int], Any]) -> list[Any]:
    results: list[Any] = [None] * n
    barrier = threading.Barrier(n)

    def run(i: int) -> None:
        try:
            barrier.wait()
            results[i] = fn(i)
        except Exception as exc:  # collected and asserted on by the caller
            results[i] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_100_concurrent_escrow_locks_never_overdraw_nor_lose_an_update() -> None:
    alice: Any = UserFactory(username="alice")
    services.deposit(alice, 60 * CREDIT, "d")
    tasks = [uuid.uuid4() for _ in range(100)]

    results = _in_threads(100, lambda i: services.lock_escrow(tasks[i], alice, CREDIT, f"escrow:{tasks[i]}"))

    locked = [r for r in results if isinstance(r, Transaction)]
    refused = [r for r in results if isinstance(r, services.InsufficientFunds)]
    assert len(locked) == 60, [r for r in results if not isinstance(r, Transaction)][:3]
    assert len(refused) == 40
    account = Account.objects.get(user=alice, kind=AccountKind.USER)
    assert account.available == 0
    assert account.next_nonce == 60
    assert services.escrowed(alice) == 60 * CREDIT
    assert sorted(Transaction.objects.filter(sender=account.address).values_list("nonce", flat=True)) == list(range(60))


def test_the_same_reference_from_many_threads_locks_once() -> None:
    alice: Any = UserFactory(username="alice")
    services.deposit(alice, 10 * CREDIT, "d")
    task = uuid.uuid4()
    results = _in_threads(20, lambda i: services.lock_escrow(task, alice, CREDIT, f"escrow:{task}"))
    assert {r.pk for r in results} == {results[0].pk}
    assert services.balance(alice) == 9 * CREDIT


def test_exactly_one_of_several_sealers_writes_the_block() -> None:
    alice: Any = UserFactory(username="alice")
    for i in range(20):
        services.deposit(alice, CREDIT, f"d{i}")

    results = _in_threads(6, lambda i: seal_block())

    blocks = [r for r in results if isinstance(r, Block)]
    assert not [r for r in results if isinstance(r, Exception)]
    assert len(blocks) == 1
    assert blocks[0].tx_count == 20
    assert Block.objects.filter(height__gte=1).count() == 1
    assert not Transaction.objects.filter(status=TxStatus.PENDING).exists()
    assert Account.objects.get(user=alice).balance == 20 * CREDIT


def test_services_and_sealers_running_together_neither_deadlock_nor_lose_money() -> None:
    users: list[Any] = [UserFactory(username=f"u{i}") for i in range(4)]
    for i, u in enumerate(users):
        services.deposit(u, 50 * CREDIT, f"d{i}")
    worker = worker_keys(5).address

    def work(i: int) -> Any:
        if i % 4 == 3:
            return [seal_block() for _ in range(5)]
        user = users[i % 4]
        task = uuid.uuid4()
        services.lock_escrow(task, user, 2 * CREDIT, f"escrow:{task}")
        services.release_to_worker(task, worker, CREDIT, f"reward:{task}")
        return services.refund(task, f"refund:{task}")

    results = _in_threads(24, work)

    assert not [r for r in results if isinstance(r, Exception)], [r for r in results if isinstance(r, Exception)][:2]
    while seal_block() is not None:
        pass
    summary = verify_chain()
    assert summary.total_balance == 200 * CREDIT
    assert Account.objects.get(address=worker).balance == 18 * CREDIT * 95 // 100
