"""Payments fixtures: a real localstripe on 127.0.0.1 for the session, the app's
settings pointed at it, signed webhook payloads, and daphne serving the app with (or
without) the Stripe keys for the tests that need Stripe's own webhooks or a browser.
Nothing here reaches the internet."""

from __future__ import annotations

import hashlib
import hmac
import json
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import browser  # noqa: F401  (a fixture)
from tests.workers import processes

SECRET_KEY = "sk_test_proofwork"
PUBLISHABLE_KEY = "pk_test_proofwork"
WEBHOOK_SECRET = "whsec_test_proofwork"
WEBHOOK_PATH = "/payments/stripe/webhook/"


@pytest.fixture(scope="session")
def localstripe(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of a localstripe process of our own (free port, 127.0.0.1 only)."""
    port = processes.free_port()
    log = tmp_path_factory.mktemp("localstripe") / "localstripe.log"
    url = f"http://127.0.0.1:{port}"
    with processes.spawn([sys.executable, "-m", "tests.payments.localstripe_server", str(port)], log) as proc:
        processes.wait_until_serving(proc, log, lambda: processes.answers(f"{url}/v1/customers", auth=(SECRET_KEY, "")))
        yield url


def stripe_env(localstripe: str) -> dict[str, str]:
    """The environment that points the app at localstripe."""
    return {
        "STRIPE_SECRET_KEY": SECRET_KEY,
        "STRIPE_PUBLISHABLE_KEY": PUBLISHABLE_KEY,
        "STRIPE_WEBHOOK_SECRET": WEBHOOK_SECRET,
        "STRIPE_API_BASE": localstripe,
        "STRIPE_JS_URL": f"{localstripe}/_config/proofwork/stripe.js",
        "STRIPE_CHECKOUT": "1",
        "STRIPE_CONNECT": "1",
    }


@pytest.fixture(autouse=True)
def stripe_settings(settings: Any, localstripe: str) -> Any:
    """This process's settings as stripe_env() would make them."""
    settings.STRIPE_SECRET_KEY = SECRET_KEY
    settings.STRIPE_PUBLISHABLE_KEY = PUBLISHABLE_KEY
    settings.STRIPE_WEBHOOK_SECRET = WEBHOOK_SECRET
    settings.STRIPE_API_BASE = localstripe
    settings.STRIPE_JS_URL = f"{localstripe}/_config/proofwork/stripe.js"
    settings.STRIPE_CHECKOUT = True
    settings.STRIPE_CONNECT = True
    settings.PAYMENTS_ENABLED = True
    settings.STRIPE_CURRENCY = "usd"
    settings.CREDIT_PRICE_MINOR = 100
    settings.PURCHASE_MIN_CREDITS = 5
    settings.PURCHASE_MAX_CREDITS = 10_000
    settings.PAYOUT_MIN_CREDITS = 50
    return settings


@pytest.fixture
def unconfigured(settings: Any) -> Any:
    settings.STRIPE_SECRET_KEY = settings.STRIPE_PUBLISHABLE_KEY = settings.STRIPE_WEBHOOK_SECRET = ""
    settings.PAYMENTS_ENABLED = False
    return settings


@pytest.fixture
def ls(localstripe: str) -> httpx.Client:
    """An HTTP client for localstripe (its API and its test helpers)."""
    return httpx.Client(base_url=localstripe, auth=(SECRET_KEY, ""), timeout=10)


def sign(body: bytes, secret: str = WEBHOOK_SECRET, timestamp: int | None = None) -> str:
    """A Stripe-Signature header, computed as Stripe does."""
    t = int(time.time()) if timestamp is None else timestamp
    mac = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


def event(event_type: str, obj: dict[str, Any], event_id: str | None = None) -> dict[str, Any]:
    return {
        "id": event_id or f"evt_{uuid.uuid4().hex[:24]}",
        "object": "event",
        "type": event_type,
        "created": int(time.time()),
        "livemode": False,
        "api_version": "2026-10-28.endive",
        "data": {"object": obj},
    }


@pytest.fixture
def deliver(client: Any) -> Callable[..., Any]:
    """POST an event to the webhook, signed with the test secret unless told otherwise."""

    def send(
        evt: dict[str, Any], *, secret: str = WEBHOOK_SECRET, timestamp: int | None = None, header: str | None = None
    ) -> Any:
        body = json.dumps(evt).encode()
        sig = header if header is not None else sign(body, secret, timestamp)
        extra = {"HTTP_STRIPE_SIGNATURE": sig} if sig else {}
        return client.post(WEBHOOK_PATH, data=body, content_type="application/json", **extra)

    return send


@pytest.fixture(scope="module")
def stripe_live_url(
    django_db_setup: Any, django_db_blocker: Any, localstripe: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The app on daphne with payments on, and localstripe delivering its webhooks to it."""
    workdir = tmp_path_factory.mktemp("daphne")
    with django_db_blocker.unblock(), processes.deployed_daphne(workdir, **stripe_env(localstripe)) as url:
        httpx.post(
            f"{localstripe}/_config/webhooks/proofwork",
            data={"url": url + WEBHOOK_PATH, "secret": WEBHOOK_SECRET},
            timeout=10,
        ).raise_for_status()
        yield url


@pytest.fixture(scope="module")
def plain_live_url(
    django_db_setup: Any, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The app on daphne with no Stripe keys at all."""
    with django_db_blocker.unblock(), processes.deployed_daphne(tmp_path_factory.mktemp("daphne-plain")) as url:
        yield url


def wait_for(check: Callable[[], bool], timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return check()


@pytest.fixture
def eager_celery() -> Iterator[None]:
    from config.celery import app

    app.conf.task_always_eager = True
    try:
        yield
    finally:
        app.conf.task_always_eager = False


@pytest.fixture
def carol(db: Any) -> Any:
    """A new user with no credits: every transaction of hers is one of her payment's."""
    from tests.factories import UserFactory

    return UserFactory(username="carol")
