"""Who may do what: alice owns, bob is another user, anonymous has no credentials."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from marketplace import services
from marketplace.models import ApiToken, Dataset, Task, TaskEvent
from tests.factories import PASSWORD, make_dataset, post_task

pytestmark = pytest.mark.django_db

PRIVATE = [
    ("get", "/api/v1/tasks/"),
    ("post", "/api/v1/tasks/"),
    ("get", "/api/v1/datasets/"),
    ("post", "/api/v1/datasets/"),
    ("get", "/api/v1/me/"),
    ("patch", "/api/v1/me/"),
    ("get", "/api/v1/me/tokens/"),
    ("post", "/api/v1/me/tokens/"),
]


@pytest.mark.parametrize(("method", "url"), PRIVATE)
def test_anonymous_gets_401_with_a_challenge(anon_client: APIClient, method: str, url: str) -> None:
    response = getattr(anon_client, method)(url, {}, format="json")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Token"
    assert "credentials were not provided" in response.json()["detail"]


def test_anonymous_cannot_touch_a_task(alice: Any, anon_client: APIClient) -> None:
    task = post_task(alice)
    assert anon_client.get(f"/api/v1/tasks/{task.pk}/").status_code == 401
    assert anon_client.post(f"/api/v1/tasks/{task.pk}/cancel/").status_code == 401
    task.refresh_from_db()
    assert task.status == "open"


@pytest.mark.parametrize("header", ["Token", "Token a b", "Bearer nonsense", "token pw_forged", "Token \u00e9\u00e9"])
def test_garbage_authorization_headers_get_401(alice: Any, header: str) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)
    response = client.get("/api/v1/tasks/")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Token"
    assert response.json()["detail"]


def test_an_unknown_scheme_is_ignored_and_treated_as_anonymous(alice: Any) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Basic YWxpY2U6cGFzcw==")
    assert client.get("/api/v1/tasks/").status_code == 401
    assert client.get("/api/v1/kinds/").status_code == 200


def test_bob_cannot_see_or_cancel_alices_task(alice: Any, bob_client: APIClient) -> None:
    task = post_task(alice)
    events = TaskEvent.objects.filter(task=task).count()
    assert bob_client.get(f"/api/v1/tasks/{task.pk}/").status_code == 404
    response = bob_client.post(f"/api/v1/tasks/{task.pk}/cancel/")
    assert response.status_code == 404
    assert response.json() == {"detail": "No Task matches the given query."}
    assert bob_client.post(f"/api/v1/tasks/{task.pk}/publish/").status_code == 404
    assert bob_client.get("/api/v1/tasks/").json()["count"] == 0
    task.refresh_from_db()
    assert task.status == "open"
    assert TaskEvent.objects.filter(task=task).count() == events


def test_the_cancel_service_also_refuses_bob(alice: Any, bob: Any) -> None:
    from rest_framework.exceptions import NotFound

    task = post_task(alice)
    with pytest.raises(NotFound):
        services.cancel_task(bob, task.pk)
    task.refresh_from_db()
    assert task.status == "open"


def test_bob_cannot_see_or_delete_alices_dataset(alice: Any, bob_client: APIClient) -> None:
    dataset = make_dataset(alice)
    assert bob_client.get(f"/api/v1/datasets/{dataset.pk}/").status_code == 404
    assert bob_client.delete(f"/api/v1/datasets/{dataset.pk}/").status_code == 404
    assert bob_client.get("/api/v1/datasets/").json()["count"] == 0
    assert Dataset.objects.filter(pk=dataset.pk).exists()


def test_bob_cannot_list_or_revoke_alices_token(alice: Any, bob_client: APIClient) -> None:
    token, _ = services.create_api_token(alice, "laptop")
    assert bob_client.get("/api/v1/me/tokens/").json() == []
    assert bob_client.delete(f"/api/v1/me/tokens/{token.pk}/").status_code == 404
    token.refresh_from_db()
    assert token.revoked_at is None


def test_me_is_always_the_caller(alice: Any, bob_client: APIClient) -> None:
    response = bob_client.patch("/api/v1/me/", {"first_name": "Robert", "id": alice.pk}, format="json")
    assert response.status_code == 400
    assert response.json() == {"id": ["This field is read-only."]}
    response = bob_client.patch("/api/v1/me/", {"first_name": "Robert"}, format="json")
    assert response.status_code == 200
    assert response.json()["username"] == "bob"
    alice.refresh_from_db()
    assert alice.first_name == ""


def test_public_endpoints_work_anonymously(alice: Any, anon_client: APIClient) -> None:
    post_task(alice, title="public")
    tasks = anon_client.get("/api/v1/marketplace/tasks/")
    assert tasks.status_code == 200
    (item,) = tasks.json()["results"]
    assert item["title"] == "public"
    assert "spec" not in item
    assert "owner" not in item
    assert "status_reason" not in item
    kinds = anon_client.get("/api/v1/kinds/")
    assert kinds.status_code == 200
    assert anon_client.get("/api/v1/kinds/synthetic/").status_code == 200


def test_public_listing_is_read_only(anon_client: APIClient, alice_client: APIClient) -> None:
    assert anon_client.post("/api/v1/marketplace/tasks/", {}, format="json").status_code == 405
    assert alice_client.post("/api/v1/kinds/", {}, format="json").status_code == 405


# --- Session authentication and CSRF ------------------------------------------------


@pytest.fixture
def session_client(alice: Any) -> APIClient:
    client = APIClient(enforce_csrf_checks=True)
    assert client.login(username="alice", password=PASSWORD)
    return client


def test_session_reads_need_no_csrf(session_client: APIClient) -> None:
    response = session_client.get("/api/v1/me/")
    assert response.status_code == 200
    assert response.json()["username"] == "alice"


def test_session_writes_without_a_csrf_token_are_403(session_client: APIClient) -> None:
    response = session_client.post("/api/v1/tasks/", {"kind": "synthetic", "budget": "1"}, format="json")
    assert response.status_code == 403
    assert "CSRF" in response.json()["detail"]
    assert Task.objects.count() == 0
    response = session_client.post("/api/v1/me/tokens/", {"name": "x"}, format="json")
    assert response.status_code == 403
    assert ApiToken.objects.count() == 0


def test_session_writes_with_the_csrf_token_succeed(session_client: APIClient) -> None:
    # What a browser does: echo the csrftoken cookie in the X-CSRFToken header.
    csrf_value = "k" * 32
    session_client.cookies["csrftoken"] = csrf_value
    response = session_client.post(
        "/api/v1/tasks/", {"kind": "synthetic", "budget": "1"}, format="json", HTTP_X_CSRFTOKEN=csrf_value
    )
    assert response.status_code == 201, response.content
    assert Task.objects.count() == 1


def test_token_authentication_needs_no_csrf(alice_token: str) -> None:
    client = APIClient(enforce_csrf_checks=True)
    client.credentials(HTTP_AUTHORIZATION=f"Token {alice_token}")
    response = client.post("/api/v1/tasks/", {"kind": "synthetic", "budget": "1"}, format="json")
    assert response.status_code == 201
    bearer = APIClient(enforce_csrf_checks=True)
    bearer.credentials(HTTP_AUTHORIZATION=f"Bearer {alice_token}")
    assert bearer.get("/api/v1/tasks/").json()["count"] == 1
