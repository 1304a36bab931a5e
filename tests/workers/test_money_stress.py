"""The money path under load on real PostgreSQL: for a few seconds, providers run, submit
and (some) tamper with results that two verifiers accept or reject, requesters post and
cancel tasks and move their credits (transfers, payouts, deposits, reversals), providers
sweep their earnings, a sealer seals, two schedulers offer, expire and complete, and an
auditor runs verify_chain on the live chain. Then what a user
would check: nothing failed (no deadlock, no IntegrityError, no 5xx, no error logged),
no credit was created or destroyed, every task ended with its escrow settled to the unit
and every accepted result paid exactly once, and the chain passes its audit.

Nothing here asserts on timing: any interleaving of correct code passes. The length of
the run is ``PROOFWORK_STRESS_SECONDS`` (default 6); a longer run shakes out rarer ones.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, connections
from django.db.models import Count, Q, Sum
from django.utils import timezone
from rest_framework.exceptions import ValidationError

from ledger import services as ledger
from ledger.models import Account, AccountKind, Transaction, TxStatus
from ledger.replay import verify_chain
from ledger.sealer import seal_all, seal_block
from ledger.units import UNITS_PER_CREDIT
from marketplace import pricing
from marketplace import services as marketplace
from marketplace.kinds import get_kind
from marketplace.models import ACTIVE, TERMINAL, IllegalTransition, Task, TaskStatus
from protocol import encoding
from protocol.signing import sign_tx
from protocol.wire import template_tx
from tests.conftest import funded
from tests.factories import UserFactory, post_task
from tests.workers.test_jobs import Provider
from training.poc import runner as _poc_runner  # noqa: F401 (imported here: torch takes seconds, not in a thread)
from training.poc import verifier as _poc_verifier  # noqa: F401
from workers.agent import runners
from workers.assignments import jobs, lifecycle, scheduler, settlement, sweep
from workers.models import UNSETTLED, Assignment, Worker
from workers.tasks import verify_assignment

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql",
        reason="row locks and deadlock detection need PostgreSQL (set DATABASE_URL); SQLite serialises every writer",
    ),
]

SECONDS = float(os.environ.get("PROOFWORK_STRESS_SECONDS", "6"))
SEED = int(os.environ.get("PROOFWORK_STRESS_SEED", str(random.SystemRandom().randrange(2**32))))
FUNDS = 1000  # credits per requester (tests.conftest.funded)
# Refusals a user can meet on correct code: a cancel while a result is being verified or
# after the task ended (IllegalTransition, a ValidationError), a budget or a sweep the
# balance does not cover, a sweep while a job is unsettled (Conflict), a transfer or
# payout over the balance.
EXPECTED = (IllegalTransition, ValidationError, ledger.InsufficientFunds)


class Run:
    """What the threads did that the checks need, and what went wrong."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.errors: list[str] = []
        self.posted: list[Task] = []
        self.payouts: list[Transaction] = []
        self.transfers: list[Transaction] = []
        self.sweeps: list[Transaction] = []
        self.deposits: list[Transaction] = []
        self.reversals: list[Transaction] = []
        self.counts: dict[str, int] = {}

    def count(self, what: str) -> None:
        with self.lock:
            self.counts[what] = self.counts.get(what, 0) + 1

    def add(self, bucket: list[Any], item: Any) -> None:
        with self.lock:
            bucket.append(item)


def _loop(run: Run, name: str, seconds: float, step: Callable[[random.Random], None], seed: int) -> Callable[[], None]:
    """A thread's body: ``step`` again and again until the deadline; an expected refusal
    is counted, anything else recorded (and ends this thread). Each step gives its
    connection back to the pool, as a request or a Celery task does: the threads
    outnumber the pool (PROOFWORK_DB_POOL_SIZE)."""
    rng = random.Random(seed)

    def body() -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                step(rng)
            except EXPECTED as exc:
                run.count(f"{name}: {type(exc).__name__}")
            except BaseException:
                run.add(run.errors, f"[{name}] {traceback.format_exc()}")
                return
            finally:
                connections.close_all()

    return body


def _in_threads(bodies: list[Callable[[], None]], run: Run) -> None:
    barrier = threading.Barrier(len(bodies))

    def wrap(body: Callable[[], None]) -> None:
        try:
            barrier.wait()
            body()
        except BaseException:
            run.add(run.errors, traceback.format_exc())
        finally:
            connections.close_all()

    threads = [threading.Thread(target=wrap, args=(b,), daemon=True) for b in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join(SECONDS + 120)
    assert not [t for t in threads if t.is_alive()], "a thread is still running (a lock wait that never ends?)"


# --- what each kind of thread does ---------------------------------------------------


def _work(run: Run, node: Provider, workdir: Path, rng: random.Random) -> None:
    """One step of a provider node: heartbeat; then run its offered job (tampering with
    some results, giving up on a few), or sweep its earnings when it has none."""
    if not node.worker.name.endswith("flaky") or time.monotonic() % 6 < 3:
        # A flaky node's socket drops for 3 s in 6: it goes silent, its jobs expire.
        Worker.objects.filter(pk=node.worker.pk).update(last_heartbeat_at=timezone.now())
    job = Assignment.objects.filter(worker=node.worker, state=Assignment.State.OFFERED).first()
    if job is None:
        if rng.random() < 0.3:
            _sweep(run, node)
        return
    if rng.random() < 0.08:
        response = node.client.post(node.url(job, "fail/"), {"reason": "stress: gave up"}, format="json")
        _expect(response, (200, 409), "fail")
        run.count("provider: gave up")
        return
    described = node.client.get(node.url(job))
    _expect(described, (200,), "describe")
    spec = described.json()
    started = node.client.post(node.url(job, "start/"))
    _expect(started, (200, 409), "start")  # 409: the requester cancelled meanwhile
    if started.status_code == 409:
        return
    outcome = runners.run(spec, workdir / str(job.pk), lambda step, total, metrics: None)
    tamper = rng.random() < 0.3
    for name, path in outcome.artifacts.items():
        data = bytearray(path.read_bytes())
        if tamper:
            data[-4] ^= 1  # a wrong product entry under a committed root that claims otherwise
        response = node.client.put(
            node.url(job, f"artifacts/{name}/"),
            data=bytes(data),
            content_type="application/octet-stream",
            HTTP_CONTENT_DISPOSITION=f'attachment; filename="{name}"',
        )
        _expect(response, (201, 409), "upload")
        if response.status_code == 409:
            return
    submitted = node.client.post(node.url(job, "result/"), node.sign(spec, outcome), format="json")
    _expect(submitted, (202, 409), "submit")
    run.count("provider: submitted tampered" if tamper else "provider: submitted")


def _sweep(run: Run, node: Provider) -> None:
    """What ``python -m workers.agent sweep`` does: sign the platform's template."""
    template = sweep.sweep_template(node.worker)  # Conflict / ValidationError when it cannot
    signed, signature = sign_tx(template_tx(template), node.key)
    row, _ = sweep.submit_sweep(node.worker, signed, signature)
    if row.status != TxStatus.REFUSED:
        run.add(run.sweeps, row)
    run.count(f"provider: sweep {row.status}")


def _expect(response: Any, codes: tuple[int, ...], what: str) -> None:
    if response.status_code not in codes:
        raise AssertionError(f"{what}: HTTP {response.status_code} {response.content[:500]!r}")


def _verify(run: Run, rng: random.Random) -> None:
    """A verifier on the platform queue: settle what is submitted, in any order (two of
    them race for the same results, as a redelivered message would)."""
    pks = list(Assignment.objects.filter(state=Assignment.State.SUBMITTED).values_list("pk", flat=True))
    rng.shuffle(pks)
    for pk in pks[:3]:
        if rng.random() < 0.05:
            run.count(f"verifier: give_up {settlement.give_up(pk, 'stress: could not judge') is not None}")
        else:
            run.count(f"verifier: {verify_assignment(str(pk))}")
    if not pks:
        time.sleep(0.02)


def _request(run: Run, user: Any, others: list[str], rng: random.Random) -> None:
    """A requester: post tasks, cancel some, move credits around and out."""
    roll = rng.random()
    if roll < 0.4:
        price = get_kind("synthetic").estimate_price({"n": 64, "count": 1})
        replication = rng.choice([1, 1, 2])
        budget = price * replication + rng.randrange(0, price)
        task = post_task(user, "synthetic", {"n": 64}, budget=budget, replication=replication, max_attempts=2)
        run.add(run.posted, task)
    elif roll < 0.65:
        mine = list(Task.objects.filter(owner=user, status__in=ACTIVE).values_list("pk", flat=True))
        if mine:
            marketplace.cancel_task(user, rng.choice(mine))
            run.count("requester: cancelled")
    elif roll < 0.8:
        amount = rng.randrange(1, 3 * UNITS_PER_CREDIT)
        row = ledger.transfer(user, rng.choice(others), amount, reference=f"stress-transfer:{rng.getrandbits(64)}")
        run.add(run.transfers, row)
    elif roll < 0.9:
        amount = rng.randrange(1, 2 * UNITS_PER_CREDIT)
        run.add(run.payouts, ledger.payout(user, amount, reference=f"stress-payout:{rng.getrandbits(64)}"))
    elif roll < 0.95:
        amount = rng.randrange(1, 5 * UNITS_PER_CREDIT)
        run.add(run.deposits, ledger.deposit(user, amount, reference=f"stress-deposit:{rng.getrandbits(64)}"))
    else:
        # A card payment refunded: burns up to the amount, what is available of it.
        amount = rng.randrange(1, UNITS_PER_CREDIT)
        burnt = ledger.reverse_deposit(user, amount, f"stress-reversal:{rng.getrandbits(64)}", "refunded")
        if burnt is not None:
            run.add(run.reversals, burnt)
    time.sleep(0.005)


def _schedule(run: Run, rng: random.Random) -> None:
    """One pass of the periodic schedule_waiting, each step called directly so that an
    error is raised here instead of logged."""
    run.count(f"scheduler: expired {bool(scheduler.expire_overdue())}")
    # One query, so one snapshot: a worker never holds two unsettled jobs (two
    # SUBMIT_RESULT templates with the same nonce, one of which could never be sealed).
    doubled = list(
        Assignment.objects.filter(state__in=UNSETTLED)
        .values("worker_id")
        .annotate(n=Count("pk"))
        .filter(n__gt=1)
        .values_list("worker_id", "n")
    )
    assert doubled == [], f"workers with more than one unsettled job: {doubled}"
    jobs.resend_stalled_verifications()
    settlement.complete_stragglers()
    for task_id in scheduler.open_tasks_waiting():
        scheduler.schedule(task_id)
    time.sleep(0.01)


def _schedule_posted(run: Run, rng: random.Random) -> None:
    """A second control worker, taking the schedule_task messages that posting and
    settling send (in its own order): two schedulers must never offer one idle worker
    two jobs (one SUBMIT_RESULT nonce handed out twice)."""
    waiting = scheduler.open_tasks_waiting()
    rng.shuffle(waiting)
    for task_id in waiting[:3]:
        scheduler.schedule(task_id)
    time.sleep(0.01)


def _audit(run: Run, rng: random.Random) -> None:
    """``manage.py verify_chain`` on the live platform: what it reports must be true of
    the chain as it is, not an artefact of blocks sealed while it reads."""
    summary = verify_chain()
    run.count(f"auditor: ok ({'with' if summary.pending else 'no'} pending)")
    time.sleep(0.2)


def _seal(run: Run, rng: random.Random) -> None:
    block = seal_block()
    run.count("sealer: block" if block is not None else "sealer: nothing")
    time.sleep(0.01)


# --- the test --------------------------------------------------------------------------


def test_money_is_conserved_and_every_task_settles_under_concurrent_load(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, settings: Any
) -> None:
    caplog.set_level(logging.ERROR)
    # Jobs that run out of time and nodes that go silent, while they are being submitted.
    settings.ASSIGNMENT_DEADLINE = 3
    settings.WORKER_HEARTBEAT_TIMEOUT = 2
    requesters = [funded(UserFactory(username=name), FUNDS) for name in ("alice", "bob", "carol")]
    operators = [UserFactory(username=name) for name in ("dave", "erin")]
    nodes = [Provider(operators[i % 2], f"node-{i}" + ("-flaky" if i == 5 else "")) for i in range(6)]
    addresses = [ledger.ensure_user_account(u).address for u in (*requesters, *operators)]
    addresses += [n.worker.address for n in nodes]
    run = Run()

    rng = random.Random(SEED)
    bodies = []
    for i, group in enumerate((nodes[0::2], nodes[1::2])):

        def provide(r: random.Random, group: list[Provider] = group) -> None:
            for node in group:
                _work(run, node, tmp_path, r)

        bodies.append(_loop(run, f"providers-{i}", SECONDS, provide, rng.getrandbits(32)))
    for i in range(2):
        bodies.append(_loop(run, f"verifier-{i}", SECONDS, lambda r: _verify(run, r), rng.getrandbits(32)))
    for user in requesters:
        own = ledger.ensure_user_account(user).address
        others = [a for a in addresses if a != own]

        def request(r: random.Random, user: Any = user, others: list[str] = others) -> None:
            _request(run, user, others, r)

        bodies.append(_loop(run, f"requester-{user.username}", SECONDS, request, rng.getrandbits(32)))
    bodies.append(_loop(run, "scheduler", SECONDS, lambda r: _schedule(run, r), rng.getrandbits(32)))
    bodies.append(_loop(run, "scheduler-posted", SECONDS, lambda r: _schedule_posted(run, r), rng.getrandbits(32)))
    bodies.append(_loop(run, "sealer", SECONDS, lambda r: _seal(run, r), rng.getrandbits(32)))
    bodies.append(_loop(run, "auditor", SECONDS, lambda r: _audit(run, r), rng.getrandbits(32)))

    started = time.monotonic()
    connections.close_all()  # this thread's connection too, back to the pool meanwhile
    _in_threads(bodies, run)
    elapsed = time.monotonic() - started
    statuses = sorted(Task.objects.values_list("status", flat=True))
    moved = f"{len(run.transfers)} transfers, {len(run.payouts)} payouts, {len(run.deposits)} deposits"
    print(f"seed {SEED}: {elapsed:.1f}s, {len(run.posted)} tasks posted, {moved}; {sorted(run.counts.items())}")

    assert run.errors == [], f"seed {SEED}:\n" + "\n".join(run.errors)
    logged = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert logged == [], [f"{r.name}: {r.getMessage()}" for r in logged]

    _settle_everything()
    print("task statuses when the load stopped:", {s: statuses.count(s) for s in set(statuses)})
    deposited = FUNDS * UNITS_PER_CREDIT * len(requesters) + sum(d.amount for d in run.deposits)
    _check_chain(run, deposited)
    _check_tasks(run)
    _check_workers(nodes)


def _settle_everything() -> None:
    """Quiesce: judge what is still submitted; nothing may be left fully paid yet active;
    cancel the rest (which must succeed once no result awaits a verdict); seal it all."""
    for pk in Assignment.objects.filter(state=Assignment.State.SUBMITTED).values_list("pk", flat=True):
        assert verify_assignment(str(pk)) in ("accepted", "rejected")
    stuck = list(lifecycle.fully_accepted().values_list("pk", "status"))
    assert stuck == [], f"tasks with every replica paid that never completed: {stuck}"
    for task in Task.objects.filter(status__in=ACTIVE).select_related("owner"):
        marketplace.cancel_task(task.owner, task.pk)
    seal_all(max_blocks=1000)
    assert not Transaction.objects.filter(status=TxStatus.PENDING).exists()


def _check_chain(run: Run, deposited: int) -> None:
    """No credit created or destroyed; what the users were told happened, happened."""
    paid_out = sum(p.amount for p in run.payouts)
    # A reversal that found the credits escrowed or spent left a debt, which credits
    # arriving later (deposits, refunds of escrow) paid with REVERSALs of their own.
    debt_paid = Transaction.objects.filter(type="REVERSAL", reference__startswith="debt:").aggregate(s=Sum("amount"))
    reversed_ = sum(r.amount for r in run.reversals) + int(debt_paid["s"] or 0)
    summary = verify_chain()
    assert (summary.deposits, summary.payouts, summary.reversals) == (deposited, paid_out, reversed_)
    supply = deposited - paid_out - reversed_
    assert summary.total_balance == supply
    totals = Account.objects.aggregate(balance=Sum("balance"), available=Sum("available"))
    assert totals == {"balance": supply, "available": supply}
    for row in (*run.payouts, *run.transfers, *run.sweeps, *run.deposits, *run.reversals):
        assert Transaction.objects.filter(pk=row.pk, hash=row.hash, status=TxStatus.SEALED).exists(), row
    assert Account.objects.filter(Q(balance__lt=0) | Q(available__lt=0)).count() == 0


def _check_tasks(run: Run) -> None:
    """Every task ended, its escrow emptied exactly: the lock = rewards + fees + refund,
    each accepted replica paid once (and its SUBMIT_RESULT sealed), nothing else paid."""
    posted = {t.pk for t in run.posted}
    assert set(Task.objects.values_list("pk", flat=True)) == posted
    for task in Task.objects.select_related("owner"):
        where = f"task {task.pk} ({task.status}, replication {task.replication})"
        assert task.status in TERMINAL, where
        assert not Assignment.objects.filter(task=task, state__in=UNSETTLED).exists(), where
        escrow = ledger.escrow_account(task.pk)
        assert escrow is not None, where
        assert (escrow.available, escrow.balance) == (0, 0), where
        owner = Account.objects.get(user=task.owner, kind=AccountKind.USER).address
        moved = list(
            Transaction.objects.exclude(status=TxStatus.REFUSED).filter(
                Q(sender=escrow.address) | Q(recipient=escrow.address)
            )
        )
        assert all(t.status == TxStatus.SEALED for t in moved), where
        into = [t for t in moved if t.recipient == escrow.address]
        assert [(t.type, t.sender, t.amount) for t in into] == [(encoding.ESCROW_LOCK, owner, task.budget)], where
        out = [t for t in moved if t.sender == escrow.address]
        assert sum(t.amount + t.fee for t in out) == task.budget, where

        accepted = list(Assignment.objects.filter(task=task, state=Assignment.State.ACCEPTED).select_related("worker"))
        # Each accepted job pays its node the price it was offered at, in full, and the
        # platform's fee on top (docs/market.md); the two fit in the task's bid.
        prices = {a.pk: a.price for a in accepted}
        assert None not in prices.values(), where
        paid = {pk: (price or 0) for pk, price in prices.items()}
        assert all(pricing.charge(price) <= task.bid for price in paid.values()), where
        rewards = sorted(
            (t.reference, t.recipient, t.amount)
            for t in out
            if t.type == encoding.ESCROW_RELEASE and t.payload.get("kind") == "reward"
        )
        assert rewards == sorted((f"reward:{a.pk}", a.worker.address, paid[a.pk]) for a in accepted), where
        fees = sorted((t.reference, t.amount) for t in out if t.type == encoding.FEE)
        expected_fees = ((f"reward:{a.pk}:fee", pricing.fee_on(paid[a.pk])) for a in accepted)
        assert fees == sorted(f for f in expected_fees if f[1]), where
        refunds = [t for t in out if t.type == encoding.ESCROW_RELEASE and t.payload.get("kind") == "refund"]
        left = task.budget - sum(pricing.charge(price) for price in paid.values())
        assert [(t.recipient, t.amount) for t in refunds] == ([(owner, left)] if left else []), where
        assert len(out) == len(rewards) + len(fees) + len(refunds), where

        if task.status == TaskStatus.COMPLETED:
            assert len(accepted) == task.replication, where
        else:
            assert len(accepted) < task.replication, where
        for a in accepted:
            results = Transaction.objects.filter(
                type=encoding.SUBMIT_RESULT, reference=f"result:{task.pk}:{a.worker.address}"
            ).exclude(status=TxStatus.REFUSED)
            assert [r.status for r in results] == [TxStatus.SEALED], f"{where}: result of {a.pk}"
        for a in Assignment.objects.filter(task=task).exclude(state=Assignment.State.ACCEPTED):
            assert not Transaction.objects.filter(reference=f"reward:{a.pk}").exists(), f"{where}: {a.pk} {a.state}"
            rejected = Transaction.objects.filter(reference=f"reject:{a.pk}", type=encoding.REJECT_RESULT).count()
            assert rejected == (1 if a.state == Assignment.State.REJECTED else 0), f"{where}: {a.pk} {a.state}"


def _check_workers(nodes: list[Provider]) -> None:
    """A worker's recorded earnings are what the ledger paid it; its jobs, what it did."""
    for node in nodes:
        worker = Worker.objects.get(pk=node.worker.pk)
        paid = Transaction.objects.filter(
            type=encoding.ESCROW_RELEASE, recipient=worker.address, payload__kind="reward"
        ).aggregate(s=Sum("amount"))["s"]
        assert worker.earnings == (paid or 0), worker.name
        accepted = Assignment.objects.filter(worker=worker, state=Assignment.State.ACCEPTED).count()
        assert worker.jobs_done == accepted, worker.name
        assert 0 <= worker.reputation <= 100, worker.name
