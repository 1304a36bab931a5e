"""Bad or unwelcome input from providers and their nodes: a clear 4xx, nothing written."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from marketplace.units import UNITS_PER_CREDIT
from tests.factories import post_task
from tests.workers.test_jobs import Provider
from workers import scheduler, services
from workers.models import RegistrationToken, Worker

pytestmark = pytest.mark.django_db

DEEP = "[" * 100_000 + "]" * 100_000


def test_deeply_nested_json_is_a_400_on_every_worker_endpoint(alice: Any, bob: Any) -> None:
    alpha = Provider(alice, "alpha")
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    (assignment,) = scheduler.schedule(task.pk)
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
    services.set_worker_state(alice, alpha.worker.pk, Worker.State.SUSPENDED, by_platform=True)

    refused = alice_client.post("/api/v1/workers/registration-tokens/")
    assert refused.status_code == 403
    assert "operator suspended your worker alpha" in refused.json()["detail"]
    page = Client()
    page.force_login(alice)
    body = page.post("/workers/register").content.decode()
    assert "operator suspended your worker alpha" in body
    assert "registration-token" not in body
    assert not RegistrationToken.objects.filter(owner=alice).exists()

    # Once the operators lift it, registering works again.
    services.set_worker_state(alice, alpha.worker.pk, Worker.State.ACTIVE, by_platform=True)
    assert alice_client.post("/api/v1/workers/registration-tokens/").status_code == 201
