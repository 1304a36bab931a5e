"""The pages that show a secret once create it once per rendering of their form.

A reload of the response that showed the API token or the registration token re-sends its
POST, as do a double-click and a resubmitted old form: each creates nothing and goes back
to the page (303) with a message. Both pages, through the Django test client.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from marketplace import formnonce, services
from marketplace.models import ApiToken
from tests.form_nonces import form_nonce, nonce_in
from workers.identity.services import MAX_OPEN_REGISTRATION_TOKENS
from workers.models import RegistrationToken

pytestmark = pytest.mark.django_db


@dataclass(frozen=True)
class OnceForm:
    """One of the two pages: where its form is, where it posts, what it creates."""

    page: str
    action: str
    data: dict[str, str]
    secret: re.Pattern[str]
    created: Callable[[], int]
    already_submitted: str


def token_form() -> OnceForm:
    return OnceForm(
        page=reverse("account"),
        action=reverse("token-create"),
        data={"name": "laptop CLI"},
        secret=re.compile(r'<code id="new-token">(pw_[^<]+)</code>'),
        created=ApiToken.objects.count,
        already_submitted="the token was shown once and is not shown again. Its name is listed below",
    )


def registration_form() -> OnceForm:
    return OnceForm(
        page=reverse("worker-register-page"),
        action=reverse("worker-register-page"),
        data={},
        secret=re.compile(r'<code id="registration-token">(pwr_[\w-]+)</code>'),
        created=RegistrationToken.objects.count,
        already_submitted="registration tokens expire after 60 minutes unused",
    )


@pytest.fixture(params=[token_form, registration_form], ids=["api-token", "registration-token"])
def form(request: pytest.FixtureRequest) -> OnceForm:
    factory: Callable[[], OnceForm] = request.param
    return factory()


def post(client: Client, form: OnceForm, nonce: str | None) -> Any:
    data = dict(form.data)
    if nonce is not None:
        data["form_nonce"] = nonce
    return client.post(form.action, data)


def test_the_first_post_shows_the_secret_and_a_replay_creates_nothing(alice_web: Client, form: OnceForm) -> None:
    nonce = form_nonce(alice_web, form.page)
    first = post(alice_web, form, nonce)
    assert first.status_code == 200
    raw = form.secret.search(first.content.decode())
    assert raw, "the secret is on the page"
    assert "no-store" in first["Cache-Control"]
    assert form.created() == 1

    # A reload re-sends the same POST: nothing is created, nothing secret is shown.
    replay = post(alice_web, form, nonce)
    assert replay.status_code == 303
    assert replay["Location"] == form.page
    assert form.created() == 1
    page = alice_web.get(replay["Location"])
    body = page.content.decode()
    assert "This form was already submitted" in body
    assert form.already_submitted in body
    assert raw.group(1) not in body
    assert not form.secret.search(body)
    # The page it lands on offers a fresh form that works.
    assert post(alice_web, form, nonce_in(page)).status_code == 200
    assert form.created() == 2


@pytest.mark.parametrize("nonce", [None, "", "made-up"])
def test_a_post_without_an_issued_nonce_creates_nothing(alice_web: Client, form: OnceForm, nonce: str | None) -> None:
    form_nonce(alice_web, form.page)  # one is outstanding, just not this one
    response = post(alice_web, form, nonce)
    assert response.status_code == 303
    assert response["Location"] == form.page
    assert form.created() == 0
    assert "This form had expired, so nothing was created" in alice_web.get(form.page).content.decode()


def test_another_sessions_nonce_creates_nothing(alice_web: Client, bob_web: Client, form: OnceForm) -> None:
    bobs = form_nonce(bob_web, form.page)
    assert post(alice_web, form, bobs).status_code == 303
    assert form.created() == 0
    assert post(bob_web, form, bobs).status_code == 200
    assert form.created() == 1


def test_two_renderings_of_the_form_each_work_once(alice_web: Client, form: OnceForm) -> None:
    # Two tabs opened on the page.
    first, second = form_nonce(alice_web, form.page), form_nonce(alice_web, form.page)
    assert first != second
    assert post(alice_web, form, second).status_code == 200
    assert post(alice_web, form, first).status_code == 200
    assert form.created() == 2
    assert post(alice_web, form, first).status_code == 303
    assert post(alice_web, form, second).status_code == 303
    assert form.created() == 2


def test_a_double_click_creates_one(alice_web: Client, form: OnceForm) -> None:
    """Two POSTs sent at once both load the session before either saves it: the second must
    still find the nonce spent. Replayed here by putting back the session as it was."""
    nonce = form_nonce(alice_web, form.page)
    before = alice_web.session.get(formnonce.SESSION_KEY, {})
    assert post(alice_web, form, nonce).status_code == 200
    session = alice_web.session
    session[formnonce.SESSION_KEY] = before
    session.save()
    assert post(alice_web, form, nonce).status_code == 303
    assert form.created() == 1


def test_a_nonce_of_another_session_of_the_same_user_creates_nothing(
    alice_web: Client, alice: Any, form: OnceForm
) -> None:
    """Spent in one session, it is remembered there and claimed in the cache; another
    session (signed in again, another browser) cannot replay it even once the cache
    forgot the claim (a restart of the embedded platform empties it)."""
    from django.core.cache import cache

    nonce = form_nonce(alice_web, form.page)
    assert post(alice_web, form, nonce).status_code == 200
    cache.clear()
    again = Client()
    again.force_login(alice)
    assert post(again, form, nonce).status_code == 303
    assert form.created() == 1


def test_two_tabs_loading_at_once_each_get_a_nonce_that_works(alice_web: Client, form: OnceForm) -> None:
    """Two renderings whose requests ran together: the second saved the session as it was
    before the first. Rendering writes nothing, so neither tab's nonce is lost."""
    before = dict(alice_web.session.items())
    first = form_nonce(alice_web, form.page)
    session = alice_web.session
    session.clear()
    session.update(before)
    session.save()
    second = form_nonce(alice_web, form.page)
    assert post(alice_web, form, first).status_code == 200
    assert post(alice_web, form, second).status_code == 200
    assert form.created() == 2


def test_a_nonce_names_its_form_and_expires(alice_web: Client, form: OnceForm, monkeypatch: Any) -> None:
    other = registration_form() if form.page == token_form().page else token_form()
    assert post(alice_web, form, form_nonce(alice_web, other.page)).status_code == 303  # another form's
    tampered = form_nonce(alice_web, form.page)
    assert post(alice_web, form, tampered[:-2] + ("AA" if tampered[-2:] != "AA" else "BB")).status_code == 303
    stale = form_nonce(alice_web, form.page)
    monkeypatch.setattr(formnonce, "MAX_AGE", timedelta(seconds=-1))  # a day later
    assert post(alice_web, form, stale).status_code == 303
    assert form.created() == 0
    assert "This form had expired, so nothing was created" in alice_web.get(form.page).content.decode()


# --- Error re-renders ---------------------------------------------------------------------


def test_an_invalid_token_name_rerenders_with_a_fresh_nonce(alice_web: Client, alice: Any) -> None:
    form = token_form()
    nonce = form_nonce(alice_web, form.page)
    invalid = alice_web.post(form.action, {"name": "   ", "form_nonce": nonce})
    assert invalid.status_code == 400
    assert "This field is required." in invalid.content.decode()
    fresh = nonce_in(invalid)
    assert fresh != nonce
    assert post(alice_web, form, fresh).status_code == 200
    assert ApiToken.objects.filter(user=alice).count() == 1


def test_a_refused_token_leaves_the_form_to_try_again(alice_web: Client, alice: Any, monkeypatch: Any) -> None:
    """The service refused and created nothing: a reload retries instead of claiming that
    a token was shown."""
    monkeypatch.setattr(services, "MAX_TOKENS_PER_USER", 1)
    services.create_api_token(alice, "old")
    form = token_form()
    nonce = form_nonce(alice_web, form.page)
    refused = post(alice_web, form, nonce)
    assert refused.status_code == 400
    assert "At most 1 active tokens; revoke one first." in refused.content.decode()
    assert post(alice_web, form, nonce).status_code == 400  # the reload: refused again
    services.revoke_api_token(alice, ApiToken.objects.get(name="old").pk)
    assert post(alice_web, form, nonce).status_code == 200
    assert ApiToken.objects.active().filter(user=alice).count() == 1


def test_a_refused_registration_token_leaves_the_form_to_try_again(alice_web: Client, alice: Any) -> None:
    from workers.identity import services as worker_services

    for _ in range(MAX_OPEN_REGISTRATION_TOKENS):
        worker_services.create_registration_token(alice)
    form = registration_form()
    nonce = form_nonce(alice_web, form.page)
    for _ in range(2):  # the POST and its reload
        refused = post(alice_web, form, nonce)
        assert refused.status_code == 200
        body = refused.content.decode()
        assert "unused registration tokens" in body
        assert not form.secret.search(body)
        assert nonce_in(refused) != nonce
    assert form.created() == MAX_OPEN_REGISTRATION_TOKENS
