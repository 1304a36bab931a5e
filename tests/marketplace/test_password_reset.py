"""Password reset by e-mail: the login page links to it, the e-mail names the site and
carries a one-time link, the new password signs in, and an unknown address gets the very
same page as a known one (no mail, nothing that tells them apart)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.conf import settings
from django.core import mail
from django.test import Client
from django.urls import reverse

from tests.factories import PASSWORD, UserFactory

pytestmark = pytest.mark.django_db

NEW_PASSWORD = "a-new-and-rather-long-passphrase"
LINK = re.compile(r"https?://[^/\s]+(/accounts/password/reset/[^/\s]+/[^/\s]+/)")


@pytest.fixture
def alice(db: Any) -> Any:
    return UserFactory(username="alice", email="alice@example.com")


def reset_link(message: Any) -> str:
    """The path of the link in a reset e-mail."""
    match = LINK.search(str(message.body))
    assert match, message.body
    return match.group(1)


def ask_for_reset(client: Client, email: str) -> Any:
    return client.post(reverse("password_reset"), {"email": email}, follow=True)


def test_the_login_page_links_to_the_reset(client: Client) -> None:
    page = client.get(reverse("login")).content.decode()
    assert "Forgot your password?" in page
    assert f'href="{reverse("password_reset")}"' in page
    assert client.get(reverse("password_reset")).status_code == 200


def test_reset_by_email_then_log_in_with_the_new_password(client: Client, alice: Any) -> None:
    response = ask_for_reset(client, "alice@example.com")
    assert response.status_code == 200
    assert response.redirect_chain == [(reverse("password_reset_done"), 302)]
    assert "Check your e-mail" in response.content.decode()

    assert len(mail.outbox) == 1
    message = mail.outbox[0]
    assert message.to == ["alice@example.com"]
    assert message.from_email == settings.DEFAULT_FROM_EMAIL
    assert "Proofwork" in message.subject
    assert "Proofwork" in message.body
    assert "testserver" in message.body  # the site's address, from the request
    assert "alice" in message.body
    link = reset_link(message)

    # The link redirects to the form at a URL without the token (Django's), then sets it.
    form_page = client.get(link, follow=True)
    assert form_page.status_code == 200
    assert "Set a new password" in form_page.content.decode()
    set_url = form_page.redirect_chain[-1][0]
    done = client.post(set_url, {"new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD}, follow=True)
    assert done.redirect_chain[-1][0] == reverse("password_reset_complete")
    assert "Password set" in done.content.decode()

    browser = Client()
    refused = browser.post(reverse("login"), {"username": "alice", "password": PASSWORD})
    assert refused.status_code == 200  # the old password no longer works
    signed = browser.post(reverse("login"), {"username": "alice", "password": NEW_PASSWORD})
    assert signed.status_code == 302
    assert "_auth_user_id" in browser.session

    # The link works once.
    again = client.get(link, follow=True)
    assert "This link no longer works" in again.content.decode()


def test_an_unknown_address_gets_the_same_page_and_no_mail(client: Client, alice: Any) -> None:
    known = ask_for_reset(client, "alice@example.com")
    unknown = ask_for_reset(Client(), "nobody@example.com")
    assert len(mail.outbox) == 1
    assert unknown.status_code == known.status_code == 200
    assert unknown.redirect_chain == known.redirect_chain

    def body(response: Any) -> str:
        return re.sub(r'name="csrfmiddlewaretoken" value="[^"]+"|"X-CSRFToken": "[^"]+"', "", response.content.decode())

    assert body(unknown) == body(known)


def test_a_tampered_link_sets_nothing(client: Client, alice: Any) -> None:
    ask_for_reset(client, "alice@example.com")
    link = reset_link(mail.outbox[0])
    forged = re.sub(r"/([^/]+)/$", "/1a2-0123456789abcdef0123456789abcdef/", link)
    page = client.get(forged, follow=True)
    assert "This link no longer works" in page.content.decode()
    assert "new_password1" not in page.content.decode()


def test_a_reset_lifts_the_lock_on_the_account(client: Client, alice: Any) -> None:
    """Someone else's guesses locked the account: its owner gets back in by resetting."""
    for n in range(settings.AXES_FAILURE_LIMIT):
        Client(REMOTE_ADDR="203.0.113.7").post(reverse("login"), {"username": "alice", "password": f"guess-{n}"})
    owner = Client(REMOTE_ADDR="198.51.100.20")
    assert owner.post(reverse("login"), {"username": "alice", "password": PASSWORD}).status_code == 429

    ask_for_reset(owner, "alice@example.com")
    link = reset_link(mail.outbox[0])
    set_url = owner.get(link, follow=True).redirect_chain[-1][0]
    owner.post(set_url, {"new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD})

    response = owner.post(reverse("login"), {"username": "alice", "password": NEW_PASSWORD})
    assert response.status_code == 302


def test_the_admin_login_offers_the_reset(client: Client) -> None:
    page = client.get(reverse("admin:login")).content.decode()
    assert reverse("admin_password_reset") in page
    assert client.get(reverse("admin_password_reset"))["Location"] == reverse("password_reset")
