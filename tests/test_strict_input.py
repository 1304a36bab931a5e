"""Every API request body is held to its fields: a key the endpoint does not take, or an
attempt to change a read-only field, is a 400 naming it, and nothing is written.

DRF drops both silently: a misspelt field answered 200 and changed nothing."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from marketplace.models import ApiToken, Dataset, DatasetUpload
from protocol import keys
from protocol.wire import registration_message, sign_template
from tests.factories import npy_bytes, upload
from workers.models import Worker

pytestmark = pytest.mark.django_db

ME = "/api/v1/me/"


def test_a_misspelt_field_on_me_is_refused_and_nothing_changes(alice: Any, alice_client: APIClient) -> None:
    before = alice_client.get(ME).json()
    response = alice_client.patch(ME, {"email": "new@example.com", "emial": "typo@example.com"}, format="json")
    assert response.status_code == 400
    assert response.json() == {"emial": ["Unknown field."]}
    alice.refresh_from_db()
    assert alice.email == before["email"]  # the good field was not written either


def test_changing_a_read_only_field_on_me_is_refused(alice: Any, alice_client: APIClient) -> None:
    response = alice_client.patch(ME, {"username": "mallory", "first_name": "Al"}, format="json")
    assert response.status_code == 400
    assert response.json() == {"username": ["This field is read-only."]}
    alice.refresh_from_db()
    assert (alice.username, alice.first_name) == ("alice", "")


def test_sending_back_what_me_returned_is_taken(alice: Any, alice_client: APIClient) -> None:
    """A client may send back the whole object it read, read-only fields and all."""
    body = alice_client.get(ME).json()
    response = alice_client.patch(ME, {**body, "first_name": "Alice"}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["first_name"] == "Alice"
    # The same values written another way, or sent as form text, are the same values.
    joined = body["date_joined"].replace("Z", "+00:00")
    again = alice_client.patch(ME, {"id": str(body["id"]), "date_joined": joined, "last_name": "A"}, format="json")
    assert again.status_code == 200, again.json()
    form = alice_client.patch(ME, {"id": body["id"], "username": "alice", "last_name": "B"}, format="multipart")
    assert form.status_code == 200, form.json()
    assert form.json()["last_name"] == "B"
    stale = alice_client.patch(ME, {**body, "date_joined": "2001-01-01T00:00:00Z"}, format="json")
    assert stale.status_code == 400
    assert stale.json() == {"date_joined": ["This field is read-only."]}
    # JSON's true is not the number 1, whatever Python's bool is.
    flag = alice_client.patch(ME, {"id": True, "last_name": "C"}, format="json")
    assert (flag.status_code, flag.json()) == (400, {"id": ["This field is read-only."]})


def test_a_long_unknown_key_is_named_cut_short(alice_client: APIClient) -> None:
    response = alice_client.patch(ME, {"x" * 100_000: 1}, format="json")
    assert response.status_code == 400
    ((key, message),) = response.json().items()
    assert key == "x" * 63 + "…"
    assert message == ["Unknown field."]


@pytest.mark.parametrize(
    ("body", "errors"),
    [
        ({"force": True}, {"force": ["Unknown field: this endpoint takes no body."]}),
        ([1, 2], {"non_field_errors": ["This endpoint takes no body."]}),
    ],
)
def test_an_endpoint_that_takes_no_body_refuses_one(
    alice: Any, alice_client: APIClient, body: Any, errors: dict[str, list[str]]
) -> None:
    """``POST /tasks/<id>/cancel/ {"force": true}`` read as an option it is not: a 400, and
    the task is not cancelled. No body, ``{}`` and malformed JSON are as before."""
    from marketplace.models import TaskStatus
    from tests.factories import post_task

    task = post_task(alice, "synthetic", {"n": 64}, draft=True)
    for url in (
        f"/api/v1/tasks/{task.pk}/cancel/",
        f"/api/v1/tasks/{task.pk}/publish/",
        "/api/v1/workers/registration-tokens/",
    ):
        response = alice_client.post(url, body, format="json")
        assert (response.status_code, response.json()) == (400, errors), url
    malformed = alice_client.post(f"/api/v1/tasks/{task.pk}/cancel/", b"{", content_type="application/json")
    assert malformed.status_code == 400
    assert "JSON parse error" in malformed.json()["detail"]
    task.refresh_from_db()
    assert task.status == TaskStatus.DRAFT
    assert alice_client.post(f"/api/v1/tasks/{task.pk}/publish/", {}, format="json").status_code == 200
    assert alice_client.post(f"/api/v1/tasks/{task.pk}/cancel/").status_code == 200


def test_an_api_token_with_an_unknown_field_is_not_created(alice: Any, alice_client: APIClient) -> None:
    response = alice_client.post("/api/v1/me/tokens/", {"name": "ci", "scope": "read"}, format="json")
    assert response.status_code == 400
    assert response.json() == {"scope": ["Unknown field."]}
    assert not ApiToken.objects.filter(user=alice).exists()


def test_a_dataset_upload_with_an_unknown_field_is_not_stored(alice: Any, alice_client: APIClient) -> None:
    response = alice_client.post(
        "/api/v1/datasets/", {"file": upload(npy_bytes()), "name": "x", "licence": "mit"}, format="multipart"
    )
    assert response.status_code == 400
    assert response.json() == {"licence": ["Unknown field."]}
    assert not Dataset.objects.filter(owner=alice).exists()
    parts = alice_client.post(
        "/api/v1/dataset-uploads/", {"size_bytes": 10, "filename": "a.npy", "chunk": 5}, format="json"
    )
    assert parts.status_code == 400
    assert parts.json() == {"chunk": ["Unknown field."]}
    assert not DatasetUpload.objects.exists()


def test_a_browser_form_csrf_field_is_not_an_unknown_field(alice: Any) -> None:
    """A session-authenticated form post carries Django's CSRF field in its body."""
    web = Client(enforce_csrf_checks=True)
    web.force_login(alice)
    web.get("/account/")
    csrf = web.cookies["csrftoken"].value
    response = web.post(
        "/api/v1/datasets/",
        {"file": upload(npy_bytes()), "name": "mine", "csrfmiddlewaretoken": csrf},
        HTTP_ACCEPT="application/json",
    )
    assert response.status_code == 201, response.content
    assert Dataset.objects.get(owner=alice).name == "mine"


def test_registration_with_an_unknown_field_is_refused(alice_client: APIClient, anon_client: APIClient) -> None:
    raw = alice_client.post("/api/v1/workers/registration-tokens/").json()["token"]
    key = keys.generate()
    pub = key.public_key.hex()
    extra = anon_client.post(
        "/api/v1/workers/challenge/", {"registration_token": raw, "public_key": pub, "gpu": "H100"}, format="json"
    )
    assert extra.status_code == 400
    assert extra.json() == {"gpu": ["Unknown field."]}
    challenge = anon_client.post(
        "/api/v1/workers/challenge/", {"registration_token": raw, "public_key": pub}, format="json"
    ).json()
    body = {
        "registration_token": raw,
        "public_key": pub,
        "signature": key.sign(registration_message(challenge["challenge"], pub)).hex(),
        "register_tx_signature": sign_template(challenge["register_tx"], key).hex(),
        "capabilities": {"cpu_cores": 2, "kinds": ["synthetic"]},
    }
    refused = anon_client.post("/api/v1/workers/register/", {**body, "owner": "bob"}, format="json")
    assert refused.status_code == 400
    assert refused.json() == {"owner": ["Unknown field."]}
    assert not Worker.objects.exists()
    registered = anon_client.post("/api/v1/workers/register/", body, format="json")
    assert registered.status_code == 201, registered.json()
