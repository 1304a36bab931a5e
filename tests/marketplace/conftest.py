"""Browser-session clients of the personas, for the page tests."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client


@pytest.fixture
def alice_web(alice: Any) -> Client:
    client = Client()
    client.force_login(alice)
    return client


@pytest.fixture
def bob_web(bob: Any) -> Client:
    client = Client()
    client.force_login(bob)
    return client
