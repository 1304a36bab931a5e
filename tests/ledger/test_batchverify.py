"""Signatures checked by the verification pool: the same verdicts as one by one, in
order, whichever process checks which chunk; and bulk admission through it."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.conf import settings

from ledger import batchverify, gas, services
from ledger.mempool import Submission, admit_batches
from ledger.models import Account, Transaction, TxStatus
from ledger.replay import verify_chain
from ledger.sealer import seal_all
from protocol import encoding, keys
from protocol.encoding import ComputeResult
from protocol.signing import sign_compute_result
from tests.factories import UserFactory
from tests.ledger.helpers import CREDIT, signed, submit_result, worker_keys

ALICE = keys.from_seed(bytes(range(32)))


@pytest.fixture
def pool(settings: Any) -> None:
    settings.LEDGER_VERIFY_PROCESSES = 2


def _items(n: int, bad: set[int]) -> list[batchverify.Item]:
    items = []
    for i in range(n):
        message = f"message {i}".encode()
        signature = ALICE.sign(message)
        if i in bad:
            signature = signature[:-1] + bytes([signature[-1] ^ 1])
        items.append((ALICE.public_key, message, signature))
    return items


def test_the_pool_gives_every_verdict_in_order(pool: None) -> None:
    n = batchverify.PARALLEL_MIN + 3 * batchverify.CHUNK + 5  # several chunks and a short last one
    bad = {0, 1, batchverify.CHUNK - 1, batchverify.CHUNK, n // 2, n - 1}
    items = _items(n, bad)
    assert batchverify.verify_many(items) == [i not in bad for i in range(n)]
    # Two batches under way at once keep their own verdicts.
    first, second = batchverify.start(items), batchverify.start(items[::-1])
    assert second.result() == [n - 1 - i not in bad for i in range(n)]
    assert first.result() == [i not in bad for i in range(n)]


def test_small_batches_and_a_single_process_verify_in_process(settings: Any) -> None:
    settings.LEDGER_VERIFY_PROCESSES = 1
    items = _items(batchverify.PARALLEL_MIN + 1, {3})
    assert batchverify.verify_many(items) == [i != 3 for i in range(len(items))]
    assert batchverify.verify_many([]) == []


W = [worker_keys(40 + i) for i in range(3)]
FEE = gas.fee_for(encoding.SUBMIT_RESULT, settings.LEDGER_GAS_PRICE)


@pytest.mark.django_db
def test_bulk_admission_refuses_exactly_the_bad_ones_and_the_chain_verifies(pool: None, assignments: set) -> None:
    alice: Any = UserFactory(username="alice")
    services.deposit(alice, 1_000 * CREDIT, "dep-alice")
    for i, w in enumerate(W):
        services.transfer(alice, w.address, 100 * CREDIT, f"fund-{i}")
    seal_all()
    sealed_before = Transaction.objects.filter(status=TxStatus.SEALED).count()
    per_worker = 400  # three batches of 400: each over PARALLEL_MIN signatures
    subs: list[Submission] = []
    for nonce in range(per_worker):
        for w in W:
            task = uuid.uuid4()
            assignments.add((task, w.address))
            subs.append(submit_result(w, nonce, task))
    # A forged transaction signature in the first chunk of the first batch, a
    # ComputeResult signed by another key in the last chunk of the last.
    forged = subs[0]
    subs[0] = Submission(forged.tx, worker_keys(99).sign(forged.tx.encode()))
    w = W[2]
    stolen = sign_compute_result(ComputeResult(str(uuid.uuid4()), w.address, "ab" * 32, {}, per_worker - 1), W[0])
    subs[-1] = signed(w, encoding.SUBMIT_RESULT, w.address, 0, per_worker - 1, {"compute_result": stolen.to_json()})
    batches = [subs[i : i + 400] for i in range(0, len(subs), 400)]

    results = list(admit_batches(batches))

    rows = [row for batch in results for row in batch]
    assert [len(batch) for batch in results] == [400, 400, 400]
    refused = {i: row for i, row in enumerate(rows) if row.status != TxStatus.PENDING}
    # W[0]'s forged nonce 0 is refused, so each of its later transactions has the wrong nonce.
    assert refused[0].reason == "bad_signature"
    assert refused[0].reference is None
    assert refused[len(rows) - 1].reason == "bad_compute_result"
    assert {refused[i].reason for i in refused if i not in (0, len(rows) - 1)} == {"bad_nonce"}
    assert set(refused) == {i for i in range(len(rows)) if i % 3 == 0} | {len(rows) - 1}
    assert Transaction.objects.filter(status=TxStatus.PENDING).count() == 2 * per_worker - 1
    assert Account.objects.get(address=W[1].address).available == 100 * CREDIT - per_worker * FEE
    assert Account.objects.get(address=W[0].address).available == 100 * CREDIT
    seal_all()
    summary = verify_chain()
    assert summary.pending == 0
    assert summary.transactions == sealed_before + 2 * per_worker - 1


@pytest.mark.django_db
def test_stopping_bulk_admission_early_leaves_the_rest_unadmitted(pool: None, assignments: set) -> None:
    alice: Any = UserFactory(username="alice")
    services.deposit(alice, 1_000 * CREDIT, "dep-alice")
    services.transfer(alice, W[0].address, 100 * CREDIT, "fund")
    subs = []
    for nonce in range(2 * batchverify.PARALLEL_MIN):
        task = uuid.uuid4()
        assignments.add((task, W[0].address))
        subs.append(submit_result(W[0], nonce, task))
    half = batchverify.PARALLEL_MIN
    stream = admit_batches([subs[:half], subs[half:]])
    first = next(stream)
    stream.close()  # the second batch's signatures were being checked: nothing of it lands
    assert all(row.status == TxStatus.PENDING for row in first)
    assert Transaction.objects.filter(sender=W[0].address).count() == half


def test_a_daemonic_process_verifies_in_process(settings: Any, monkeypatch: Any) -> None:
    # A Celery prefork child is daemonic and may not start a pool; large batches still verify.
    import multiprocessing

    from protocol.keys import from_seed

    settings.LEDGER_VERIFY_PROCESSES = 2
    monkeypatch.setattr(multiprocessing.current_process(), "daemon", True, raising=False)
    monkeypatch.setattr(batchverify, "_get_pool", lambda size: pytest.fail("no pool in a daemonic process"))
    pair = from_seed(bytes(32))
    good = (pair.public_key, b"m", pair.sign(b"m"))
    bad = (pair.public_key, b"other", pair.sign(b"m"))
    assert batchverify.verify_many([good, bad] * batchverify.PARALLEL_MIN) == [True, False] * batchverify.PARALLEL_MIN
