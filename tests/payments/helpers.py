"""Shared steps of the payments tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from ledger.models import Transaction
from ledger.replay import verify_chain
from ledger.sealer import seal_all
from payments import services, stripe_client
from payments.models import Payment
from tests.payments.conftest import event

VISA = "4242424242424242"
DECLINED = "4000000000000341"  # Stripe's test card: attaches, then every charge is declined


def confirm_card(ls: httpx.Client, client_secret: str, number: str = VISA) -> httpx.Response:
    """What Stripe.js does in the browser: confirm the PaymentIntent with a card."""
    return ls.post(
        "/_config/proofwork/confirm",
        content=f'{{"client_secret": "{client_secret}", "card": {{"number": "{number}", "exp_month": 12, "exp_year": 2031, "cvc": "123"}}}}',
    )


def retrieve_intent(ls: httpx.Client, intent_id: str) -> dict[str, Any]:
    response = ls.get(f"/v1/payment_intents/{intent_id}")
    response.raise_for_status()
    return dict(response.json())


def paid_intent(ls: httpx.Client, user: Any, credits: int = 10) -> tuple[Payment, dict[str, Any]]:
    """Start a purchase through the service and pay it with the Visa test card at
    localstripe; returns the payment (not yet credited) and the PaymentIntent as Stripe
    reports it."""
    purchase = services.start_purchase(user, credits)
    assert confirm_card(ls, purchase.client_secret).status_code == 200
    intent = retrieve_intent(ls, str(purchase.payment.payment_intent_id))
    assert intent["status"] == "succeeded"
    return purchase.payment, intent


def credited(
    ls: httpx.Client, user: Any, deliver: Callable[..., Any], credits: int = 10
) -> tuple[Payment, dict[str, Any]]:
    """A payment paid at localstripe and credited by its payment_intent.succeeded; returns
    the payment and its charge as Stripe reports it."""
    payment, intent = paid_intent(ls, user, credits)
    assert deliver(event("payment_intent.succeeded", intent)).json()["outcome"] == "credited"
    payment.refresh_from_db()
    return payment, charge_of(ls, payment.charge_id)


def paid_checkout(ls: httpx.Client, user: Any, credits: int = 10) -> tuple[Payment, dict[str, Any], dict[str, Any]]:
    """Start a Checkout purchase through the service and pay it as Stripe's hosted page
    would: a PaymentIntent with the session's metadata, confirmed with the Visa test card
    at localstripe (whose sessions make none). Returns the payment (which knows only its
    session), its checkout.session.completed object, and the PaymentIntent."""
    purchase = services.start_purchase(
        user, credits, checkout=True, success_url="https://proofwork.test/ok", cancel_url="https://proofwork.test/no"
    )
    payment = purchase.payment
    metadata = {"payment_id": str(payment.pk), "user_id": str(user.pk), "units": str(payment.units)}
    pi = stripe_client.create_payment_intent(
        payment.amount, payment.currency, services.customer_of(user), metadata, idempotency_key=f"checkout:{payment.pk}"
    )
    assert confirm_card(ls, pi.client_secret).status_code == 200
    intent = retrieve_intent(ls, pi.id)
    assert intent["status"] == "succeeded"
    assert payment.payment_intent_id is None
    session = {
        "id": payment.checkout_session_id,
        "object": "checkout.session",
        "amount_total": payment.amount,
        "currency": payment.currency,
        "payment_status": "paid",
        "payment_intent": pi.id,
        "metadata": metadata,
    }
    return payment, session, intent


def charge_of(ls: httpx.Client, charge_id: str) -> dict[str, Any]:
    response = ls.get(f"/v1/charges/{charge_id}")
    response.raise_for_status()
    return dict(response.json())


def deposits_for(payment: Payment) -> int:
    return Transaction.objects.filter(type="DEPOSIT", reference=f"payment:{payment.pk}").count()


def chain_agrees() -> Any:
    """Seal what is pending and replay the chain from genesis."""
    seal_all()
    return verify_chain()


def charge_id_of(intent: dict[str, Any]) -> str:
    """The id of the intent's charge (localstripe expands it; Stripe sends the id)."""
    charge = intent["latest_charge"]
    return str(charge["id"] if isinstance(charge, dict) else charge)


def dispute(payment: Payment, charge_id: str, /, **changes: Any) -> dict[str, Any]:
    """A Dispute object as Stripe sends it in charge.dispute.* events, with ``changes``."""
    return {
        "id": "dp_test_1",
        "object": "dispute",
        "amount": 1000,
        "currency": "usd",
        "charge": charge_id,
        "payment_intent": payment.payment_intent_id,
        "reason": "fraudulent",
        "status": "needs_response",
        "is_charge_refundable": False,
        "livemode": False,
        "metadata": {},
        **changes,
    }
