"""Login throttling (django-axes): an account, and apart from it an address, with too many
wrong passwords is refused, the right one too, on the site's login page and the admin's,
until the cool-off has passed; the refusal is a page that says when to try again."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import timedelta
from typing import Any

import pytest
from axes.models import AccessAttempt
from django.conf import settings
from django.db.models import F
from django.test import Client
from django.urls import reverse

from tests.factories import PASSWORD, UserFactory

pytestmark = pytest.mark.django_db

ATTACKER = "203.0.113.7"
ELSEWHERE = "198.51.100.20"


@pytest.fixture
def alice(db: Any) -> Any:
    return UserFactory(username="alice")


@pytest.fixture
def bob(db: Any) -> Any:
    return UserFactory(username="bob")


@pytest.fixture
def root(db: Any) -> Any:
    return UserFactory(username="root", is_staff=True, is_superuser=True)


def log_in(address: str, username: str, password: str, url: str | None = None) -> tuple[Client, Any]:
    """A fresh browser at ``address`` posting the login form at ``url`` (the site's by default)."""
    client = Client(REMOTE_ADDR=address)
    response = client.post(url or reverse("login"), {"username": username, "password": password})
    return client, response


def signed_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


def hammer(username: str, address: str = ATTACKER, times: int = 30, url: str | None = None) -> list[int]:
    return [log_in(address, username, f"guess-{n}", url)[1].status_code for n in range(times)]


def test_thirty_wrong_passwords_then_the_right_one_is_refused(alice: Any) -> None:
    limit = settings.AXES_FAILURE_LIMIT
    codes = hammer("alice")
    # The form answers the first failures; the limit's failure and every try after get the lock page.
    assert codes[: limit - 1] == [200] * (limit - 1)
    assert codes[limit - 1 :] == [429] * (30 - limit + 1)

    client, response = log_in(ATTACKER, "alice", PASSWORD)
    assert response.status_code == 429
    assert not signed_in(client)
    assert client.get(reverse("my-tasks")).status_code == 302  # still sent to the login page


def test_the_locked_page_says_when_to_try_again(alice: Any) -> None:
    hammer("alice", times=settings.AXES_FAILURE_LIMIT)
    _, response = log_in(ATTACKER, "alice", PASSWORD)
    assert response.status_code == 429
    assert response["Content-Type"].startswith("text/html")
    minutes = int(settings.AXES_COOLOFF_TIME.total_seconds() // 60)
    assert 0 < int(response["Retry-After"]) <= minutes * 60
    text = re.sub(r"\s+", " ", response.content.decode())
    assert "Too many failed logins" in text
    assert re.search(rf"Try again in {minutes} minutes, after .*\d\d:\d\d UTC", text), text
    assert reverse("password_reset") in text
    # The page of the site, not a bare message.
    assert "Skip to content" in text


def test_tries_while_locked_do_not_push_the_end_back(alice: Any) -> None:
    hammer("alice", times=settings.AXES_FAILURE_LIMIT)
    first = AccessAttempt.objects.get(username="alice")
    hammer("alice", times=5)
    log_in(ATTACKER, "alice", PASSWORD)
    again = AccessAttempt.objects.get(username="alice")
    assert (again.attempt_time, again.failures_since_start) == (first.attempt_time, first.failures_since_start)


def test_the_admin_login_is_throttled_too(root: Any) -> None:
    admin_login = reverse("admin:login")
    codes = hammer("root", url=admin_login)
    assert 429 in codes
    assert set(codes) == {200, 429}

    client, response = log_in(ATTACKER, "root", PASSWORD, url=admin_login)
    assert response.status_code == 429
    assert "Too many failed logins" in response.content.decode()
    assert not signed_in(client)
    assert client.get(reverse("admin:index")).status_code == 302


def test_failures_on_the_admin_count_for_the_site(alice: Any) -> None:
    """One count per account, whichever login page the guesses went to."""
    hammer("alice", times=settings.AXES_FAILURE_LIMIT, url=reverse("admin:login"))
    client, response = log_in(ELSEWHERE, "alice", PASSWORD)
    assert response.status_code == 429
    assert not signed_in(client)


def test_an_address_that_failed_too_often_is_refused_for_every_account(alice: Any, bob: Any) -> None:
    """The policy: the address is locked as well as the account. Guessing many accounts'
    passwords from one address hits the address's limit; the account's own limit holds
    against guesses spread over many addresses."""
    hammer("alice", times=settings.AXES_FAILURE_LIMIT)

    client, response = log_in(ATTACKER, "bob", PASSWORD)  # another account, same address
    assert response.status_code == 429
    assert not signed_in(client)

    client, response = log_in(ELSEWHERE, "alice", PASSWORD)  # the locked account, another address
    assert response.status_code == 429
    assert not signed_in(client)

    client, response = log_in(ELSEWHERE, "bob", PASSWORD)  # neither locked
    assert response.status_code == 302
    assert signed_in(client)


def test_guesses_spread_over_addresses_lock_the_account(alice: Any) -> None:
    for n in range(settings.AXES_FAILURE_LIMIT):
        log_in(f"192.0.2.{n + 1}", "alice", "wrong")
    client, response = log_in(ELSEWHERE, "alice", PASSWORD)
    assert response.status_code == 429
    assert not signed_in(client)


def test_guesses_at_many_accounts_from_one_address_lock_the_address(alice: Any) -> None:
    for n in range(settings.AXES_FAILURE_LIMIT):
        log_in(ATTACKER, f"nobody{n}", "wrong")
    client, response = log_in(ATTACKER, "alice", PASSWORD)
    assert response.status_code == 429
    assert not signed_in(client)
    client, response = log_in(ELSEWHERE, "alice", PASSWORD)
    assert response.status_code == 302


def test_a_few_wrong_passwords_do_not_lock(alice: Any) -> None:
    hammer("alice", times=settings.AXES_FAILURE_LIMIT - 1)
    client, response = log_in(ATTACKER, "alice", PASSWORD)
    assert response.status_code == 302
    assert signed_in(client)


def test_own_success_does_not_clear_the_failures_against_another_account(alice: Any, bob: Any) -> None:
    """An attacker signing into their own account between guesses keeps the count."""
    limit = settings.AXES_FAILURE_LIMIT
    hammer("alice", times=limit - 1)
    _, response = log_in(ATTACKER, "bob", PASSWORD)
    assert response.status_code == 302
    _, response = log_in(ATTACKER, "alice", "one more guess")
    assert response.status_code == 429


def age(minutes: float) -> None:
    """Move every counted failure ``minutes`` into the past, as if that long had passed."""
    AccessAttempt.objects.update(attempt_time=F("attempt_time") - timedelta(minutes=minutes))


def test_the_lock_ends_after_the_cool_off(alice: Any, settings: Any) -> None:
    settings.AXES_FAILURE_LIMIT = 3
    settings.AXES_COOLOFF_TIME = timedelta(minutes=5)
    assert hammer("alice", times=3) == [200, 200, 429]

    age(4)
    client, response = log_in(ATTACKER, "alice", PASSWORD)
    assert response.status_code == 429
    assert "Try again in 1 minute," in re.sub(r"\s+", " ", response.content.decode())

    age(1.5)
    client, response = log_in(ATTACKER, "alice", PASSWORD)
    assert response.status_code == 302
    assert signed_in(client)


SETTINGS_PROBE = """
import json
from django.conf import settings
print(json.dumps([settings.AXES_FAILURE_LIMIT, settings.AXES_COOLOFF_TIME.total_seconds()]))
"""


def read_settings(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """config.settings loaded in a fresh process with ``env`` (settings are read once)."""
    base = {key: os.environ[key] for key in ("PATH", "HOME", "PYTHONPATH") if key in os.environ}
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup();" + SETTINGS_PROBE],
        cwd=settings.BASE_DIR,
        env={**base, "DJANGO_SETTINGS_MODULE": "config.settings", "PROOFWORK_VAR_DIR": str(settings.VAR_DIR), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_limit_and_cool_off_come_from_the_environment() -> None:
    result = read_settings({})
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.splitlines()[-1]) == [10, 15 * 60]
    result = read_settings({"PROOFWORK_LOGIN_FAILURE_LIMIT": "5", "PROOFWORK_LOGIN_COOLOFF_MINUTES": "60"})
    assert json.loads(result.stdout.splitlines()[-1]) == [5, 3600]
    result = read_settings({"PROOFWORK_LOGIN_FAILURE_LIMIT": "0"})
    assert result.returncode != 0
    assert "PROOFWORK_LOGIN_FAILURE_LIMIT=0 is below the minimum 1" in result.stderr


def test_an_operator_sees_and_lifts_a_lock_in_the_admin(alice: Any, root: Any) -> None:
    hammer("alice", times=settings.AXES_FAILURE_LIMIT)
    operator = Client(REMOTE_ADDR=ELSEWHERE)
    operator.force_login(root)
    page = operator.get(reverse("admin:axes_accessattempt_changelist"))
    assert page.status_code == 200
    assert "alice" in page.content.decode()
    assert "guess-" not in page.content.decode()  # no password is kept, wrong ones neither

    attempt = AccessAttempt.objects.get(username="alice")
    operator.post(reverse("admin:axes_accessattempt_delete", args=[attempt.pk]), {"post": "yes"})
    client, response = log_in(ATTACKER, "alice", PASSWORD)
    assert response.status_code == 302
    assert signed_in(client)
