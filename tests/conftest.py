"""Shared fixtures: personas (alice owns, bob is another user, anonymous has no login) and
their clients."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from django.test import Client
from rest_framework.test import APIClient

from marketplace.models import User
from tests.factories import UserFactory

C = TypeVar("C", APIClient, Client)


@pytest.fixture
def alice(db: Any) -> Any:
    return funded(UserFactory(username="alice"))


@pytest.fixture
def bob(db: Any) -> Any:
    return funded(UserFactory(username="bob"))


@pytest.fixture
def carol(db: Any) -> Any:
    """A second provider: replicas of one task go to different providers."""
    return funded(UserFactory(username="carol"))


def funded(user: Any, credits: int = 1000) -> Any:
    """Give a persona credits through the ledger's real deposit service."""
    from ledger import services as ledger
    from ledger.units import UNITS_PER_CREDIT

    ledger.deposit(user, credits * UNITS_PER_CREDIT, reference=f"test-funds:{user.pk}")
    return user


@pytest.fixture
def anon_client() -> APIClient:
    return APIClient()


def api_client(user: User) -> APIClient:
    """A REST client authenticated as ``user`` (forced: no token, no session)."""
    client = APIClient()
    client.force_authenticate(user)
    return client


def web_client(user: User) -> Client:
    """A browser-session client logged in as ``user``, for the pages."""
    client = Client()
    client.force_login(user)
    return client


def signed_in(persona: str, sign_in: Callable[[User], C]) -> Callable[..., C]:
    """A fixture: the persona fixture named ``persona``, signed in by ``sign_in``. pytest
    names it after the module attribute it is assigned to."""

    @pytest.fixture
    def fixture(request: pytest.FixtureRequest) -> C:
        return sign_in(request.getfixturevalue(persona))

    return fixture


# Each persona's clients: REST (``*_client``) and browser session, for the pages (``*_web``).
alice_client = signed_in("alice", api_client)
bob_client = signed_in("bob", api_client)
alice_web = signed_in("alice", web_client)
bob_web = signed_in("bob", web_client)


@pytest.fixture(autouse=True)
def _media_root(settings: Any, tmp_path: Any) -> None:
    settings.MEDIA_ROOT = tmp_path / "media"


@pytest.fixture
def shared_media(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's media folder, named to the processes it starts (``PROOFWORK_MEDIA_ROOT``):
    they read and write the same files as the test."""
    monkeypatch.setenv("PROOFWORK_MEDIA_ROOT", str(settings.MEDIA_ROOT))
    return Path(settings.MEDIA_ROOT)


@pytest.fixture(autouse=True)
def _fresh_channel_layer() -> Iterator[None]:
    """Every test gets channel-layer instances of its own. Each ``async_to_sync`` conversation
    runs on a new event loop, and channels_redis keeps per-instance receive state (a receive
    count, a lock per channel) that a loop ending with a receive in flight leaves behind: the
    next loop's receive then fails ("bound to a different event loop", or "two event loops
    are trying to receive()") in a test that runs after such a conversation. The daphne
    server runs one loop, so the platform itself never shares an instance this way."""
    from channels.layers import channel_layers

    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    """Every test starts with an empty cache: the throttles' counters (registration: 30 a
    minute per client address) live there, and one test's requests must not throttle the
    next one's, whatever order they run in."""
    from django.core.cache import cache

    cache.clear()


@pytest.fixture
def alice_token(alice: Any) -> str:
    """A raw API token of alice's, created through the real service."""
    from marketplace import services

    _, raw = services.create_api_token(alice, "fixture")
    return raw


@pytest.fixture
def alice_token_client(alice_token: str) -> APIClient:
    """A client that authenticates with alice's API token header, not a session."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {alice_token}")
    return client
