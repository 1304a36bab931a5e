"""A worker's side of an assignment over the REST API: a real synthetic result (computed
by the agent's runner at n = 64, signed by the agent's own code), what is refused and why,
and that a refusal moves no money; then rejection, reassignment, exhausted attempts and
the node reporting a job it cannot finish."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from ledger import services as ledger
from ledger.models import Account, Transaction
from ledger.units import UNITS_PER_CREDIT
from marketplace.models import Task, TaskStatus
from protocol import keys
from protocol.encoding import ComputeResult
from protocol.signing import sign_compute_result
from tests.factories import make_worker, post_task
from workers.agent import runners
from workers.agent.identity import Credentials
from workers.agent.jobs import Node
from workers.assignments import jobs, scheduler, settlement, supply
from workers.identity import services
from workers.models import Assignment, Worker
from workers.tasks import verify_assignment

pytestmark = pytest.mark.django_db


class Provider:
    """One registered node as the platform sees it: its worker row, REST client and key."""

    def __init__(self, owner: Any, name: str) -> None:
        self.worker, self.token, self.key = make_worker(owner, name=name)
        self.client = APIClient()
        self.client.credentials(HTTP_AUTHORIZATION=f"Worker {self.token}")

    def url(self, assignment: Assignment, tail: str = "") -> str:
        return f"/api/v1/assignments/{assignment.pk}/{tail}"

    def run_job(self, assignment: Assignment, workdir: Path, *, tamper: bool = False) -> dict[str, Any]:
        """What the agent does: fetch, start, compute, upload; returns the signed body."""
        job = self.client.get(self.url(assignment)).json()
        assert self.client.post(self.url(assignment, "start/")).status_code == 200
        outcome = runners.run(job, workdir, lambda step, total, metrics: None)
        for name, path in outcome.artifacts.items():
            data = bytearray(path.read_bytes())
            if tamper:
                data[-4] ^= 1  # the last product entry is off by one; the committed root is not
            response = self.client.put(
                self.url(assignment, f"artifacts/{name}/"),
                data=bytes(data),
                content_type="application/octet-stream",
                HTTP_CONTENT_DISPOSITION=f'attachment; filename="{name}"',
            )
            assert response.status_code == 201, response.content
        return self.sign(job, outcome)

    def sign(self, job: dict[str, Any], outcome: runners.Outcome) -> dict[str, Any]:
        """The signed result body, as the agent's Node builds it."""
        creds = Credentials(
            server="http://testserver", worker_id=str(self.worker.pk), address=self.key.address, token=""
        )
        node = Node(self.key, creds, "http://testserver")
        try:
            return node.sign_result(job, outcome)
        finally:
            node.http.close()

    def submit(self, assignment: Assignment, body: dict[str, Any]) -> Any:
        return self.client.post(self.url(assignment, "result/"), body, format="json")


def money() -> tuple[dict[str, int], int]:
    """Every account's spendable balance and the number of transactions: what must not move."""
    return dict(Account.objects.values_list("address", "available")), Transaction.objects.count()


@pytest.fixture
def alpha(alice: Any) -> Provider:
    return Provider(alice, "alpha")


@pytest.fixture
def task(bob: Any) -> Task:
    return post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT, max_attempts=2)


@pytest.fixture
def assignment(alpha: Provider, task: Task) -> Assignment:
    (one,) = scheduler.schedule(task.pk)
    assert one.worker == alpha.worker
    return one


def test_an_honest_result_is_verified_and_paid_and_a_duplicate_is_harmless(
    alpha: Provider, task: Task, assignment: Assignment, bob: Any, tmp_path: Path
) -> None:
    bob_before = ledger.balance(bob) + ledger.escrowed(bob)
    body = alpha.run_job(assignment, tmp_path)
    response = alpha.submit(assignment, body)
    assert response.status_code == 202, response.json()
    assert response.json() == {"state": "submitted"}
    assert Task.objects.get(pk=task.pk).status == TaskStatus.VERIFYING

    again = alpha.submit(assignment, body)
    assert again.status_code == 409
    assert again.json() == {
        "state": ["This assignment is submitted; it takes no result."],
        "assignment_state": "submitted",
    }

    assert verify_assignment(str(assignment.pk)) == "accepted"
    assert verify_assignment(str(assignment.pk)) == "skipped"  # a redelivered message changes nothing
    task.refresh_from_db()
    assert task.status == TaskStatus.COMPLETED
    alpha.worker.refresh_from_db()
    assert alpha.worker.earnings > 0
    assert alpha.worker.jobs_done == 1
    assert ledger.escrowed(bob) == 0
    assert ledger.balance(bob) == bob_before - settlement.reward_per_replica(task)

    settled = money()
    late = alpha.submit(assignment, body)
    assert late.status_code == 409
    assert late.json() == {
        "state": ["This assignment is accepted; it takes no result."],
        "assignment_state": "accepted",
    }
    assert money() == settled
    assert Transaction.objects.filter(type="SUBMIT_RESULT", sender=alpha.worker.address).count() == 1


def test_a_result_for_an_expired_assignment_is_refused(alpha: Provider, assignment: Assignment, tmp_path: Path) -> None:
    body = alpha.run_job(assignment, tmp_path)
    Worker.objects.filter(pk=alpha.worker.pk).update(last_heartbeat_at=None)
    Assignment.objects.filter(pk=assignment.pk).update(deadline=assignment.created_at)
    assert scheduler.expire_overdue() == 1
    before = money()
    response = alpha.submit(assignment, body)
    assert response.status_code == 409
    assert response.json() == {
        "state": ["This assignment is expired; it takes no result."],
        "assignment_state": "expired",
    }
    assert money() == before
    assert Assignment.objects.get(pk=assignment.pk).result == {}


def test_a_result_for_another_workers_assignment_is_refused(
    alpha: Provider, assignment: Assignment, alice: Any, tmp_path: Path
) -> None:
    body = alpha.run_job(assignment, tmp_path)
    intruder = Provider(alice, "intruder")
    before = money()
    response = intruder.submit(assignment, body)
    assert response.status_code == 404
    assert response.json() == {"detail": "No such assignment for this worker."}
    assert intruder.client.get(alpha.url(assignment)).status_code == 404
    assert money() == before
    assert Assignment.objects.get(pk=assignment.pk).state == Assignment.State.RUNNING


def _forged_compute_result(body: dict[str, Any]) -> dict[str, Any]:
    cr = body["compute_result"]
    forged = sign_compute_result(
        ComputeResult(cr["task_id"], cr["worker_address"], cr["result_hash"], cr["proof"], cr["nonce"]), keys.generate()
    )
    return {**body, "compute_result": forged.to_json()}


def _tx(body: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**body, "transaction": {**body["transaction"], **changes}}


@pytest.mark.parametrize(
    ("tamper", "field", "message"),
    [
        (_forged_compute_result, "compute_result", "The signature does not verify with this worker's key."),
        (lambda b: _tx(b, fee=0), "transaction", "fee must be"),
        (lambda b: _tx(b, nonce=b["transaction"]["nonce"] + 1), "transaction", "nonce must be"),
        (lambda b: _tx(b, payload={"compute_result": {}}), "transaction", "payload must be"),
        (lambda b: _tx(b, signature="00" * 64), "transaction", "The signature does not verify"),
        (lambda b: _tx(b, public_key=keys.generate().public_key.hex()), "transaction", "The signature does not verify"),
        (lambda b: {**b, "transaction": "nope"}, "transaction", "Expected the signed SUBMIT_RESULT"),
        (lambda b: {**b, "compute_result": {"task_id": 1}}, "compute_result", ""),
    ],
    ids=["forged-result-signature", "fee", "nonce", "payload", "tx-signature", "tx-key", "tx-shape", "result-shape"],
)
def test_a_tampered_result_is_refused_naming_the_field(
    alpha: Provider, assignment: Assignment, tmp_path: Path, tamper: Any, field: str, message: str
) -> None:
    body = alpha.run_job(assignment, tmp_path)
    before = money()
    response = alpha.submit(assignment, tamper(body))
    assert response.status_code == 400
    errors = response.json()
    assert list(errors) == [field]
    assert message in errors[field][0]
    assert money() == before
    assert Assignment.objects.get(pk=assignment.pk).state == Assignment.State.RUNNING
    # The honest body still goes through afterwards: a refusal left nothing behind.
    assert alpha.submit(assignment, body).status_code == 202


def test_a_rejected_result_costs_reputation_and_the_job_is_reassigned(
    alpha: Provider, task: Task, assignment: Assignment, alice: Any, bob: Any, tmp_path: Path
) -> None:
    beta = Provider(alice, "beta")
    escrow_before = ledger.escrowed(bob)
    reputation = alpha.worker.reputation
    assert alpha.submit(assignment, alpha.run_job(assignment, tmp_path / "a", tamper=True)).status_code == 202
    assert verify_assignment(str(assignment.pk)) == "rejected"

    assignment.refresh_from_db()
    assert assignment.state == Assignment.State.REJECTED
    assert assignment.reason
    reject = Transaction.objects.get(type="REJECT_RESULT")
    assert reject.status == "pending"
    assert not Transaction.objects.filter(type="SUBMIT_RESULT").exists()
    alpha.worker.refresh_from_db()
    assert alpha.worker.reputation == reputation - settlement.REPUTATION_DOWN
    assert alpha.worker.earnings == 0
    assert ledger.escrowed(bob) == escrow_before  # the money waits for the next attempt
    assert Task.objects.get(pk=task.pk).status == TaskStatus.OPEN

    (second,) = scheduler.schedule(task.pk)
    assert second.worker == beta.worker
    assert second.attempt == 2
    assert beta.submit(second, beta.run_job(second, tmp_path / "b")).status_code == 202
    assert verify_assignment(str(second.pk)) == "accepted"
    assert Task.objects.get(pk=task.pk).status == TaskStatus.COMPLETED


def test_a_true_claim_that_misses_the_quality_bar_costs_reputation_only_once_another_meets_it(
    alpha: Provider,
    task: Task,
    assignment: Assignment,
    alice: Any,
    bob: Any,
    carol: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from workers import verification

    # Stands in for a trained kind's verifier: the claimed metric matched the recomputed
    # one, but the model fell short of the task's bar (test_cube_kinds and test_asl_kinds
    # check that the real verifiers say so).
    real_verify = verification.verify
    short = verification.Verdict(False, "held-out val_loss 1.9 is only 1% below the untrained model's", penalise=False)
    monkeypatch.setattr(verification, "verify", lambda assignment: short)
    escrow_before = ledger.escrowed(bob)
    reputation = alpha.worker.reputation
    assert alpha.submit(assignment, alpha.run_job(assignment, tmp_path / "a")).status_code == 202
    assert verify_assignment(str(assignment.pk)) == "rejected"
    assignment.refresh_from_db()
    assert assignment.state == Assignment.State.REJECTED
    assert "only 1% below" in assignment.reason
    alpha.worker.refresh_from_db()
    assert alpha.worker.reputation == reputation  # the spec may make the bar unreachable
    assert alpha.worker.earnings == 0
    assert ledger.escrowed(bob) == escrow_before
    assert Task.objects.get(pk=task.pk).status == TaskStatus.OPEN

    # The short result's provider is not offered the task again, on any of its nodes (they
    # run the same code; a node could otherwise burn the task's attempts at no cost).
    Provider(alice, "alpha-2")
    assert scheduler.schedule(task.pk) == []
    task.refresh_from_db()
    assert "fell short of its quality bar" in task.status_reason
    assert task.status_reason.startswith("A result fell short of the task's quality bar")
    assert "within 60 minutes, it fails with a full refund" in task.status_reason

    # Another provider's result meets the bar: the bar was reachable, and the short result
    # now costs its worker SHORT_PENALTY, once.
    monkeypatch.setattr(verification, "verify", real_verify)
    gamma = Provider(carol, "gamma")
    (second,) = scheduler.schedule(task.pk)
    assert second.worker == gamma.worker
    assert gamma.submit(second, gamma.run_job(second, tmp_path / "b")).status_code == 202
    assert verify_assignment(str(second.pk)) == "accepted"
    assert Task.objects.get(pk=task.pk).status == TaskStatus.COMPLETED
    alpha.worker.refresh_from_db()
    assert alpha.worker.reputation == reputation - settlement.SHORT_PENALTY
    assignment.refresh_from_db()
    assert assignment.shortfall == "penalised"
    settlement.complete_stragglers()
    alpha.worker.refresh_from_db()
    assert alpha.worker.reputation == reputation - settlement.SHORT_PENALTY


def short_of_the_bar(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Make the verifier judge every result a true claim short of the task's bar; returns
    the real verifier (test_cube_kinds and test_asl_kinds check the real verdicts)."""
    from workers import verification

    real = verification.verify
    short = verification.Verdict(False, "held-out top-1 accuracy 0.2 is below the required 0.9.", penalise=False)
    monkeypatch.setattr(verification, "verify", lambda assignment: short)
    return real


def test_a_result_short_of_a_bar_another_replica_met_costs_reputation_at_once(
    alice: Any, bob: Any, carol: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers import verification

    alpha, gamma = Provider(alice, "alpha"), Provider(carol, "gamma")
    task = post_task(bob, "synthetic", {"n": 64}, budget=3 * UNITS_PER_CREDIT, replication=2)
    first, second = scheduler.schedule(task.pk)
    mine = {first.worker_id: first, second.worker_id: second}
    accepted_first, short_later = mine[gamma.worker.pk], mine[alpha.worker.pk]
    assert gamma.submit(accepted_first, gamma.run_job(accepted_first, tmp_path / "g")).status_code == 202
    assert verify_assignment(str(accepted_first.pk)) == "accepted"

    reputation = Worker.objects.get(pk=alpha.worker.pk).reputation
    real = short_of_the_bar(monkeypatch)
    assert alpha.submit(short_later, alpha.run_job(short_later, tmp_path / "a")).status_code == 202
    assert verify_assignment(str(short_later.pk)) == "rejected"
    monkeypatch.setattr(verification, "verify", real)
    short_later.refresh_from_db()
    assert short_later.shortfall == "penalised"
    assert Worker.objects.get(pk=alpha.worker.pk).reputation == reputation - settlement.SHORT_PENALTY


def test_a_task_whose_bar_no_other_provider_reaches_fails_with_a_full_refund(
    alpha: Provider,
    task: Task,
    assignment: Assignment,
    bob: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
) -> None:
    from datetime import timedelta

    total_before = ledger.balance(bob) + ledger.escrowed(bob)
    short_of_the_bar(monkeypatch)
    assert alpha.submit(assignment, alpha.run_job(assignment, tmp_path)).status_code == 202
    assert verify_assignment(str(assignment.pk)) == "rejected"
    # Attempts remain (max_attempts 2), but no other provider is online to use them.
    assert scheduler.schedule(task.pk) == []
    assert Task.objects.get(pk=task.pk).status == TaskStatus.OPEN
    # An hour on (PROOFWORK_SHORTFALL_WAIT), nobody else has taken it: the bar may be unreachable.
    settled = Assignment.objects.get(pk=assignment.pk).settled_at
    assert settled is not None
    Assignment.objects.filter(pk=assignment.pk).update(
        settled_at=settled - timedelta(seconds=settings.SHORTFALL_WAIT + 1)
    )
    assert scheduler.schedule(task.pk) == []
    task.refresh_from_db()
    assert task.status == TaskStatus.FAILED
    assert "fell short of the task's quality bar" in task.status_reason
    assert "Fully refunded" in task.status_reason
    assert ledger.escrowed(bob) == 0
    assert ledger.balance(bob) == total_before
    assert Worker.objects.get(pk=alpha.worker.pk).reputation == alpha.worker.reputation  # never met: excused


def test_when_every_attempt_is_rejected_the_task_fails_with_a_full_refund(
    alpha: Provider, task: Task, assignment: Assignment, alice: Any, bob: Any, tmp_path: Path
) -> None:
    total_before = ledger.balance(bob) + ledger.escrowed(bob)
    beta = Provider(alice, "beta")
    assert alpha.submit(assignment, alpha.run_job(assignment, tmp_path / "a", tamper=True)).status_code == 202
    assert verify_assignment(str(assignment.pk)) == "rejected"
    (second,) = scheduler.schedule(task.pk)
    assert beta.submit(second, beta.run_job(second, tmp_path / "b", tamper=True)).status_code == 202
    assert verify_assignment(str(second.pk)) == "rejected"
    Provider(alice, "gamma")  # willing, but the task's two attempts are spent

    assert scheduler.schedule(task.pk) == []
    task.refresh_from_db()
    assert task.status == TaskStatus.FAILED
    assert ledger.escrowed(bob) == 0
    assert ledger.balance(bob) == total_before
    assert Transaction.objects.filter(type="REJECT_RESULT").count() == 2


def test_a_node_reports_a_job_it_cannot_finish(alpha: Provider, task: Task, assignment: Assignment, alice: Any) -> None:
    beta = Provider(alice, "beta")
    assert alpha.client.post(alpha.url(assignment, "start/")).status_code == 200
    assert Task.objects.get(pk=task.pk).status == TaskStatus.RUNNING

    missing = alpha.client.post(alpha.url(assignment, "fail/"), {}, format="json")
    assert missing.status_code == 400
    assert list(missing.json()) == ["reason"]
    foreign = beta.client.post(alpha.url(assignment, "fail/"), {"reason": "x"}, format="json")
    assert foreign.status_code == 404

    response = alpha.client.post(
        alpha.url(assignment, "fail/"), {"reason": "RuntimeError: CUDA out of memory"}, format="json"
    )
    assert response.status_code == 200
    assert response.json() == {"state": "expired", "reason": "The worker gave up: RuntimeError: CUDA out of memory"}
    alpha.worker.refresh_from_db()
    assert alpha.worker.reputation == 50 - jobs.FAIL_PENALTY
    task.refresh_from_db()
    assert task.status == TaskStatus.OPEN
    assert task.events.filter(message__contains="could not finish").exists()

    again = alpha.client.post(alpha.url(assignment, "fail/"), {"reason": "again"}, format="json")
    assert again.status_code == 409
    (second,) = scheduler.schedule(task.pk)
    assert second.worker == beta.worker


def test_a_suspended_workers_token_is_refused(alpha: Provider, assignment: Assignment, alice: Any) -> None:
    services.set_worker_state(alice, alpha.worker.pk, "suspended")
    response = alpha.client.get(alpha.url(assignment))
    assert response.status_code == 401
    assert "suspended" in response.json()["detail"]


def test_a_deactivated_accounts_nodes_are_refused_and_get_no_work(
    alpha: Provider, assignment: Assignment, alice: Any, bob: Any
) -> None:
    assert alpha.client.get(alpha.url(assignment)).status_code == 200
    alice.is_active = False  # an operator deactivates the provider's account
    alice.save(update_fields=["is_active"])
    response = alpha.client.get(alpha.url(assignment))
    assert response.status_code == 401
    assert "account is deactivated" in response.json()["detail"]
    assert alpha.client.post(alpha.url(assignment, "start/")).status_code == 401
    # Its heartbeat is recent, but it no longer counts as online: no work is offered.
    assert alpha.worker.pk not in {w.pk for w in supply.online_workers()}
    other = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    assert scheduler.schedule(other.pk) == []
    other.refresh_from_db()
    assert "no worker is online" in other.status_reason.lower()
    alice.is_active = True
    alice.save(update_fields=["is_active"])
    assert alpha.worker.pk in {w.pk for w in supply.online_workers()}


def test_a_result_signed_before_a_gas_price_change_is_still_taken_and_paid(
    alpha: Provider, task: Task, assignment: Assignment, tmp_path: Path, settings: Any
) -> None:
    # The node fetched its job, and the SUBMIT_RESULT template in it, at the old price.
    settings.LEDGER_GAS_PRICE = 1_000
    body = alpha.run_job(assignment, tmp_path)
    assert body["transaction"]["gas_price"] == 1_000
    settings.LEDGER_GAS_PRICE = 5  # the platform lowered its price while the job ran
    response = alpha.submit(assignment, body)
    assert response.status_code == 202, response.json()
    assert verify_assignment(str(assignment.pk)) == "accepted"
    sealed = Transaction.objects.get(type="SUBMIT_RESULT", sender=alpha.worker.address)
    assert (sealed.gas_price, sealed.fee) == (1_000, 80_000 * 1_000)


def test_a_gas_price_whose_fee_exceeds_the_jobs_pay_is_refused(
    alpha: Provider, assignment: Assignment, tmp_path: Path
) -> None:
    # A node signing a huge fee would have its result settle never (the reward cannot pay
    # it): refused at once, naming the transaction, the honest body still taken after.
    body = alpha.run_job(assignment, tmp_path)
    greedy = _tx(body, gas_price=10**9, fee=80_000 * 10**9)
    response = alpha.submit(assignment, greedy)
    assert response.status_code == 400
    assert "more than the job pays" in response.json()["transaction"][0]
    assert alpha.submit(assignment, body).status_code == 202
