"""The whole loop with nothing faked on our side: daphne serves the app, localstripe
delivers its own signed webhooks to it, and a real Chromium buys credits on the wallet
page. Rows must be committed for daphne to see them, hence transaction=True."""

from __future__ import annotations

import re
from typing import Any

import pytest

from ledger import services as ledger
from ledger.units import UNITS_PER_CREDIT
from payments import services
from payments.models import Payment, WebhookEvent
from tests.e2e.browsing import expect
from tests.factories import PASSWORD, UserFactory
from tests.payments.helpers import DECLINED, chain_agrees, confirm_card, deposits_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def wait_for_status(payment: Payment, status: str, timeout: float = 20.0) -> Payment:
    from tests.payments.conftest import wait_for

    wait_for(lambda: Payment.objects.get(pk=payment.pk).status == status, timeout)
    return Payment.objects.get(pk=payment.pk)


def test_localstripe_webhook_credits_a_card_payment_once(stripe_live_url: str, ls: Any) -> None:
    user = UserFactory(username="erin")
    purchase = services.start_purchase(user, 15)
    assert confirm_card(ls, purchase.client_secret).status_code == 200
    payment = wait_for_status(purchase.payment, "succeeded")
    assert payment.status == "succeeded", "localstripe's payment_intent.succeeded never credited the payment"
    assert ledger.balance(user) == 15 * UNITS_PER_CREDIT
    assert deposits_for(payment) == 1
    assert WebhookEvent.objects.filter(type="payment_intent.succeeded").count() == 1
    chain_agrees()


def test_localstripe_declined_card_credits_nothing(stripe_live_url: str, ls: Any) -> None:
    user = UserFactory(username="frank")
    purchase = services.start_purchase(user, 15)
    assert confirm_card(ls, purchase.client_secret, DECLINED).status_code == 402
    payment = wait_for_status(purchase.payment, "failed")
    assert payment.status == "failed"
    assert ledger.balance(user) == 0


def test_buying_credits_on_the_wallet_page(stripe_live_url: str, browser: Any) -> None:
    UserFactory(username="gina")
    context = browser.new_context(base_url=stripe_live_url)
    context.set_default_timeout(20_000)
    page = context.new_page()
    page.goto("/accounts/login/")
    page.get_by_label("Username").fill("gina")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect()(page).to_have_url(re.compile(r"/tasks/$"))

    page.goto("/wallet/")
    expect()(page.get_by_role("heading", name="Buy credits")).to_be_visible()
    page.get_by_label("Credits", exact=True).fill("8")
    page.get_by_label("Card number").fill("4242 4242 4242 4242")
    page.get_by_label("MM / YY").fill("12 / 31")
    page.get_by_label("CVC").fill("123")
    page.get_by_role("button", name="Pay by card").click()
    # The page waits for the webhook, then reloads with the credits.
    expect()(page.locator("#wallet-balance")).to_have_text("8 credits")
    expect()(page.locator("#payments-table")).to_contain_text("Credited")
    user_payment = Payment.objects.get(user__username="gina")
    assert user_payment.status == "succeeded"

    # A declined card says so and credits nothing.
    page.get_by_label("Credits", exact=True).fill("5")
    page.get_by_label("Card number").fill(DECLINED)
    page.get_by_label("MM / YY").fill("12 / 31")
    page.get_by_label("CVC").fill("123")
    page.get_by_role("button", name="Pay by card").click()
    expect()(page.locator("#buy-status")).to_contain_text("declined")
    # Out-of-bounds input is refused by the API with the field named.
    page.get_by_label("Credits", exact=True).fill("3")
    page.locator("#buy-form").evaluate("f => f.noValidate = true")
    page.get_by_role("button", name="Pay by card").click()
    expect()(page.locator("#buy-status")).to_contain_text("credits: Buy between 5 and 10000")
    context.close()
    chain_agrees()


def test_wallet_without_stripe_keys(plain_live_url: str, browser: Any) -> None:
    UserFactory(username="hank")
    context = browser.new_context(base_url=plain_live_url)
    page = context.new_page()
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto("/accounts/login/")
    page.get_by_label("Username").fill("hank")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.goto("/wallet/")
    expect()(page.locator("#payments-status")).to_contain_text("Payments are not configured")
    assert page.locator("#buy-form").count() == 0
    assert all(url.startswith(plain_live_url) for url in requests), requests
    context.close()
