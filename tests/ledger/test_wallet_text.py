"""The wallet of a user with no credits says how to get some, and only what this server
offers: "buy some below" where payments are configured, another way where they are not."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def wallet_of_a_new_user() -> str:
    client = Client()
    newcomer: Any = UserFactory(username="newcomer")
    client.force_login(newcomer)
    response = client.get("/wallet/")
    assert response.status_code == 200
    return response.content.decode()


def no_credits(page: str) -> str:
    match = re.search(r'<p class="callout callout-info" id="no-credits">(.*?)</p>', page, re.S)
    assert match, page
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", match.group(1)))


def test_without_payments_the_wallet_does_not_send_a_newcomer_to_buy(settings: Any) -> None:
    settings.PAYMENTS_ENABLED = False
    settings.STRIPE_SECRET_KEY = settings.STRIPE_PUBLISHABLE_KEY = ""
    page = wallet_of_a_new_user()
    said = no_credits(page)
    assert "buy" not in said.lower()
    assert said == (
        "No credits yet. Credits cannot be bought on this server, but you can earn them: "
        "register a worker and sweep its earnings here."
    )
    assert 'href="/workers/register"' in page
    assert "Payments are not configured on this server." in page  # the box below agrees


def test_with_payments_the_wallet_points_at_the_buy_form(settings: Any) -> None:
    settings.PAYMENTS_ENABLED = True
    settings.STRIPE_SECRET_KEY = "sk_test_wallet"
    settings.STRIPE_PUBLISHABLE_KEY = "pk_test_wallet"
    settings.STRIPE_CHECKOUT = False
    settings.STRIPE_CONNECT = False
    page = wallet_of_a_new_user()
    assert no_credits(page) == "No credits yet: buy some below."
    assert 'id="buy-form"' in page
