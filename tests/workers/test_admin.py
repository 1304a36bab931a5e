"""The admin panel shows nodes, jobs and registration tokens read-only; an operator
suspends, resumes or retires a node through the same service its owner uses, and an
operator's suspension holds against the owner. Only staff who may change workers act."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from rest_framework.test import APIClient

from ledger.units import UNITS_PER_CREDIT
from tests.factories import UserFactory, make_worker, post_task
from workers.assignments import scheduler
from workers.identity import services
from workers.models import Assignment, Worker

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client: Client) -> Client:
    root: Any = UserFactory(username="root", is_staff=True, is_superuser=True)
    client.force_login(root)
    return client


def act(client: Client, action: str, *workers: Worker, reason: str = "Seen sending forged results.") -> str:
    """Run an action as an operator does: through its confirmation page, with a reason."""
    chosen = {"action": action, "_selected_action": [str(w.pk) for w in workers]}
    asked = client.post("/admin/workers/worker/", chosen)
    assert asked.status_code == 200
    assert "Reason:" in asked.content.decode()
    response = client.post("/admin/workers/worker/", {**chosen, "confirm": "yes", "reason": reason}, follow=True)
    assert response.status_code == 200
    return response.content.decode()


def token_works(raw: str) -> bool:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Worker {raw}")
    return client.get("/api/v1/workers/me/sweep/").status_code not in (401, 403)


def test_nodes_and_their_jobs_are_listed_and_cannot_be_edited(admin_client: Client, alice: Any, bob: Any) -> None:
    worker, _, _ = make_worker(alice, name="alice-h100")
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    (assignment,) = scheduler.schedule(task.pk)
    token, _ = services.create_registration_token(alice)

    page = admin_client.get("/admin/workers/worker/").content.decode()
    assert "alice-h100" in page
    assert worker.address in page
    assert "token_hash" not in admin_client.get(f"/admin/workers/worker/{worker.pk}/change/").content.decode()
    assert task.title in admin_client.get("/admin/workers/assignment/?state=offered").content.decode()
    assert "alice" in admin_client.get("/admin/workers/registrationtoken/").content.decode()
    assert admin_client.get("/admin/workers/worker/add/").status_code == 403
    admin_client.post(f"/admin/workers/assignment/{assignment.pk}/change/", {"state": "accepted"})
    admin_client.post(f"/admin/workers/worker/{worker.pk}/delete/", {"post": "yes"})
    assert Assignment.objects.get(pk=assignment.pk).state == Assignment.State.OFFERED
    assert Worker.objects.filter(pk=worker.pk).exists()
    token_page = admin_client.get(f"/admin/workers/registrationtoken/{token.pk}/change/")
    assert token_page.status_code == 200
    assert "token_hash" not in token_page.content.decode()
    assert "challenge" not in token_page.content.decode()


def test_an_operator_suspends_resumes_and_retires_a_node(admin_client: Client, alice: Any) -> None:
    worker, raw, _ = make_worker(alice, name="alice-h100")
    assert token_works(raw)

    assert "Suspended 1 worker(s)." in act(admin_client, "suspend", worker)
    assert Worker.objects.get(pk=worker.pk).state == Worker.State.SUSPENDED
    assert not token_works(raw)

    assert "Resumed 1 worker(s)." in act(admin_client, "resume", worker)
    assert token_works(raw)

    assert "Retired 1 worker(s)." in act(admin_client, "retire", worker)
    page = act(admin_client, "resume", worker)
    assert "Worker “alice-h100”: A retired worker cannot become active." in page
    assert "Resumed 0 worker(s)." in page
    assert Worker.objects.get(pk=worker.pk).state == Worker.State.RETIRED
    assert not token_works(raw)


def test_only_staff_reach_the_workers_admin(client: Client, alice: Any) -> None:
    client.force_login(alice)
    assert client.get("/admin/workers/worker/").status_code == 302  # to the admin login


def owner_client(owner: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(owner)
    return client


def test_an_operators_suspension_holds_until_an_operator_lifts_it(admin_client: Client, alice: Any) -> None:
    worker, raw, _ = make_worker(alice, name="alice-h100")
    owner = owner_client(alice)
    act(admin_client, "suspend", worker)

    refused = owner.post(f"/api/v1/workers/{worker.pk}/resume/")
    assert refused.status_code == 400
    assert refused.json() == {"state": [services.HELD_BY_PLATFORM]}
    assert not token_works(raw)
    page = Client()
    page.force_login(alice)
    detail = page.get(f"/workers/{worker.pk}/").content.decode()
    assert "The platform's operators suspended this worker" in detail
    assert f'action="/workers/{worker.pk}/resume/"' not in detail
    assert owner.get(f"/api/v1/workers/{worker.pk}/").json()["held_by_platform"] is True

    act(admin_client, "resume", worker)
    assert token_works(raw)
    # Suspended by its owner, a node is the owner's to resume.
    assert owner.post(f"/api/v1/workers/{worker.pk}/suspend/").json()["held_by_platform"] is False
    assert f'action="/workers/{worker.pk}/resume/"' in page.get(f"/workers/{worker.pk}/").content.decode()
    assert owner.post(f"/api/v1/workers/{worker.pk}/resume/").json()["state"] == "active"


def test_staff_who_may_only_view_workers_cannot_act_on_them(client: Client, alice: Any) -> None:
    worker, raw, _ = make_worker(alice, name="alice-h100")
    viewer: Any = UserFactory(username="support", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_worker"))
    client.force_login(viewer)
    listing = client.get("/admin/workers/worker/").content.decode()
    assert "alice-h100" in listing
    assert 'value="retire"' not in listing
    forged = {"action": "retire", "_selected_action": [str(worker.pk)], "confirm": "yes", "reason": "Mine now."}
    assert "Reason:" not in client.post("/admin/workers/worker/", forged, follow=True).content.decode()
    assert Worker.objects.get(pk=worker.pk).state == Worker.State.ACTIVE
    assert token_works(raw)


def test_the_owner_reads_who_stopped_a_node_and_why(admin_client: Client, alice: Any) -> None:
    worker, _, _ = make_worker(alice, name="alice-h100")
    owner = owner_client(alice)
    page = Client()
    page.force_login(alice)

    act(admin_client, "suspend", worker, reason="Results failed verification 12 times today.")
    said = "Suspended by an operator: Results failed verification 12 times today."
    assert said in page.get(f"/workers/{worker.pk}/").content.decode()
    assert said in page.get("/workers/").content.decode()
    assert owner.get(f"/api/v1/workers/{worker.pk}/").json()["state_reason"] == said

    act(admin_client, "resume", worker, reason="Fixed after talking to the owner.")
    assert owner.get(f"/api/v1/workers/{worker.pk}/").json()["state_reason"] == (
        "Resumed by an operator: Fixed after talking to the owner."
    )
    # The owner's own change is theirs, and says so.
    owner.post(f"/api/v1/workers/{worker.pk}/suspend/")
    assert "Suspended by you." in page.get(f"/workers/{worker.pk}/").content.decode()
    assert "by an operator" not in page.get("/workers/").content.decode()


def test_an_operator_action_with_no_reason_leaves_the_node_as_it_was(admin_client: Client, alice: Any) -> None:
    worker, raw, _ = make_worker(alice, name="alice-h100")
    for extra in ({}, {"confirm": "yes"}, {"confirm": "yes", "reason": "  "}):
        admin_client.post("/admin/workers/worker/", {"action": "retire", "_selected_action": [str(worker.pk)], **extra})
    worker.refresh_from_db()
    assert (worker.state, worker.state_reason) == (Worker.State.ACTIVE, "")
    assert token_works(raw)
