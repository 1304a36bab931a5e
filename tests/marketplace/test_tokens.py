"""API tokens (shown once, stored hashed, revocable, last use recorded) and /me."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from marketplace import services
from marketplace.models import ApiToken, hash_token

pytestmark = pytest.mark.django_db

TOKENS = "/api/v1/me/tokens/"


def test_create_shows_the_token_once_and_stores_only_its_hash(alice: Any, alice_client: APIClient) -> None:
    response = alice_client.post(TOKENS, {"name": " laptop "}, format="json")
    assert response.status_code == 201
    data = response.json()
    raw = data["token"]
    assert raw.startswith("pw_")
    assert len(raw) > 40
    assert data["name"] == "laptop"
    assert data["prefix"] == raw[:10]
    assert data["revoked_at"] is None
    token = ApiToken.objects.get(pk=data["id"])
    assert token.user == alice
    assert token.token_hash == hash_token(raw)
    # The raw token is nowhere in the row.
    assert all(raw not in str(getattr(token, f.attname)) for f in ApiToken._meta.concrete_fields)
    listing = alice_client.get(TOKENS)
    assert listing.status_code == 200
    assert listing.json() == [{k: v for k, v in data.items() if k != "token"}]
    assert raw not in listing.content.decode()


def test_the_new_token_authenticates_and_records_its_use(alice: Any, alice_client: APIClient) -> None:
    raw = alice_client.post(TOKENS, {"name": "ci"}, format="json").json()["token"]
    token = ApiToken.objects.get(token_hash=hash_token(raw))
    assert token.last_used_at is None
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {raw}")
    response = client.get("/api/v1/me/")
    assert response.status_code == 200
    assert response.json()["username"] == "alice"
    token.refresh_from_db()
    assert token.last_used_at is not None
    assert timezone.now() - token.last_used_at < timedelta(seconds=30)


def test_last_used_is_written_at_most_once_a_minute(alice: Any, django_assert_num_queries: Any) -> None:
    token, raw = services.create_api_token(alice, "busy")
    recent = timezone.now() - timedelta(seconds=5)
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=recent)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {raw}")
    # One query for the token (with its user), one for the list: no UPDATE.
    with django_assert_num_queries(1 + 1):
        assert client.get(TOKENS).status_code == 200
    token.refresh_from_db()
    assert token.last_used_at == recent


def test_revoke_then_the_token_gets_401(alice: Any, alice_client: APIClient) -> None:
    token, raw = services.create_api_token(alice, "old")
    response = alice_client.delete(f"{TOKENS}{token.pk}/")
    assert response.status_code == 200
    assert response.json()["revoked_at"] is not None
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {raw}")
    refused = client.get("/api/v1/tasks/")
    assert refused.status_code == 401
    assert refused.json() == {"detail": "Invalid or revoked token."}
    # Revoking twice is harmless and keeps the first time.
    first = ApiToken.objects.get(pk=token.pk).revoked_at
    again = alice_client.delete(f"{TOKENS}{token.pk}/")
    assert again.status_code == 200
    assert ApiToken.objects.get(pk=token.pk).revoked_at == first


def test_a_deactivated_users_token_gets_401(alice: Any, alice_token: str) -> None:
    alice.is_active = False
    alice.save(update_fields=["is_active"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {alice_token}")
    assert client.get("/api/v1/me/").status_code == 401


def test_list_shows_revoked_tokens_too(alice: Any, alice_client: APIClient) -> None:
    services.create_api_token(alice, "kept")
    gone, _ = services.create_api_token(alice, "gone")
    services.revoke_api_token(alice, gone.pk)
    listing = {t["name"]: t["revoked_at"] for t in alice_client.get(TOKENS).json()}
    assert listing["kept"] is None
    assert listing["gone"] is not None


@pytest.mark.parametrize(
    ("body", "words"),
    [({}, "required"), ({"name": "   "}, "blank"), ({"name": "x" * 65}, "64 characters"), ({"name": ["a"]}, "valid")],
)
def test_bad_token_names_are_refused(alice_client: APIClient, body: dict[str, Any], words: str) -> None:
    response = alice_client.post(TOKENS, body, format="json")
    assert response.status_code == 400
    assert words in str(response.json()["name"])
    assert ApiToken.objects.count() == 0


def test_at_most_fifty_active_tokens(alice: Any, alice_client: APIClient) -> None:
    for i in range(services.MAX_TOKENS_PER_USER):
        services.create_api_token(alice, f"t{i}")
    response = alice_client.post(TOKENS, {"name": "one more"}, format="json")
    assert response.status_code == 400
    assert "revoke one first" in response.json()["name"][0]
    assert ApiToken.objects.filter(user=alice).count() == services.MAX_TOKENS_PER_USER


# --- /me ----------------------------------------------------------------------------------


def test_me_get_and_patch(alice: Any, alice_client: APIClient) -> None:
    response = alice_client.get("/api/v1/me/")
    assert response.status_code == 200
    assert response.json()["username"] == "alice"
    assert response.json()["email"] == "alice@example.com"
    assert "password" not in response.json()
    renamed = alice_client.patch(
        "/api/v1/me/", {"first_name": "Alice", "email": "a@example.org", "username": "mallory"}, format="json"
    )
    assert renamed.status_code == 400
    assert renamed.json() == {"username": ["This field is read-only."]}
    patched = alice_client.patch("/api/v1/me/", {"first_name": "Alice", "email": "a@example.org"}, format="json")
    assert patched.status_code == 200
    assert patched.json()["first_name"] == "Alice"
    assert patched.json()["username"] == "alice"
    alice.refresh_from_db()
    assert (alice.first_name, alice.email, alice.username) == ("Alice", "a@example.org", "alice")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"email": "not an email"}, "email"),
        ({"first_name": "x" * 151}, "first_name"),
        ({"last_name": None}, "last_name"),
    ],
)
def test_me_patch_refuses_bad_values(alice: Any, alice_client: APIClient, body: dict[str, Any], field: str) -> None:
    response = alice_client.patch("/api/v1/me/", body, format="json")
    assert response.status_code == 400
    assert field in response.json()
    alice.refresh_from_db()
    assert alice.email == "alice@example.com"
    assert alice.first_name == ""


def test_me_patch_refuses_a_non_object(alice_client: APIClient) -> None:
    response = alice_client.patch("/api/v1/me/", [1, 2], format="json")
    assert response.status_code == 400
    assert "non_field_errors" in response.json()
