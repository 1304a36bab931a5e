"""Bad or unwelcome input from providers and their nodes: a clear 4xx, nothing written."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from ledger.units import UNITS_PER_CREDIT
from tests.factories import assign, post_task
from tests.form_nonces import submit
from tests.workers.test_jobs import Provider
from workers.identity import services
from workers.models import RegistrationToken, Worker

pytestmark = pytest.mark.django_db

DEEP = "[" * 100_000 + "]" * 100_000


def test_deeply_nested_json_is_a_400_on_every_worker_endpoint(alice: Any, bob: Any) -> None:
    alpha = Provider(alice, "alpha")
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    assignment = assign(task)
    anonymous = APIClient()
    for client, url in [
        (anonymous, "/api/v1/workers/register/"),
        (anonymous, "/api/v1/workers/challenge/"),
        (alpha.client, alpha.url(assignment, "result/")),
        (alpha.client, alpha.url(assignment, "fail/")),
        (alpha.client, "/api/v1/workers/me/sweep/"),
    ]:
        response = client.post(url, DEEP, content_type="application/json")
        assert response.status_code == 400, (url, response.status_code)
        assert "nested too deeply" in response.json()["detail"]
    assignment.refresh_from_db()
    assert assignment.state == "offered"


def test_a_synthetic_task_whose_result_could_never_be_uploaded_is_refused(bob: Any, bob_client: APIClient) -> None:
    too_big = bob_client.post(
        "/api/v1/tasks/", {"kind": "synthetic", "budget": "100", "spec": {"n": 8192, "count": 8}}, format="json"
    )
    assert too_big.status_code == 400
    assert "at most 7 at this n" in too_big.json()["spec"]["count"][0]
    fits = bob_client.post(
        "/api/v1/tasks/", {"kind": "synthetic", "budget": "100", "spec": {"n": 8192, "count": 7}}, format="json"
    )
    assert fits.status_code == 201, fits.json()


def test_an_operators_suspension_is_not_undone_by_registering_a_new_key(alice: Any, alice_client: APIClient) -> None:
    alpha = Provider(alice, "alpha")
    services.set_worker_state(alice, alpha.worker.pk, Worker.State.SUSPENDED, by_platform=True, reason="abuse report")

    refused = alice_client.post("/api/v1/workers/registration-tokens/")
    assert refused.status_code == 403
    assert "operator suspended your worker alpha" in refused.json()["detail"]
    page = Client()
    page.force_login(alice)
    body = submit(page, "/workers/register", "/workers/register").content.decode()
    assert "operator suspended your worker alpha" in body
    assert "registration-token" not in body
    assert not RegistrationToken.objects.filter(owner=alice).exists()

    # Once the operators lift it, registering works again.
    services.set_worker_state(alice, alpha.worker.pk, Worker.State.ACTIVE, by_platform=True, reason="report cleared")
    assert alice_client.post("/api/v1/workers/registration-tokens/").status_code == 201


@pytest.mark.parametrize(
    ("reason", "words"),
    [("a\x00b", "Null characters"), ("\ud800", "Unpaired surrogates")],
    ids=["nul", "surrogate"],
)
def test_a_failure_reason_no_column_can_hold_is_a_400_and_the_job_stays(
    alice: Any, bob: Any, reason: str, words: str
) -> None:
    # The reason went into the assignment's row as sent: PostgreSQL refused the NUL and
    # no database could encode the lone surrogate, both a 500. The form body too.
    alpha = Provider(alice, "alpha")
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    assignment = assign(task)
    url = alpha.url(assignment, "fail/")
    response = alpha.client.post(url, json.dumps({"reason": reason}), content_type="application/json")
    assert response.status_code == 400
    assert response.json()["reason"][0].startswith(words)
    if reason == "a\x00b":
        form = alpha.client.post(url, "reason=a%00b", content_type="application/x-www-form-urlencoded")
        assert form.status_code == 400
        assert form.json() == {"reason": ["Null characters are not allowed."]}
    assignment.refresh_from_db()
    assert assignment.state == "offered"
    assert alpha.client.post(url, {"reason": "out of memory"}, format="json").json()["state"] == "expired"


@pytest.mark.parametrize("bad", ["a\x00b", ["synthetic", "\x00"]], ids=["nul", "nul in list"])
def test_capabilities_no_column_can_hold_are_a_400_naming_them(alice: Any, alice_client: APIClient, bad: Any) -> None:
    # A correctly signed registration whose capabilities PostgreSQL's jsonb refuses was a
    # 500 at the worker's insert; nothing may be written, and the token still works.
    from protocol import keys
    from tests.workers.test_registration import register

    raw = alice_client.post("/api/v1/workers/registration-tokens/").json()["token"]
    key = keys.generate()
    field = "kinds" if isinstance(bad, list) else "gpu_name"
    response = register(APIClient(), raw, key, caps={"cpu_cores": 2, field: bad})
    assert response.status_code == 400
    assert field in response.json()["capabilities"], response.json()
    assert not Worker.objects.filter(address=key.address).exists()
    assert register(APIClient(), raw, key).status_code == 201


@pytest.mark.parametrize("bad", [False, 0, [], {}], ids=["false", "zero", "list", "object"])
def test_a_capability_text_that_is_not_text_is_a_400_naming_it(alice: Any, alice_client: APIClient, bad: Any) -> None:
    from protocol import keys
    from tests.workers.test_registration import register

    raw = alice_client.post("/api/v1/workers/registration-tokens/").json()["token"]
    key = keys.generate()
    response = register(APIClient(), raw, key, caps={"cpu_cores": 2, "cuda_version": bad})
    assert response.status_code == 400
    assert "cuda_version" in response.json()["capabilities"], response.json()
    assert register(APIClient(), raw, key, caps={"cpu_cores": 2, "gpu_name": None}).status_code == 201


@pytest.mark.parametrize("bad", ["\ud800", "a\x00b"], ids=["lone surrogate", "nul"])
def test_form_capabilities_no_column_can_hold_are_a_400_and_nothing_is_written(
    alice: Any, alice_client: APIClient, bad: str
) -> None:
    """Sent as a form, the capabilities are JSON text that DRF decodes after the parser's
    checks: a ``\\ud800`` escape decoded to a lone surrogate. The registration committed
    (worker, used token, REGISTER_WORKER) and then its response could not be rendered: a
    500, the node without its API token, and the owner's worker pages 500s from then on."""
    from ledger.models import Transaction
    from protocol import keys
    from tests.workers.test_registration import register

    raw = alice_client.post("/api/v1/workers/registration-tokens/").json()["token"]
    key = keys.generate()
    response = register(APIClient(), raw, key, caps={"cpu_cores": 2, "gpu_name": bad}, fmt="multipart")
    assert response.status_code == 400
    assert "gpu_name" in response.json()["capabilities"], response.json()
    assert not Worker.objects.filter(address=key.address).exists()
    assert not Transaction.objects.filter(type="REGISTER_WORKER", sender=key.address).exists()
    assert register(APIClient(), raw, key, fmt="multipart").status_code == 201
    assert alice_client.get("/api/v1/workers/").status_code == 200


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"amount": False}, "amount must be 0."),
        ({"nonce": 0.0}, "nonce must be 0."),
        ({"memo": "rides along"}, "Unknown field(s): memo."),
    ],
    ids=["false for 0", "float for int", "extra field"],
)
def test_a_result_transaction_must_be_the_template_exactly(
    alice: Any, bob: Any, tmp_path: Any, change: dict[str, Any], message: str
) -> None:
    # Python's false == 0 and 0.0 == 0 let such a body through, and unknown keys were
    # stored with the result unchecked.
    alpha = Provider(alice, "alpha")
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    assignment = assign(task)
    body = alpha.run_job(assignment, tmp_path)
    bent = {**body, "transaction": {**body["transaction"], **change}}
    response = alpha.submit(assignment, bent)
    assert response.status_code == 400
    assert response.json() == {"transaction": [message]}
    assert alpha.submit(assignment, body).status_code == 202  # the honest body still goes through


def test_a_payload_signed_with_a_bool_for_a_number_is_refused_at_submission(
    alice: Any, bob: Any, tmp_path: Any
) -> None:
    # {"nonce": false} == {"nonce": 0} in Python: such a payload, signed as sent, passed the
    # template check and was refused only when settlement admitted it, leaving the task
    # "verifying" for hours. It is refused at once now, naming the payload.
    import dataclasses

    from protocol.signing import sign_tx
    from workers.assignments.jobs import signed_tx_from_json

    alpha = Provider(alice, "alpha")
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    assignment = assign(task)
    body = alpha.run_job(assignment, tmp_path)
    compute = body["transaction"]["payload"]["compute_result"]
    assert compute["nonce"] == 0
    payload = {"compute_result": {**compute, "nonce": False}}
    tx, _ = signed_tx_from_json(body["transaction"])
    _, signature = sign_tx(dataclasses.replace(tx, payload=payload), alpha.key)
    bent = {**body, "transaction": {**body["transaction"], "payload": payload, "signature": signature.hex()}}
    response = alpha.submit(assignment, bent)
    assert response.status_code == 400
    assert response.json() == {"transaction": ["payload must be {'compute_result': <the ComputeResult>}."]}
    assert alpha.submit(assignment, body).status_code == 202
