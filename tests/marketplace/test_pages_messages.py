"""What the pages say when something is off: every message names what to do, in credits
and in words a user reads, never a developer's (scientific notation, DEBUG=True).

Personas: alice is signed in; anonymous has no session.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from marketplace.models import Task
from tests.factories import PASSWORD
from tests.marketplace.test_pages import error_slot, synthetic_form, text

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("budget", "message"),
    [
        ("0", "Must be at least 0.000000001 credits."),
        ("9000000001", "Must be at most 9000000000 credits."),
    ],
)
def test_a_budget_out_of_bounds_names_the_bound_in_credits(alice_web: Client, budget: str, message: str) -> None:
    # The post's inline error and the live check's say it as the API does, not "1E-9".
    for name in ("task-post", "task-check"):
        response = alice_web.post(reverse(name, args=["synthetic"]), synthetic_form(budget=budget))
        slot = error_slot(text(response), "id_budget")
        assert message in slot, name
        assert "E-" not in slot
    assert not Task.objects.exists()


def test_a_stale_form_says_to_reload_it_not_debug_true(alice: Any, settings: Any) -> None:
    # Logging in from another tab rotates the CSRF token: this tab's form is now stale.
    settings.DEBUG = False
    stale = Client(enforce_csrf_checks=True)
    form = text(stale.get(reverse("login")))
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form).group(1)  # type: ignore[union-attr]
    other_tab = Client(enforce_csrf_checks=True)
    other_tab.cookies = stale.cookies
    other_tab.post(reverse("login"), {"username": "alice", "password": PASSWORD, "csrfmiddlewaretoken": token})

    response = stale.post(reverse("login"), {"username": "alice", "password": PASSWORD, "csrfmiddlewaretoken": token})
    assert response.status_code == 403
    body = text(response)
    assert "DEBUG" not in body
    assert "reload" in body.lower()
    assert f'href="{reverse("home")}"' in body
    assert "· Proofwork</title>" in body


@pytest.mark.parametrize(
    ("outcome", "message"),
    [("done", "credits arrive once Stripe confirms"), ("canceled", "nothing was charged")],
)
def test_back_from_stripe_checkout_the_wallet_says_how_it_went(alice_web: Client, outcome: str, message: str) -> None:
    # payments.views.buy sends Checkout back to /wallet/?checkout=done or =canceled.
    body = text(alice_web.get(reverse("wallet") + f"?checkout={outcome}"))
    assert message in body
    plain = text(alice_web.get(reverse("wallet")))
    assert "nothing was charged" not in plain
    assert "credits arrive once Stripe confirms" not in plain


@pytest.mark.parametrize(
    ("next_url", "lands_on"),
    [
        ("/tasks/new/synthetic/", "/tasks/new/synthetic/"),
        ("https://evil.example/", "/tasks/"),
        ("//evil.example/", "/tasks/"),
        # A bare word passed the host check and was tried as a URL name: a 500 after the
        # account was created.
        ("abc", "/tasks/"),
        ("tasks", "/tasks/"),
    ],
)
def test_signing_up_from_the_login_page_goes_where_the_user_was_going(
    client: Client, settings: Any, next_url: str, lands_on: str
) -> None:
    # "Post a task" while signed out: the login page, then "Create an account".
    login = text(client.get(reverse("task-post", args=["synthetic"]), follow=True))
    if next_url == "/tasks/new/synthetic/":
        link = re.search(r'href="([^"]*)">Create an account', login).group(1)  # type: ignore[union-attr]
        assert link == reverse("signup") + "?next=%2Ftasks%2Fnew%2Fsynthetic%2F"
    page = text(client.get(reverse("signup"), {"next": next_url}))
    assert re.search(r'<input type="hidden" name="next" value="([^"]*)"', page)
    response = client.post(
        reverse("signup"),
        {"username": "dora", "password1": PASSWORD, "password2": PASSWORD, "next": next_url},
    )
    assert response.status_code == 302
    assert response["Location"] == lands_on


def test_a_signed_in_user_opening_signup_with_a_bare_word_for_next_goes_to_their_tasks(alice_web: Client) -> None:
    response = alice_web.get(reverse("signup"), {"next": "abc"})
    assert response.status_code == 302
    assert response["Location"] == "/tasks/"


def test_a_signed_in_user_sent_to_the_login_page_goes_on_not_in_a_loop(alice_web: Client) -> None:
    # ?next=/accounts/login/ for a signed-in user: Django's LoginView raised on the loop (a 500).
    looping = alice_web.get("/accounts/login/?next=/accounts/login/")
    assert looping.status_code == 302
    assert looping["Location"] == "/workers/start/"
    onward = alice_web.get("/accounts/login/?next=/datasets/")
    assert onward.status_code == 302
    assert onward["Location"] == "/datasets/"


def test_every_page_names_an_icon_that_exists(client: Client) -> None:
    # Without one, every page load logged a 404 for /favicon.ico.
    from django.contrib.staticfiles import finders

    page = client.get("/accounts/login/").content.decode()
    match = re.search(r'<link rel="icon" href="/static/([^"]+)"', page)
    assert match is not None
    assert finders.find(match.group(1)) is not None


def test_a_fresh_inference_form_asks_for_its_fields_not_for_fixes(alice_web: Client) -> None:
    # Nothing is marked in red before anything was entered: a source task is still to choose.
    fresh = alice_web.get("/tasks/new/cube_inference/").content.decode()
    assert "Fill in the required fields to see the price." in fresh
    assert "marked in red" not in fresh
    checked = alice_web.post("/tasks/new/cube_inference/check/", {"title": "x"}).content.decode()
    assert "Fix the fields marked in red to see the price." in checked
