"""Buying credits: the API and service against localstripe, and the webhook with
payloads signed with the test secret (duplicates, forgeries, stale and replayed
deliveries, mismatches, Checkout, refunds, disputes)."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import pytest
from django.core.management import call_command

from ledger import services as ledger
from ledger.models import Transaction
from ledger.units import UNITS_PER_CREDIT
from payments.models import Customer, Payment, WebhookEvent
from tests.payments.conftest import WEBHOOK_PATH, event, sign
from tests.payments.helpers import (
    DECLINED,
    chain_agrees,
    confirm_card,
    credited,
    deposits_for,
    dispute,
    paid_intent,
    retrieve_intent,
)

pytestmark = pytest.mark.django_db


# --- Starting a purchase -------------------------------------------------------------


def test_purchase_creates_a_payment_intent_with_metadata_and_credits_nothing(carol: Any, ls: Any, client: Any) -> None:
    client.force_login(carol)
    response = client.post("/api/v1/payments/", {"credits": 12}, content_type="application/json")
    assert response.status_code == 201, response.content
    body = response.json()
    payment = Payment.objects.get(user=carol)
    assert body["payment"]["id"] == str(payment.pk)
    assert body["payment"]["status"] == "created"
    assert body["client_secret"].startswith(f"{payment.payment_intent_id}_secret_")
    assert body["publishable_key"] == "pk_test_proofwork"
    assert (payment.units, payment.amount, payment.currency) == (12 * UNITS_PER_CREDIT, 1200, "usd")

    intent = retrieve_intent(ls, str(payment.payment_intent_id))
    assert (intent["amount"], intent["currency"]) == (1200, "usd")
    assert intent["metadata"] == {"payment_id": str(payment.pk), "user_id": str(carol.pk), "units": str(payment.units)}
    # The user's Stripe customer, created once and reused.
    customer = Customer.objects.get(user=carol)
    assert intent["customer"] == customer.customer_id
    assert ls.get(f"/v1/customers/{customer.customer_id}").json()["email"] == carol.email
    client.post("/api/v1/payments/", {"credits": 5}, content_type="application/json")
    assert Customer.objects.count() == 1
    assert ledger.balance(carol) == 0  # only the webhook credits


def test_a_purchase_with_an_unknown_field_starts_nothing(carol: Any, ls: Any, client: Any) -> None:
    client.force_login(carol)
    response = client.post("/api/v1/payments/", {"credits": 12, "coupon": "FREE"}, content_type="application/json")
    assert response.status_code == 400
    assert response.json() == {"coupon": ["Unknown field."]}
    assert not Payment.objects.filter(user=carol).exists()


@pytest.mark.parametrize(
    ("payload", "field", "message"),
    [
        ({"credits": 4}, "credits", "between 5 and 10000"),
        ({"credits": 10_001}, "credits", "between 5 and 10000"),
        ({"credits": "lots"}, "credits", "valid integer"),
        ({}, "credits", "required"),
        ({"credits": 10, "checkout": "maybe"}, "checkout", "valid boolean"),
    ],
)
def test_bad_purchase_input_is_a_400_naming_the_field(
    carol: Any, client: Any, payload: dict[str, Any], field: str, message: str
) -> None:
    client.force_login(carol)
    response = client.post("/api/v1/payments/", payload, content_type="application/json")
    assert response.status_code == 400
    assert message in " ".join(response.json()[field])
    assert not Payment.objects.exists()


def test_checkout_when_not_enabled_is_refused(carol: Any, client: Any, settings: Any) -> None:
    settings.STRIPE_CHECKOUT = False
    client.force_login(carol)
    response = client.post("/api/v1/payments/", {"credits": 10, "checkout": True}, content_type="application/json")
    assert response.status_code == 400
    assert "checkout" in response.json()


def test_declined_card_fails_the_payment_and_credits_nothing(carol: Any, ls: Any, deliver: Any) -> None:
    from payments import services

    purchase = services.start_purchase(carol, 10)
    declined = confirm_card(ls, purchase.client_secret, DECLINED)
    assert declined.status_code == 402
    assert declined.json()["error"]["code"] == "card_declined"
    intent = retrieve_intent(ls, str(purchase.payment.payment_intent_id))
    assert intent["status"] == "requires_payment_method"
    assert deliver(event("payment_intent.payment_failed", intent)).json()["outcome"] == "failed"
    payment = Payment.objects.get()
    assert payment.status == "failed"
    assert "declined" in payment.failure_message
    assert ledger.balance(carol) == 0


def test_anonymous_and_other_users_see_no_payments(carol: Any, alice_client: Any, anon_client: Any) -> None:
    from payments import services

    payment = services.start_purchase(carol, 10).payment
    assert anon_client.get("/api/v1/payments/").status_code in (401, 403)
    assert alice_client.get("/api/v1/payments/").json()["count"] == 0
    assert alice_client.get(f"/api/v1/payments/{payment.pk}/").status_code == 404


# --- The webhook ------------------------------------------------------------------


def test_payment_intent_succeeded_credits_once_however_often_delivered(carol: Any, ls: Any, deliver: Any) -> None:
    payment, intent = paid_intent(ls, carol, credits=10)
    evt = event("payment_intent.succeeded", intent)
    first = deliver(evt)
    assert first.status_code == 200
    assert first.json()["outcome"] == "credited"
    for _ in range(3):
        assert deliver(evt).json()["outcome"] == "duplicate"
    # Another event about the same payment (Stripe may send several) credits nothing more.
    assert deliver(event("payment_intent.succeeded", intent)).json()["outcome"] == "ignored: already succeeded"
    payment.refresh_from_db()
    assert payment.status == "succeeded"
    assert payment.charge_id.startswith("ch_")
    assert deposits_for(payment) == 1
    assert ledger.balance(carol) == 10 * UNITS_PER_CREDIT
    assert WebhookEvent.objects.filter(event_id=evt["id"]).count() == 1
    summary = chain_agrees()
    assert summary.deposits >= 10 * UNITS_PER_CREDIT


def test_a_replayed_request_within_the_tolerance_credits_once(carol: Any, ls: Any, client: Any) -> None:
    """An attacker who captured a real delivery can resend it byte for byte."""
    _, intent = paid_intent(ls, carol)
    body = json.dumps(event("payment_intent.succeeded", intent)).encode()
    header = sign(body)
    for outcome in ("credited", "duplicate", "duplicate"):
        response = client.post(WEBHOOK_PATH, data=body, content_type="application/json", HTTP_STRIPE_SIGNATURE=header)
        assert response.json()["outcome"] == outcome
    assert ledger.balance(carol) == 10 * UNITS_PER_CREDIT


@pytest.mark.parametrize(
    "case",
    [
        "missing",
        "forged",
        "wrong secret",
        "stale",
        "replayed with a new timestamp",
        "body altered",
        "not json",
        "signed list",
        "signed null",
        "signed nesting",
    ],
)
def test_bad_signatures_are_400_and_credit_nothing(
    carol: Any, ls: Any, client: Any, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    _, intent = paid_intent(ls, carol)
    body = json.dumps(event("payment_intent.succeeded", intent)).encode()
    now = int(time.time())
    header = {
        "missing": "",
        "forged": f"t={now},v1={'0' * 64}",
        "wrong secret": sign(body, secret="whsec_somebody_else"),
        "stale": sign(body, timestamp=now - 301),
        "replayed with a new timestamp": sign(body, timestamp=now - 400).replace(f"t={now - 400}", f"t={now}"),
        "body altered": sign(body),
        "not json": sign(b"not json"),
        # Correctly signed, but not an event: stripe parsed them after the check and crashed (a 500).
        "signed list": sign(b"[]"),
        "signed null": sign(b"null"),
        "signed nesting": sign(b"[" * 100_000),
    }[case]
    if case == "body altered":
        body = body.replace(b'"amount": 1000', b'"amount": 100000')
    if case == "not json":
        body = b"not json"
    if case.startswith("signed"):
        body = {"signed list": b"[]", "signed null": b"null", "signed nesting": b"[" * 100_000}[case]
    extra = {"HTTP_STRIPE_SIGNATURE": header} if header else {}
    with caplog.at_level(logging.WARNING, logger="payments.webhook"):
        response = client.post(WEBHOOK_PATH, data=body, content_type="application/json", **extra)
    assert response.status_code == 400, (case, response.content)
    assert "stripe webhook refused" in caplog.text
    assert ledger.balance(carol) == 0
    assert not WebhookEvent.objects.exists()


@pytest.mark.parametrize("field", ["amount", "currency", "user_id", "payment_id"])
def test_mismatched_events_are_ignored_with_a_log_line(
    carol: Any, bob: Any, ls: Any, deliver: Any, field: str, caplog: pytest.LogCaptureFixture
) -> None:
    payment, intent = paid_intent(ls, carol)
    if field == "amount":
        intent["amount"] = 99_999
    elif field == "currency":
        intent["currency"] = "eur"
    elif field == "user_id":
        intent["metadata"]["user_id"] = str(bob.pk)  # credit someone else with carol's payment
    else:
        intent["metadata"]["payment_id"] = "00000000-0000-0000-0000-000000000000"
    with caplog.at_level(logging.WARNING, logger="payments.services"):
        response = deliver(event("payment_intent.succeeded", intent))
    assert response.status_code == 200
    assert response.json()["outcome"].startswith("ignored:")
    assert "event ignored" in caplog.text
    payment.refresh_from_db()
    assert payment.status == "created"
    assert ledger.balance(carol) == 0
    assert ledger.balance(bob) == 1000 * UNITS_PER_CREDIT  # bob's persona funds, nothing more


def test_an_event_for_an_unknown_payment_is_ignored(deliver: Any) -> None:
    obj = {"id": "pi_unknown", "object": "payment_intent", "amount": 1000, "currency": "usd", "metadata": {}}
    assert deliver(event("payment_intent.succeeded", obj)).json()["outcome"] == "ignored: no such payment"
    assert not Transaction.objects.filter(type="DEPOSIT", reference__startswith="payment:").exists()


def test_oversized_bodies_are_refused(client: Any) -> None:
    body = b"{" + b" " * (300 * 1024) + b"}"
    response = client.post(WEBHOOK_PATH, data=body, content_type="application/json", HTTP_STRIPE_SIGNATURE=sign(body))
    assert response.status_code == 413


def test_webhook_is_not_there_without_keys(unconfigured: Any, deliver: Any) -> None:
    assert deliver(event("payment_intent.succeeded", {"id": "pi_x"})).status_code == 404


def test_checkout_session_completed_credits_the_payment(carol: Any, client: Any, deliver: Any) -> None:
    client.force_login(carol)
    response = client.post("/api/v1/payments/", {"credits": 20, "checkout": True}, content_type="application/json")
    assert response.status_code == 201
    body = response.json()
    payment = Payment.objects.get()
    assert body["checkout_url"].endswith(f"/checkout/{payment.checkout_session_id}")
    assert body["client_secret"] == ""
    session = {
        "id": payment.checkout_session_id,
        "object": "checkout.session",
        "amount_total": 2000,
        "currency": "usd",
        "payment_status": "paid",
        "payment_intent": "pi_from_checkout",
        "metadata": {"payment_id": str(payment.pk), "user_id": str(carol.pk), "units": str(payment.units)},
    }
    assert (
        deliver(event("checkout.session.completed", {**session, "payment_status": "unpaid"}))
        .json()["outcome"]
        .startswith("ignored: payment_status")
    )
    assert deliver(event("checkout.session.completed", session)).json()["outcome"] == "credited"
    # Stripe also says the session's PaymentIntent succeeded: still credited once.
    intent = {
        "id": "pi_from_checkout",
        "amount": 2000,
        "currency": "usd",
        "status": "succeeded",
        "metadata": session["metadata"],
    }
    assert deliver(event("payment_intent.succeeded", intent)).json()["outcome"] == "ignored: already succeeded"
    assert ledger.balance(carol) == 20 * UNITS_PER_CREDIT
    assert deposits_for(payment) == 1
    # A session of someone else's naming this payment is not this payment's.
    other = {**session, "id": "cs_test_other"}
    assert deliver(event("checkout.session.completed", other)).json()["outcome"] == "ignored: checkout session mismatch"
    chain_agrees()


def test_checkout_page_form_redirects_to_stripe(carol: Any, client: Any) -> None:
    client.force_login(carol)
    response = client.post("/payments/buy/", {"credits": "7", "checkout": "1"})
    assert response.status_code == 302
    payment = Payment.objects.get()
    assert response["Location"].endswith(f"/checkout/{payment.checkout_session_id}")


# --- Refunds and disputes --------------------------------------------------------------


def test_refunds_burn_the_refunded_credits_with_a_reversal(carol: Any, ls: Any, deliver: Any) -> None:
    payment, charge = credited(ls, carol, deliver, credits=10)
    # A partial refund at Stripe, then the full one; charge.refunded carries the running total.
    ls.post("/v1/refunds", data={"charge": charge["id"], "amount": 400}).raise_for_status()
    charge = ls.get(f"/v1/charges/{charge['id']}").json()
    assert charge["amount_refunded"] == 400
    evt = event("charge.refunded", charge)
    assert deliver(evt).json()["outcome"].startswith("reversed 4000000000")
    assert deliver(evt).json()["outcome"] == "duplicate"
    assert ledger.balance(carol) == 6 * UNITS_PER_CREDIT
    ls.post("/v1/refunds", data={"charge": charge["id"], "amount": 600}).raise_for_status()
    charge = ls.get(f"/v1/charges/{charge['id']}").json()
    assert deliver(event("charge.refunded", charge)).json()["outcome"].startswith("reversed 6000000000")
    assert ledger.balance(carol) == 0
    payment.refresh_from_db()
    assert (payment.status, payment.refunded_amount, payment.reversed_units) == (
        "refunded",
        1000,
        10 * UNITS_PER_CREDIT,
    )
    reversals = Transaction.objects.filter(type="REVERSAL", sender=ledger.ensure_user_account(carol).address)
    assert sorted(reversals.values_list("amount", flat=True)) == [4 * UNITS_PER_CREDIT, 6 * UNITS_PER_CREDIT]
    assert all(t.fee == 0 for t in reversals)
    summary = chain_agrees()
    assert summary.reversals >= 10 * UNITS_PER_CREDIT
    call_command("verify_chain")


def test_a_refund_of_spent_credits_burns_what_is_left_and_records_the_shortfall(
    carol: Any, bob: Any, ls: Any, deliver: Any
) -> None:
    payment, charge = credited(ls, carol, deliver, credits=10)
    ledger.transfer(carol, ledger.ensure_user_account(bob).address, 7 * UNITS_PER_CREDIT, reference="spend")
    left = ledger.balance(carol)
    ls.post("/v1/refunds", data={"charge": charge["id"]}).raise_for_status()
    charge = ls.get(f"/v1/charges/{charge['id']}").json()
    deliver(event("charge.refunded", charge))
    payment.refresh_from_db()
    assert ledger.balance(carol) == 0
    assert payment.reversed_units == left
    assert payment.shortfall_units == 10 * UNITS_PER_CREDIT - left
    chain_agrees()


def test_a_dispute_debits_the_disputed_credits(carol: Any, ls: Any, deliver: Any) -> None:
    payment, charge = credited(ls, carol, deliver, credits=10)
    opened = dispute(payment, charge["id"])
    assert deliver(event("charge.dispute.created", opened)).json()["outcome"].startswith("reversed")
    assert (
        deliver(event("charge.dispute.created", opened)).json()["outcome"] == "ignored: dispute already needs_response"
    )
    payment.refresh_from_db()
    assert payment.status == "disputed"
    assert ledger.balance(carol) == 0
    assert deliver(event("charge.dispute.created", dispute(payment, charge["id"], currency="eur"))).json()[
        "outcome"
    ] == ("ignored: currency mismatch")
    chain_agrees()


def test_wallet_lists_payments_and_their_states(carol: Any, ls: Any, deliver: Any, client: Any) -> None:
    credited(ls, carol, deliver, credits=10)
    from payments import services

    services.start_purchase(carol, 6)
    client.force_login(carol)
    page = client.get("/wallet/").content.decode()
    assert 'id="buy-form"' in page
    assert "/_config/proofwork/stripe.js" in page
    for text in ("Credited", "Awaiting payment", "10.00 USD", "6.00 USD"):
        assert text in page


def test_wallet_without_keys_says_payments_are_not_configured(carol: Any, unconfigured: Any, client: Any) -> None:
    unconfigured.DEBUG = True  # the embedded demo: the wallet points its operator at minting
    client.force_login(carol)
    page = client.get("/wallet/").content.decode()
    assert "Payments are not configured" in page
    assert "manage.py mint" not in page  # an operator's command, not a user's
    assert "stripe.js" not in page
    carol.is_staff = True
    carol.save(update_fields=["is_staff"])
    assert "manage.py mint" in client.get("/wallet/").content.decode()
    carol.is_staff = False
    carol.save(update_fields=["is_staff"])
    assert client.get("/api/v1/payments/config/").json()["enabled"] is False
    response = client.post("/api/v1/payments/", {"credits": 10}, content_type="application/json")
    assert response.status_code == 503


def test_the_openapi_schema_documents_the_payments_api(client: Any) -> None:
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    paths = schema["paths"]
    for path in (
        "/api/v1/payments/",
        "/api/v1/payments/{id}/",
        "/api/v1/payments/payouts/",
        "/api/v1/payments/account/",
    ):
        assert path in paths, path
    assert "PurchaseRequestRequest" in schema["components"]["schemas"]
    assert "credits" in schema["components"]["schemas"]["PurchaseRequestRequest"]["properties"]
    assert "REVERSAL" in schema["components"]["schemas"]["LedgerTxTypeEnum"]["enum"]
