"""Settlement where it used to strand money: replicas, low reputation, cancellation while a
node works, a worker voiding its own result, a node that restarts. Each runs the agent's
real code for the job (tests.workers.test_jobs.Provider) against the REST API."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from ledger import gas
from ledger import services as ledger
from ledger.units import UNITS_PER_CREDIT
from marketplace import services as marketplace
from marketplace.models import Task, TaskStatus
from protocol import encoding
from protocol.wire import sign_template
from tests.factories import assign, post_task
from tests.workers.test_jobs import Provider, money
from workers.assignments import scheduler
from workers.models import Assignment, Worker
from workers.tasks import verify_assignment

pytestmark = pytest.mark.django_db


def refreshed(*rows: Any) -> None:
    for row in rows:
        row.refresh_from_db()


def escrowed(task: Task) -> int:
    """What is left in the task's escrow account, in base units."""
    account = ledger.escrow_account(task.pk)
    assert account is not None
    return account.available


def by_worker(created: list[Assignment], provider: Provider) -> Assignment:
    return next(a for a in created if a.worker_id == provider.worker.pk)


def test_a_task_with_two_replicas_completes_whatever_order_they_finish_in(
    alice: Any, bob: Any, carol: Any, tmp_path: Path
) -> None:
    one, two = Provider(alice, "one"), Provider(carol, "two")
    task = post_task(bob, "synthetic", {"n": 64}, budget=3 * UNITS_PER_CREDIT, replication=2)
    created = scheduler.schedule(task.pk)
    first, second = by_worker(created, one), by_worker(created, two)
    body_one = one.run_job(first, tmp_path / "one")
    assert one.submit(first, body_one).status_code == 202

    # The first replica is verified and paid while the second is still offered: the task
    # waits for it (it used to go back to open, where the last acceptance never completed it).
    assert verify_assignment(str(first.pk)) == "accepted"
    refreshed(task)
    assert task.status == TaskStatus.ASSIGNED
    assert task.status_reason == "1/2 replicas verified."
    assert scheduler.schedule(task.pk) == []  # both replicas are in hand: nobody else is asked

    body_two = two.run_job(second, tmp_path / "two")
    assert two.submit(second, body_two).status_code == 202
    refreshed(task)
    assert task.status == TaskStatus.VERIFYING
    assert verify_assignment(str(second.pk)) == "accepted"
    refreshed(task)
    assert task.status == TaskStatus.COMPLETED
    assert sorted(task.result_summary["workers"]) == sorted([one.worker.address, two.worker.address])
    # Both were paid; what the two rewards did not use went back to bob.
    assert escrowed(task) == 0
    assert ledger.address_balance(one.worker.address) > 0
    assert ledger.address_balance(two.worker.address) > 0
    assert Worker.objects.get(pk=one.worker.pk).jobs_done == 1
    assert Worker.objects.get(pk=two.worker.pk).jobs_done == 1


def test_a_second_replica_is_offered_when_a_worker_comes_online_later(
    alice: Any, bob: Any, carol: Any, tmp_path: Path
) -> None:
    one = Provider(alice, "one")
    task = post_task(bob, "synthetic", {"n": 64}, budget=3 * UNITS_PER_CREDIT, replication=2)
    (first,) = scheduler.schedule(task.pk)
    refreshed(task)
    assert task.status == TaskStatus.ASSIGNED
    assert "1/2 replicas in hand" in task.status_reason
    assert scheduler.open_tasks_waiting() == [task.pk]  # still short of a worker
    # Starting and submitting leave as many replicas in hand: the task still says why it waits.
    assert one.client.post(one.url(first, "start/")).status_code == 200
    refreshed(task)
    assert task.status == TaskStatus.RUNNING
    assert task.status_reason.startswith("1/2 replicas in hand. Waiting for a worker: ")

    two = Provider(carol, "two")
    (second,) = scheduler.schedule(task.pk)
    assert second.worker == two.worker
    assert scheduler.open_tasks_waiting() == []
    for provider, assignment in ((one, first), (two, second)):
        body = provider.run_job(assignment, tmp_path / provider.worker.name)
        assert provider.submit(assignment, body).status_code == 202
        assert verify_assignment(str(assignment.pk)) == "accepted"
    refreshed(task)
    assert task.status == TaskStatus.COMPLETED


def test_a_worker_at_low_reputation_is_rejected_cleanly(alice: Any, bob: Any, tmp_path: Path) -> None:
    """A rejection used to subtract below zero first and break the CHECK constraint, which
    left the result submitted and the task verifying for good."""
    alpha = Provider(alice, "alpha")
    Worker.objects.filter(pk=alpha.worker.pk).update(reputation=5)
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT, max_attempts=2)
    assignment = assign(task)
    body = alpha.run_job(assignment, tmp_path, tamper=True)
    assert alpha.submit(assignment, body).status_code == 202
    assert verify_assignment(str(assignment.pk)) == "rejected"
    refreshed(task, assignment, alpha.worker)
    assert assignment.state == Assignment.State.REJECTED
    assert alpha.worker.reputation == 0
    assert task.status == TaskStatus.OPEN


def test_giving_up_at_low_reputation_still_costs_it(alice: Any, bob: Any) -> None:
    alpha = Provider(alice, "alpha")
    Worker.objects.filter(pk=alpha.worker.pk).update(reputation=2)
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    assignment = assign(task)
    assert alpha.client.post(alpha.url(assignment, "fail/"), {"reason": "out of memory"}).status_code == 200
    refreshed(alpha.worker)
    assert alpha.worker.reputation == 0


def test_cancelling_a_running_task_ends_its_job_without_penalty(alice: Any, bob: Any, tmp_path: Path) -> None:
    alpha = Provider(alice, "alpha")
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    assignment = assign(task)
    body = alpha.run_job(assignment, tmp_path)
    reputation = Worker.objects.get(pk=alpha.worker.pk).reputation

    marketplace.cancel_task(bob, task.pk)
    refreshed(task, assignment, alpha.worker)
    assert task.status == TaskStatus.CANCELLED
    assert assignment.state == Assignment.State.EXPIRED
    assert assignment.reason == "The requester cancelled the task."
    assert alpha.worker.reputation == reputation
    assert escrowed(task) == 0

    # The node learns it on its next call; nothing is paid, nothing is stranded.
    late = alpha.submit(assignment, body)
    assert late.status_code == 409
    assert late.json() == {"state": ["This assignment is expired; it takes no result."], "assignment_state": "expired"}
    # The worker is free for the next task at once.
    other = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    (next_job,) = scheduler.schedule(other.pk)
    assert next_job.worker == alpha.worker


def test_a_task_cannot_be_cancelled_while_a_result_is_verified(
    alice: Any, bob: Any, carol: Any, bob_client: APIClient, tmp_path: Path
) -> None:
    one, two = Provider(alice, "one"), Provider(carol, "two")
    task = post_task(bob, "synthetic", {"n": 64}, budget=3 * UNITS_PER_CREDIT, replication=2)
    created = scheduler.schedule(task.pk)
    first, second = by_worker(created, one), by_worker(created, two)
    assert one.submit(first, one.run_job(first, tmp_path)).status_code == 202
    assert two.client.post(two.url(second, "start/")).status_code == 200
    refreshed(task)
    assert task.status == TaskStatus.RUNNING  # the other replica runs; running tasks can be cancelled

    before = money()
    refused = bob_client.post(f"/api/v1/tasks/{task.pk}/cancel/")
    assert refused.status_code == 409
    assert "being verified" in refused.json()["status"][0]
    assert money() == before
    refreshed(task)
    assert task.status == TaskStatus.RUNNING
    assert {a.state for a in Assignment.objects.filter(task=task)} == {"submitted", "running"}

    # After the verdict it can: the paid replica stays paid, the rest comes back.
    assert verify_assignment(str(first.pk)) == "accepted"
    marketplace.cancel_task(bob, task.pk)
    refreshed(task)
    assert task.status == TaskStatus.CANCELLED
    assert escrowed(task) == 0
    refreshed(second)
    assert second.state == Assignment.State.EXPIRED


def test_a_failed_task_waits_for_a_pending_verdict_and_ends_its_other_jobs(
    alice: Any, bob: Any, carol: Any, tmp_path: Path
) -> None:
    """Attempts run out (max_attempts × replication rejected or expired) while one replica's
    result awaits its verdict: the task fails only after that verdict, which is paid."""
    one, two = Provider(alice, "one"), Provider(carol, "two")
    task = post_task(bob, "synthetic", {"n": 64}, budget=3 * UNITS_PER_CREDIT, replication=2, max_attempts=1)
    created = scheduler.schedule(task.pk)
    first, second = by_worker(created, one), by_worker(created, two)
    assert one.submit(first, one.run_job(first, tmp_path)).status_code == 202
    assert two.client.post(two.url(second, "fail/"), {"reason": "no GPU"}).status_code == 200
    three = Provider(carol, "three")
    (third,) = scheduler.schedule(task.pk)
    assert third.worker == three.worker
    assert three.client.post(three.url(third, "fail/"), {"reason": "no GPU"}).status_code == 200

    assert scheduler.schedule(task.pk) == []
    refreshed(task)
    assert task.status == TaskStatus.VERIFYING  # not failed: one's result may still be paid
    assert verify_assignment(str(first.pk)) == "accepted"
    scheduler.schedule(task.pk)
    refreshed(task)
    assert task.status == TaskStatus.FAILED
    assert escrowed(task) == 0  # one was paid, the rest refunded
    assert Worker.objects.get(pk=one.worker.pk).jobs_done == 1


def test_a_worker_that_spends_its_results_nonce_is_rejected_not_stranded(
    alice: Any, bob: Any, alice_client: APIClient, tmp_path: Path
) -> None:
    alpha = Provider(alice, "alpha")
    earlier = uuid.uuid4()  # earlier earnings, so the node can pay a transfer's fee
    ledger.lock_escrow(earlier, bob, UNITS_PER_CREDIT, reference=f"lock:{earlier}")
    ledger.release_to_worker(earlier, alpha.worker.address, UNITS_PER_CREDIT, reference=f"reward:{earlier}")
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT, max_attempts=2)
    assignment = assign(task)
    assert alpha.submit(assignment, alpha.run_job(assignment, tmp_path)).status_code == 202

    template = {
        "chain_id": settings.LEDGER_CHAIN_ID,
        "type": encoding.TRANSFER,
        "from": alpha.worker.address,
        "to": ledger.ensure_user_account(alice).address,
        "amount": 1,
        "fee": gas.fee_for(encoding.TRANSFER, settings.LEDGER_GAS_PRICE),
        "nonce": ledger.next_nonce(alpha.worker.address),
        "gas_price": settings.LEDGER_GAS_PRICE,
        "gas_limit": gas.gas_limit(encoding.TRANSFER),
        "payload": {},
    }
    signature = sign_template(template, alpha.key)
    sent = alice_client.post(
        "/api/v1/ledger/transactions/",
        {**template, "public_key": alpha.key.public_key.hex(), "signature": signature.hex()},
        format="json",
    )
    assert sent.status_code == 202, sent.json()
    locked = escrowed(task)

    assert verify_assignment(str(assignment.pk)) == "rejected"
    refreshed(task, assignment)
    assert assignment.state == Assignment.State.REJECTED
    assert "cannot be sealed" in assignment.reason
    assert task.status == TaskStatus.OPEN  # reassigned; the requester's escrow is intact
    assert escrowed(task) == locked


def test_a_node_that_restarts_gives_up_what_it_was_running(alice: Any, bob: Any) -> None:
    alpha = Provider(alice, "alpha")
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    assignment = assign(task)
    assert alpha.client.post(alpha.url(assignment, "start/")).status_code == 200

    answer = alpha.client.post("/api/v1/workers/me/abandon/")
    assert answer.status_code == 200
    assert answer.json() == {"abandoned": [str(assignment.pk)]}
    refreshed(task, assignment)
    assert assignment.state == Assignment.State.EXPIRED
    assert "restarted" in assignment.reason
    assert task.status == TaskStatus.OPEN
    # Nothing else to give up; another worker's token sees nothing of alpha's.
    assert alpha.client.post("/api/v1/workers/me/abandon/").json() == {"abandoned": []}
    assert APIClient().post("/api/v1/workers/me/abandon/").status_code in (401, 403)


def test_a_job_over_is_no_longer_a_key_to_the_data(alice: Any, bob: Any) -> None:
    alpha = Provider(alice, "alpha")
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    assignment = assign(task)
    assert alpha.client.post(alpha.url(assignment, "fail/"), {"reason": "no"}).status_code == 200
    closed = alpha.client.get(alpha.url(assignment, "dataset/"))
    assert closed.status_code == 409
    assert "expired" in closed.json()["state"][0]


def test_a_proof_too_large_for_a_transaction_is_a_400_naming_it(alice: Any, bob: Any) -> None:
    from protocol.encoding import ComputeResult
    from protocol.signing import sign_compute_result

    alpha = Provider(alice, "alpha")
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    assignment = assign(task)
    job = alpha.client.get(alpha.url(assignment)).json()
    assert alpha.client.post(alpha.url(assignment, "start/")).status_code == 200
    template = job["submit"]
    result = sign_compute_result(
        ComputeResult(
            task_id=job["task_id"],
            worker_address=alpha.key.address,
            result_hash="ab" * 32,
            proof={"padding": "x" * 20_000},
            nonce=int(template["nonce"]),
        ),
        alpha.key,
    )
    body = {
        "compute_result": result.to_json(),
        "transaction": {
            **template,
            "payload": {"compute_result": result.to_json()},
            "public_key": alpha.key.public_key.hex(),
            "signature": "00" * 64,
        },
    }
    response = alpha.submit(assignment, body)
    assert response.status_code == 400
    assert "larger than" in str(response.json())
    refreshed(assignment)
    assert assignment.state == Assignment.State.RUNNING


def test_the_verified_benchmark_is_measured_by_the_platform(alice: Any, bob: Any, tmp_path: Path) -> None:
    alpha = Provider(alice, "alpha")
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    assignment = assign(task)
    body = alpha.run_job(assignment, tmp_path)
    assert alpha.submit(assignment, body).status_code == 202
    assert verify_assignment(str(assignment.pk)) == "accepted"
    refreshed(assignment, alpha.worker)
    assert assignment.submitted_at is not None
    seconds = (assignment.submitted_at - assignment.created_at).total_seconds()
    assert alpha.worker.benchmark_gflops == pytest.approx(2 * 64**3 / seconds / 1e9, abs=1e-3)
    assert "reported_gflops" in assignment.metrics

    # It is the best figure so far: a slower task later does not lower it.
    Worker.objects.filter(pk=alpha.worker.pk).update(benchmark_gflops=12_345.0)
    later = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    (again,) = scheduler.schedule(later.pk)
    assert alpha.submit(again, alpha.run_job(again, tmp_path / "later")).status_code == 202
    assert verify_assignment(str(again.pk)) == "accepted"
    refreshed(alpha.worker)
    assert alpha.worker.benchmark_gflops == 12_345.0


def test_a_task_left_open_with_every_replica_paid_completes_on_the_next_pass(
    alice: Any, bob: Any, carol: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before replicas drove the status, such a task sat open with its escrow locked."""
    from workers.assignments import settlement
    from workers.tasks import schedule_waiting

    one, two = Provider(alice, "one"), Provider(carol, "two")
    task = post_task(bob, "synthetic", {"n": 64}, budget=3 * UNITS_PER_CREDIT, replication=2)
    with monkeypatch.context() as old_code:  # the last acceptance completes nothing, as before
        old_code.setattr(settlement, "complete", lambda *args: None)
        for assignment in scheduler.schedule(task.pk):
            provider = one if assignment.worker_id == one.worker.pk else two
            body = provider.run_job(assignment, tmp_path / provider.worker.name)
            assert provider.submit(assignment, body).status_code == 202
            assert verify_assignment(str(assignment.pk)) == "accepted"
    Task.objects.filter(pk=task.pk).update(status=TaskStatus.OPEN)
    left = escrowed(task)
    assert left > 0

    schedule_waiting()
    refreshed(task)
    assert task.status == TaskStatus.COMPLETED
    assert sorted(task.result_summary["workers"]) == sorted([one.worker.address, two.worker.address])
    assert escrowed(task) == 0
    assert not Assignment.objects.filter(task=task).exclude(state=Assignment.State.ACCEPTED).exists()


def test_a_replica_submitted_while_an_old_task_sat_open_is_still_paid(
    alice: Any, bob: Any, carol: Any, tmp_path: Path
) -> None:
    one, two = Provider(alice, "one"), Provider(carol, "two")
    task = post_task(bob, "synthetic", {"n": 64}, budget=3 * UNITS_PER_CREDIT, replication=2)
    created = scheduler.schedule(task.pk)
    first, second = by_worker(created, one), by_worker(created, two)
    assert one.submit(first, one.run_job(first, tmp_path / "one")).status_code == 202
    assert verify_assignment(str(first.pk)) == "accepted"
    Task.objects.filter(pk=task.pk).update(status=TaskStatus.OPEN)  # where the old code left it
    assert two.submit(second, two.run_job(second, tmp_path / "two")).status_code == 202
    assert verify_assignment(str(second.pk)) == "accepted"
    refreshed(task)
    assert task.status == TaskStatus.COMPLETED


def test_one_failing_row_does_not_stop_the_periodic_pass(alice: Any, bob: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from workers.assignments import heldout
    from workers.tasks import schedule_waiting

    broken = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    fine = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    alpha = Provider(alice, "alpha")
    prepare = heldout.ensure_prepared

    def flaky(task_id: Any) -> bool:
        if task_id == broken.pk:
            raise FileNotFoundError("the dataset file went missing")
        return prepare(task_id)

    monkeypatch.setattr(heldout, "ensure_prepared", flaky)
    schedule_waiting()
    assert Assignment.objects.filter(task=fine, worker=alpha.worker).exists()
    assert not Assignment.objects.filter(task=broken).exists()


def test_a_result_the_platform_cannot_judge_is_given_up_without_penalty_in_the_end(
    alice: Any, bob: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    from datetime import timedelta

    from workers import verification

    alpha = Provider(alice, "alpha")
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT, max_attempts=2)
    assignment = assign(task)
    assert alpha.submit(assignment, alpha.run_job(assignment, tmp_path)).status_code == 202
    reputation = Worker.objects.get(pk=alpha.worker.pk).reputation

    def broken(_: Any) -> Any:
        raise verification.PlatformFault("the held-out split is missing")

    monkeypatch.setattr(verification, "verify", broken)
    with pytest.raises(verification.PlatformFault):
        verify_assignment(str(assignment.pk))  # early on: an error, asked again later
    refreshed(assignment)
    assert assignment.state == Assignment.State.SUBMITTED

    assert assignment.submitted_at is not None
    Assignment.objects.filter(pk=assignment.pk).update(
        submitted_at=assignment.submitted_at - timedelta(seconds=settings.VERIFY_GIVE_UP_AFTER + 1)
    )
    assert verify_assignment(str(assignment.pk)) == "given-up"
    refreshed(assignment, task, alpha.worker)
    assert assignment.state == Assignment.State.EXPIRED
    assert "could not verify" in assignment.reason
    assert alpha.worker.reputation == reputation
    assert task.status == TaskStatus.OPEN


def test_a_synthetic_task_whose_stored_spec_the_verifier_cannot_read_never_blames_the_worker(
    alice: Any, bob: Any, tmp_path: Path
) -> None:
    """An honest result checked against a stored spec the platform's verifier does not
    understand (say, a generator a newer release wrote before a rollback) is the
    platform's fault: asked again later, never a rejection of the node."""
    from workers import verification

    alpha = Provider(alice, "alpha")
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    assignment = assign(task)
    assert alpha.submit(assignment, alpha.run_job(assignment, tmp_path)).status_code == 202
    reputation = Worker.objects.get(pk=alpha.worker.pk).reputation
    Task.objects.filter(pk=task.pk).update(spec={**task.spec, "generator": "mt19937"})

    with pytest.raises(verification.PlatformFault, match="generator"):
        verify_assignment(str(assignment.pk))
    refreshed(assignment, alpha.worker)
    assert assignment.state == Assignment.State.SUBMITTED
    assert alpha.worker.reputation == reputation

    Task.objects.filter(pk=task.pk).update(spec=task.spec)  # repaired: the next try settles it
    assert verify_assignment(str(assignment.pk)) == "accepted"


def test_a_verifier_that_loses_the_race_reports_that_it_decided_nothing(
    alice: Any, bob: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two verifications of one result (a redelivered message) run at once: the one that
    settles second moves nothing and says so, instead of claiming its own verdict."""
    from workers import verification
    from workers.assignments import settlement

    alpha = Provider(alice, "alpha")
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    assignment = assign(task)
    assert alpha.submit(assignment, alpha.run_job(assignment, tmp_path)).status_code == 202
    honest = verification.verify

    def overtaken(row: Any) -> Any:
        verdict = honest(row)
        settlement.reject(row.pk, "the other verifier's verdict")  # it settled first
        return verdict

    monkeypatch.setattr(verification, "verify", overtaken)
    assert verify_assignment(str(assignment.pk)) == "skipped"
    refreshed(assignment)
    assert assignment.state == Assignment.State.REJECTED
    assert assignment.reason == "the other verifier's verdict"
