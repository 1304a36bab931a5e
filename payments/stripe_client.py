"""The one place that talks to Stripe. Everything else calls these functions, gets plain
values back, and sees ``ProviderError`` (never a stripe exception) when Stripe refuses.

Settings decide where calls go: ``STRIPE_API_BASE`` points the library at localstripe in
tests. Card data never passes through here (Stripe.js sends it to Stripe directly) and
nothing here logs a key.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import stripe
from django.conf import settings

WEBHOOK_TOLERANCE_S = 300


class ProviderError(Exception):
    """Stripe refused or could not be reached. ``code`` is Stripe's error code when it
    gave one (``card_declined``, ``resource_missing``, …)."""

    def __init__(self, message: str, code: str = "", transient: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.transient = transient  # a connection error or a 5xx: the same call may succeed later


class SignatureError(Exception):
    """A webhook's Stripe-Signature is missing, forged or too old."""


def configured() -> bool:
    return bool(settings.PAYMENTS_ENABLED)


@functools.cache
def _client(api_key: str, api_base: str | None) -> stripe.StripeClient:
    return stripe.StripeClient(
        api_key,
        base_addresses={"api": api_base} if api_base else None,
        max_network_retries=2,  # the library retries only what is safe (idempotency keys)
    )


def client() -> stripe.StripeClient:
    if not configured():
        raise ProviderError("Payments are not configured.", "not_configured")
    return _client(settings.STRIPE_SECRET_KEY, settings.STRIPE_API_BASE)


def _call(fn: Any, params: dict[str, Any], idempotency_key: str | None = None) -> Any:
    options: dict[str, Any] = {"idempotency_key": idempotency_key} if idempotency_key else {}
    try:
        return fn(params=params, options=options)
    except stripe.StripeError as exc:
        raise _provider_error(exc) from None


def _provider_error(exc: stripe.StripeError) -> ProviderError:
    code = getattr(exc, "code", None) or ""
    message = getattr(exc, "user_message", None) or str(exc) or exc.__class__.__name__
    transient = isinstance(exc, stripe.APIConnectionError | stripe.RateLimitError) or (exc.http_status or 0) >= 500
    return ProviderError(str(message)[:300], str(code), transient)


@dataclass(frozen=True)
class Intent:
    id: str
    client_secret: str
    status: str


def create_customer(email: str, user_id: int, idempotency_key: str) -> str:
    customer = _call(
        client().v1.customers.create, {"email": email or None, "metadata": {"user_id": str(user_id)}}, idempotency_key
    )
    return str(customer["id"])


def create_payment_intent(
    amount: int, currency: str, customer: str, metadata: dict[str, str], idempotency_key: str
) -> Intent:
    """A card PaymentIntent the browser confirms with Stripe.js."""
    pi = _call(
        client().v1.payment_intents.create,
        {
            "amount": amount,
            "currency": currency,
            "customer": customer,
            "metadata": metadata,
            "payment_method_types": ["card"],
        },
        idempotency_key,
    )
    return Intent(id=pi["id"], client_secret=pi["client_secret"], status=pi["status"])


@dataclass(frozen=True)
class CheckoutSession:
    id: str
    url: str


def create_checkout_session(
    amount: int,
    currency: str,
    description: str,
    metadata: dict[str, str],
    success_url: str,
    cancel_url: str,
    idempotency_key: str,
) -> CheckoutSession:
    """A hosted Checkout page for one line item; the webhook credits it."""
    session = _call(
        client().v1.checkout.sessions.create,
        {
            "mode": "payment",
            "line_items": [
                {
                    "quantity": 1,
                    "price_data": {"currency": currency, "unit_amount": amount, "product_data": {"name": description}},
                }
            ],
            "metadata": metadata,
            "payment_intent_data": {"metadata": metadata},
            "client_reference_id": metadata.get("payment_id", ""),
            "success_url": success_url,
            "cancel_url": cancel_url,
        },
        idempotency_key,
    )
    return CheckoutSession(id=session["id"], url=session["url"])


def construct_event(payload: bytes, signature_header: str | None) -> dict[str, Any]:
    """Verify the Stripe-Signature header (HMAC-SHA256 over ``timestamp.payload`` with
    the endpoint secret, at most five minutes old) and return the event as plain JSON."""
    try:
        event = stripe.Webhook.construct_event(
            payload, signature_header, settings.STRIPE_WEBHOOK_SECRET, tolerance=WEBHOOK_TOLERANCE_S
        )
    except stripe.SignatureVerificationError as exc:
        raise SignatureError(str(exc).split(".")[0]) from None
    except ValueError:
        raise SignatureError("The payload is not JSON") from None
    except (AttributeError, TypeError, RecursionError):
        # stripe parses the body after checking the signature and assumes an object:
        # a signed ``[]``, ``null`` or ``[[[…`` raises from inside it and is refused here.
        raise SignatureError("The payload is not a JSON object") from None
    result: dict[str, Any] = event.to_dict()
    return result


@dataclass(frozen=True)
class AccountState:
    id: str
    payouts_enabled: bool
    details_submitted: bool


def create_connected_account(email: str, user_id: int, idempotency_key: str) -> AccountState:
    account = _call(
        client().v1.accounts.create,
        {
            "type": "express",
            "email": email or None,
            "metadata": {"user_id": str(user_id)},
            "capabilities": {"transfers": {"requested": True}},
        },
        idempotency_key,
    )
    return _account_state(account)


def retrieve_account(account_id: str) -> AccountState:
    try:
        account = client().v1.accounts.retrieve(account_id)
    except stripe.StripeError as exc:
        raise _provider_error(exc) from None
    return _account_state(account)


def _account_state(obj: Any) -> AccountState:
    account = obj.to_dict()
    return AccountState(
        id=account["id"],
        payouts_enabled=bool(account.get("payouts_enabled")),
        details_submitted=bool(account.get("details_submitted")),
    )


def create_account_link(account_id: str, refresh_url: str, return_url: str) -> str:
    """A one-time URL of Stripe's onboarding for this account."""
    link = _call(
        client().v1.account_links.create,
        {"account": account_id, "refresh_url": refresh_url, "return_url": return_url, "type": "account_onboarding"},
    )
    return str(link["url"])


def create_transfer(
    amount: int, currency: str, destination: str, metadata: dict[str, str], idempotency_key: str
) -> str:
    """Move money from the platform's Stripe balance to a connected account; its id."""
    transfer = _call(
        client().v1.transfers.create,
        {"amount": amount, "currency": currency, "destination": destination, "metadata": metadata},
        idempotency_key,
    )
    return str(transfer["id"])
