"""Shared fixtures: personas (alice owns, bob is another user, anonymous has no login)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from tests.factories import UserFactory


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


@pytest.fixture
def alice_client(alice: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(alice)
    return client


@pytest.fixture
def bob_client(bob: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(bob)
    return client


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
