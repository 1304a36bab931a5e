"""Sweeping a worker's earnings into its owner's wallet: the node signs a TRANSFER from
its own address to the owner's custodial account, and the ledger admits it like any
other transaction. What is refused and why, that a refusal moves nothing, and the
``sweep`` command as a real process against a live daphne."""

from __future__ import annotations

import dataclasses
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone
from rest_framework.test import APIClient

from ledger import gas
from ledger import services as ledger
from ledger.models import Account, Transaction
from ledger.replay import verify_chain
from ledger.sealer import seal_all
from ledger.units import UNITS_PER_CREDIT, format_credits
from marketplace.models import TaskStatus
from protocol import encoding, keys
from protocol.wire import sign_template, template_tx
from tests.factories import assign, make_worker, post_task
from tests.workers import processes as p
from workers.agent import runners
from workers.agent.identity import Credentials
from workers.agent.jobs import Node
from workers.models import Assignment, Worker
from workers.tasks import verify_assignment

pytestmark = pytest.mark.django_db

SWEEP = "/api/v1/workers/me/sweep/"
FEE = gas.fee_for(encoding.TRANSFER, settings.LEDGER_GAS_PRICE)


class Rig:
    """One registered node as it talks to the platform: its worker row, key and client."""

    def __init__(self, owner: Any, name: str) -> None:
        self.worker, self.token, self.key = make_worker(owner, name=name)
        self.client = APIClient()
        self.client.credentials(HTTP_AUTHORIZATION=f"Worker {self.token}")

    def template(self) -> Any:
        return self.client.get(SWEEP)

    def signed(self, template: dict[str, Any], **changes: Any) -> dict[str, Any]:
        """The template (with ``changes``) signed as the agent signs it."""
        tx = {**template, **changes}
        signature = sign_template(tx, self.key)
        return {**tx, "public_key": self.key.public_key.hex(), "signature": signature.hex()}

    def forged(self, template: dict[str, Any], forger: keys.KeyPair) -> dict[str, Any]:
        """The exact bytes the worker would sign, claiming its key, signed by another."""
        tx = dataclasses.replace(template_tx(template), public_key=self.key.public_key)
        return {**template, "public_key": self.key.public_key.hex(), "signature": forger.sign(tx.encode()).hex()}

    def sweep(self, body: dict[str, Any]) -> Any:
        return self.client.post(SWEEP, body, format="json")


def pay(worker: Worker, payer: Any, units: int) -> int:
    """Release ``units`` from a task's escrow to the worker, as settlement does; returns
    what reached the worker address (the platform keeps its fee share)."""
    task_id = uuid.uuid4()
    ledger.lock_escrow(task_id, payer, units, reference=f"lock:{task_id}")
    return ledger.release_to_worker(task_id, worker.address, units, reference=f"reward:{task_id}").amount


def earn(rig: Rig, requester: Any, workdir: Path) -> Assignment:
    """A synthetic job run, signed and submitted as the agent does, verified and paid."""
    task = post_task(requester, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    assignment = assign(task)
    assert assignment.worker == rig.worker
    url = f"/api/v1/assignments/{assignment.pk}/"
    job = rig.client.get(url).json()
    assert rig.client.post(f"{url}start/").status_code == 200
    workdir.mkdir()
    outcome = runners.run(job, workdir, lambda step, total, metrics: None)
    for name, path in outcome.artifacts.items():
        up = rig.client.put(
            f"{url}artifacts/{name}/",
            data=path.read_bytes(),
            content_type="application/octet-stream",
            HTTP_CONTENT_DISPOSITION=f'attachment; filename="{name}"',
        )
        assert up.status_code == 201, up.content
    creds = Credentials(server="http://testserver", worker_id=str(rig.worker.pk), address=rig.key.address, token="")
    node = Node(rig.key, creds, "http://testserver")
    try:
        body = node.sign_result(job, outcome)
    finally:
        node.http.close()
    assert rig.client.post(f"{url}result/", body, format="json").status_code == 202
    assert verify_assignment(str(assignment.pk)) == "accepted"
    assignment.refresh_from_db()
    assert assignment.task.status == TaskStatus.COMPLETED
    return assignment


def money() -> tuple[dict[str, int], int]:
    """Every account's spendable balance and the number of stored transactions."""
    return dict(Account.objects.values_list("address", "available")), Transaction.objects.count()


@pytest.fixture
def alpha(alice: Any) -> Rig:
    return Rig(alice, "alpha")


@pytest.fixture
def paid_alpha(alpha: Rig, bob: Any) -> Rig:
    pay(alpha.worker, bob, 3 * UNITS_PER_CREDIT)
    return alpha


def test_a_worker_sweeps_its_earnings_into_its_owners_wallet(
    alpha: Rig, alice: Any, alice_client: APIClient, bob: Any, tmp_path: Path
) -> None:
    # One job at the minimum price pays its own SUBMIT_RESULT gas and still leaves more
    # than a sweep's fee (marketplace.pricing.minimum_reward): one job is enough to cash out.
    earn(alpha, bob, tmp_path / "1")
    earned = ledger.address_balance(alpha.worker.address)
    assert earned > FEE
    alice_before = ledger.balance(alice)

    response = alpha.template()
    assert response.status_code == 200, response.json()
    template = response.json()
    assert template == {
        "chain_id": settings.LEDGER_CHAIN_ID,
        "type": "TRANSFER",
        "from": alpha.worker.address,
        "to": ledger.ensure_user_account(alice).address,
        "amount": earned - FEE,
        "fee": FEE,
        "nonce": 1,  # after the worker's own SUBMIT_RESULT
        "gas_price": settings.LEDGER_GAS_PRICE,
        "gas_limit": gas.gas_limit(encoding.TRANSFER),
        "payload": {"memo": "sweep"},
    }

    response = alpha.sweep(alpha.signed(template))
    assert response.status_code == 202, response.json()
    body = response.json()
    assert (body["type"], body["status"], body["from"], body["to"]) == (
        "TRANSFER",
        "pending",
        alpha.worker.address,
        template["to"],
    )
    assert ledger.address_balance(alpha.worker.address) == 0
    assert ledger.balance(alice) == alice_before + earned - FEE

    blocks = seal_all()
    assert blocks
    assert Transaction.objects.get(hash=body["hash"]).block_id is not None
    summary = verify_chain()
    assert summary is not None
    assert Account.objects.get(address=template["to"]).balance == alice_before + earned - FEE
    # The provider's wallet lists the credits, and there is nothing left to sweep.
    wallet = alice_client.get("/api/v1/ledger/wallet/").json()
    assert wallet["transactions"][0]["hash"] == body["hash"]
    again = alpha.template()
    assert again.status_code == 400
    assert "Nothing to sweep" in again.json()["amount"][0]


@pytest.mark.parametrize("state", ["offered", "running", "submitted"])
def test_no_sweep_while_an_assignment_is_unsettled(paid_alpha: Rig, bob: Any, state: str) -> None:
    template = paid_alpha.template().json()
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    assignment = assign(task)
    Assignment.objects.filter(pk=assignment.pk).update(state=state)
    before = money()

    response = paid_alpha.template()
    assert response.status_code == 409
    assert f"unsettled assignment ({state})" in response.json()["state"][0]
    # A template fetched before the job came is refused too: the job holds its nonce.
    late = paid_alpha.sweep(paid_alpha.signed(template))
    assert late.status_code == 409
    assert money() == before

    Assignment.objects.filter(pk=assignment.pk).update(state=Assignment.State.EXPIRED)
    assert paid_alpha.sweep(paid_alpha.signed(template)).status_code == 202


def test_a_forged_signature_is_refused(paid_alpha: Rig) -> None:
    template = paid_alpha.template().json()
    before = money()
    forged = paid_alpha.sweep(paid_alpha.forged(template, keys.generate()))
    assert forged.status_code == 400
    assert forged.json()["code"] == "bad_signature"
    assert "signature" in forged.json()
    # A genuine signature over other fields does not carry over either.
    genuine = paid_alpha.signed(template)
    altered = paid_alpha.sweep({**genuine, "amount": template["amount"] - 1})
    assert altered.status_code == 400
    assert altered.json()["code"] == "bad_signature"
    assert money()[0] == before[0]
    assert not Transaction.objects.filter(type="TRANSFER", status="pending").exists()


def test_a_sweep_to_another_account_is_refused(paid_alpha: Rig, bob: Any) -> None:
    template = paid_alpha.template().json()
    before = money()
    elsewhere = ledger.ensure_user_account(bob).address
    response = paid_alpha.sweep(paid_alpha.signed(template, to=elsewhere))
    assert response.status_code == 400
    assert response.json() == {"to": [f"A sweep goes to the owner's account, {template['to']}."]}
    assert money() == before


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"amount": 0}, "amount", "must be positive"),
        ({"amount": 10**30}, "amount", "less than or equal"),
        ({"nonce": 7}, "nonce", "expected nonce 0"),
        ({"fee": 0}, "fee", "fee must equal gas_limit"),
        ({"type": "PAYOUT"}, "type", "Only TRANSFER can"),
    ],
    ids=["zero", "huge", "nonce", "no-fee", "type"],
)
def test_a_malformed_sweep_is_refused_naming_the_field(
    paid_alpha: Rig, changes: dict[str, Any], field: str, message: str
) -> None:
    template = paid_alpha.template().json()
    before = money()
    if changes.get("amount", 0) > encoding.MAX_UINT:
        body = {**paid_alpha.signed(template), **changes}  # cannot even be signed
    else:
        body = paid_alpha.signed(template, **changes)
    response = paid_alpha.sweep(body)
    assert response.status_code == 400, response.json()
    assert message in str(response.json()[field]), response.json()
    assert money()[0] == before[0]


def test_more_than_the_balance_is_refused(paid_alpha: Rig) -> None:
    template = paid_alpha.template().json()
    before = money()
    response = paid_alpha.sweep(paid_alpha.signed(template, amount=template["amount"] + 1))
    assert response.status_code == 400
    assert response.json()["code"] == "insufficient_funds"
    assert "amount" in response.json()
    assert money()[0] == before[0]


def test_nothing_to_sweep(alpha: Rig, bob: Any) -> None:
    response = alpha.template()
    assert response.status_code == 400
    assert response.json() == {"amount": [f"Nothing to sweep: the balance (0 units) does not exceed the fee ({FEE})."]}


def test_another_workers_token_cannot_sweep_this_worker(paid_alpha: Rig, alice: Any, bob: Any) -> None:
    template = paid_alpha.template().json()
    signed = paid_alpha.signed(template)
    for intruder in (Rig(alice, "teammate"), Rig(bob, "outsider")):
        pay(intruder.worker, bob, UNITS_PER_CREDIT)
        mine = intruder.template().json()
        assert mine["from"] == intruder.worker.address  # a token only ever sees its own worker
        before = money()
        response = intruder.sweep(signed)
        assert response.status_code == 400
        assert response.json() == {"from": [f"A sweep is sent from this worker's address, {intruder.worker.address}."]}
        assert money() == before
    assert ledger.address_balance(paid_alpha.worker.address) == template["amount"] + FEE


def test_only_an_active_workers_token_may_sweep(
    paid_alpha: Rig, alice_client: APIClient, anon_client: APIClient
) -> None:
    assert anon_client.get(SWEEP).status_code == 401
    assert alice_client.get(SWEEP).status_code == 403  # a person's login is not a worker
    bad = APIClient()
    bad.credentials(HTTP_AUTHORIZATION="Worker pww_not-a-token")
    assert bad.get(SWEEP).status_code == 401
    Worker.objects.filter(pk=paid_alpha.worker.pk).update(state=Worker.State.SUSPENDED)
    assert paid_alpha.template().status_code == 401


def test_a_replayed_sweep_moves_nothing_again(paid_alpha: Rig, alice: Any) -> None:
    signed = paid_alpha.signed(paid_alpha.template().json())
    first = paid_alpha.sweep(signed)
    assert first.status_code == 202
    after = money()
    replay = paid_alpha.sweep(signed)
    assert replay.status_code == 200
    assert replay.json()["hash"] == first.json()["hash"]
    assert money() == after
    seal_all()
    sealed = money()
    assert paid_alpha.sweep(signed).status_code == 200
    assert money() == sealed
    assert Transaction.objects.filter(type="TRANSFER", sender=paid_alpha.worker.address).count() == 1
    verify_chain()


def test_the_worker_page_shows_unswept_earnings_and_the_command(
    paid_alpha: Rig, alice: Any, bob: Any, client: Any
) -> None:
    client.force_login(alice)
    page = client.get(f"/workers/{paid_alpha.worker.pk}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "Unswept earnings" in html
    earned = ledger.address_balance(paid_alpha.worker.address)
    assert f'<dd id="unswept-balance">{format_credits(earned)} credits</dd>' in html
    assert "python -m workers.agent --key worker.pem sweep --server http://testserver" in html
    assert ledger.ensure_user_account(alice).address in html
    assert f"of which {format_credits(0)} went back as gas" in html  # paid outright: no result of its own
    paid_alpha.sweep(paid_alpha.signed(paid_alpha.template().json()))
    html = client.get(f"/workers/{paid_alpha.worker.pk}/").content.decode()
    assert '<dd id="unswept-balance">0 credits</dd>' in html
    assert "Nothing to sweep" in html
    # The sweep's fee came out of the worker's balance: the page counts it.
    assert f"of which {format_credits(FEE)} went back as gas for its results and sweeps" in html
    client.force_login(bob)
    assert client.get(f"/workers/{paid_alpha.worker.pk}/").status_code == 404


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_sweep_command_against_a_live_server(alice: Any, bob: Any, tmp_path: Path) -> None:
    env = p.child_env()

    def sweep(key: Path, *extra: str) -> subprocess.CompletedProcess[str]:
        args = p.agent_cmd(key, "sweep", "--server", url, *extra)
        return subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)

    with p.daphne(tmp_path) as url:
        key = p.register_agent(tmp_path, url, alice, "rig")
        worker = Worker.objects.get(name="rig")
        earned = pay(worker, bob, 2 * UNITS_PER_CREDIT)
        alice_before = ledger.balance(alice)

        dry = sweep(key, "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert "Dry run" in dry.stdout
        assert ledger.address_balance(worker.address) == earned

        done = sweep(key, "--yes")  # no terminal to confirm on
        assert done.returncode == 0, done.stderr
        to = ledger.ensure_user_account(alice).address
        shown = f"Sweep {format_credits(earned - FEE)} credits (fee {format_credits(FEE)}) from {worker.address}"
        assert f"{shown} to your account {to} (nonce 1)." in done.stdout
        tx = Transaction.objects.get(type="TRANSFER", sender=worker.address)
        assert f"Swept: transaction {tx.hash} is pending" in done.stdout
        assert ledger.balance(alice) == alice_before + earned - FEE

        empty = sweep(key)
        assert empty.returncode == 1
        assert "Nothing swept (HTTP 400): amount: Nothing to sweep" in empty.stderr
        assert "Traceback" not in empty.stderr

        pay(worker, bob, UNITS_PER_CREDIT)
        task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
        Worker.objects.filter(pk=worker.pk).update(last_heartbeat_at=timezone.now())
        assignment = assign(task)
        busy = sweep(key)
        assert busy.returncode == 1
        assert "not now (HTTP 409)" in busy.stderr
        assert "unsettled assignment (offered)" in busy.stderr
        assert "Traceback" not in busy.stderr

        Worker.objects.filter(pk=worker.pk).update(state=Worker.State.SUSPENDED)
        refused = sweep(key)
        assert refused.returncode == 1
        assert "refused this worker's token (HTTP 401)" in refused.stderr
        assert "Traceback" not in refused.stderr
        assert Transaction.objects.filter(type="TRANSFER", sender=worker.address).count() == 1
        assert Assignment.objects.get(pk=assignment.pk).state == Assignment.State.OFFERED


def test_a_node_looping_on_sweeps_is_throttled(paid_alpha: Rig) -> None:
    template = paid_alpha.template().json()
    forged = paid_alpha.forged(template, keys.generate())
    codes = [paid_alpha.sweep(forged).status_code for _ in range(30)]  # the template was the 1st of 30
    assert codes[:29] == [400] * 29
    assert codes[29] == 429
    refused = Transaction.objects.filter(status="refused").count()
    assert paid_alpha.sweep(paid_alpha.signed(template)).status_code == 429
    assert Transaction.objects.filter(status="refused").count() == refused


def test_the_worker_page_warns_of_a_sweep_small_beside_its_fee(alpha: Rig, alice: Any, bob: Any, client: Any) -> None:
    """Under ten times its fee a sweep is still offered (the credits are the provider's),
    with a warning naming both numbers; the ledger takes it as any other."""
    client.force_login(alice)
    ledger.transfer(bob, alpha.worker.address, FEE + 100_000, "tip")
    html = client.get(f"/workers/{alpha.worker.pk}/").content.decode()
    warning = f"This sweep would move {format_credits(100_000)} credits, less than ten times its {format_credits(FEE)}-credit fee."
    assert warning in html
    assert "sweep --server http://testserver" in html  # still offered
    assert alpha.sweep(alpha.signed(alpha.template().json())).status_code == 202

    ledger.transfer(bob, alpha.worker.address, FEE + 10 * FEE, "tip-2")
    html = client.get(f"/workers/{alpha.worker.pk}/").content.decode()
    assert f"It moves {format_credits(10 * FEE)} credits" in html
    assert 'id="sweep-small"' not in html
