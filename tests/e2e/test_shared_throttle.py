"""Throttles count across web processes: with Redis, every process of a deployment keeps
its counters in one cache (config/settings.py), so running more of them does not multiply
a client's allowance. Two real processes here: daphne (the live server) and this test's
own in-process client, sharing the Redis cache."""

from __future__ import annotations

import os

import httpx
import pytest
from django.conf import settings
from rest_framework.test import APIClient

from workers.api.worker_views import RegistrationThrottle

pytestmark = pytest.mark.django_db(transaction=True)

CHALLENGE = "/api/v1/workers/challenge/"
BODY = {"registration_token": "not-a-token", "public_key": "ab" * 32}


def test_a_clients_registration_calls_are_counted_across_web_processes(live_url: str) -> None:
    if not (settings.REDIS_URL or os.environ.get("PROOFWORK_CACHE_URL")):
        pytest.skip("the embedded platform runs one web process, whose throttles live in its memory; set REDIS_URL")
    allowed = int(str(RegistrationThrottle.rate).split("/")[0])
    # Both processes see the client as 127.0.0.1: daphne from the socket, the test client by default.
    first = httpx.post(live_url + CHALLENGE, json=BODY, timeout=10)
    assert first.status_code == 400, first.text  # a bad token, not throttled
    client = APIClient()
    for _ in range(allowed - 1):
        assert client.post(CHALLENGE, BODY, format="json").status_code == 400
    # The limit is spent in the other process: this one refuses too.
    refused = httpx.post(live_url + CHALLENGE, json=BODY, timeout=10)
    assert refused.status_code == 429, refused.text
    assert "throttled" in refused.json()["detail"].lower()
    assert int(refused.headers["Retry-After"]) > 0
    assert client.post(CHALLENGE, BODY, format="json").status_code == 429
