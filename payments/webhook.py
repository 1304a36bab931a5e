"""The Stripe webhook: the only path that credits a payment.

Every event is verified first (Stripe-Signature, five minutes' tolerance); a bad one is
a 400 and changes nothing. A verified event is handled in one database transaction that
also records its id (unique), so Stripe's redeliveries — or a replay of a captured
request — find the id and change nothing. An event that does not match what was created
(amount, currency, user) is recorded as ignored, logged, and answered 200 so that Stripe
stops sending it.

Stripe neither orders its events nor stops retrying one for days, so each is applied on
its own terms: a refund or dispute before the payment's success is recorded and burnt
once the success credits it; a dispute's close may come before its creation. A Checkout
payment knows its PaymentIntent only from checkout.session.completed, so a refund or
dispute of an intent no payment knows is parked (its object kept on its WebhookEvent)
and replayed, in the order received, once a completion names that intent. Parked events
of intents that never become a payment's (a Stripe account shared with other apps) have
their objects dropped after ``PARK_FOR``, when a later event is parked (payments has no
periodic task).

Subscribe the endpoint to: payment_intent.succeeded, payment_intent.payment_failed,
payment_intent.canceled, checkout.session.completed,
checkout.session.async_payment_succeeded, charge.refunded, charge.dispute.created,
charge.dispute.closed, account.updated (Connect) and transfer.reversed (Connect).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.db.models import Q
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from payments import services, stripe_client
from payments.models import PayoutRequest, WebhookEvent

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 256 * 1024  # Stripe's events are a few kB; anything near this is not one
# Stripe retries a delivery for three days: a completion later than this will not come.
PARK_FOR = timedelta(days=30)
PARKED = "parked: no payment with this payment intent yet"
PARK_EXPIRED = "ignored: parked, and no payment with this payment intent came"
# The advisory-lock class of "a PaymentIntent's events" (PostgreSQL; any fixed int4).
INTENT_LOCK_CLASS = 0x5057_5049


def _id_of(value: Any) -> str:
    """A Stripe reference that may be an id or an expanded object."""
    if isinstance(value, dict):
        return str(value.get("id", ""))
    return str(value or "")


def _lock_intent(intent_id: str) -> None:
    """Serialise, until the transaction ends, the handling of events that name this
    PaymentIntent: a refund that parks and the completion that would replay it must not
    miss each other's uncommitted rows. Taken before any payment row lock. SQLite needs
    none: its transactions start IMMEDIATE and so serialise every writer."""
    if intent_id and connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [INTENT_LOCK_CLASS, intent_id])


def _payment_intent_succeeded(obj: dict[str, Any]) -> str:
    metadata = obj.get("metadata") or {}
    payment = services.find_payment(intent_id=_id_of(obj.get("id")), payment_id=str(metadata.get("payment_id", "")))
    if payment is None:
        return "ignored: no such payment"
    if obj.get("status", "succeeded") != "succeeded":
        return f"ignored: status {obj.get('status')}"
    received = obj.get("amount_received")
    amount = int(received if received is not None else obj.get("amount", -1))
    return services.credit_payment(
        payment,
        amount=amount,
        currency=str(obj.get("currency", "")),
        metadata=metadata,
        charge_id=_id_of(obj.get("latest_charge")),
    )


def _payment_intent_failed(obj: dict[str, Any], canceled: bool = False) -> str:
    payment = services.find_payment(intent_id=_id_of(obj.get("id")))
    if payment is None:
        return "ignored: no such payment"
    error = obj.get("last_payment_error") or {}
    message = "Canceled." if canceled else str(error.get("message") or "The payment failed.")
    return services.fail_payment(payment, message, canceled=canceled)


def _checkout_completed(obj: dict[str, Any]) -> str:
    metadata = obj.get("metadata") or {}
    _lock_intent(_id_of(obj.get("payment_intent")))
    payment = services.find_payment(session_id=_id_of(obj.get("id")), payment_id=str(metadata.get("payment_id", "")))
    if payment is None:
        return "ignored: no such payment"
    if payment.checkout_session_id != _id_of(obj.get("id")):
        log.warning("payment %s: checkout session %s is not its own", payment.pk, _id_of(obj.get("id")))
        return "ignored: checkout session mismatch"
    if obj.get("payment_status") != "paid":
        return f"ignored: payment_status {obj.get('payment_status')}"  # async methods: a later event says paid
    intent_id = _id_of(obj.get("payment_intent"))
    learnt = bool(intent_id) and not payment.payment_intent_id
    if learnt:
        payment.payment_intent_id = intent_id
        payment.save(update_fields=["payment_intent_id", "updated_at"])
    outcome = services.credit_payment(
        payment, amount=int(obj.get("amount_total", -1)), currency=str(obj.get("currency", "")), metadata=metadata
    )
    if learnt:
        outcome += "".join(f"; {replayed}" for replayed in _replay_parked(intent_id))
    return outcome


def _charge_refunded(obj: dict[str, Any]) -> str:
    intent_id = _id_of(obj.get("payment_intent"))
    _lock_intent(intent_id)
    payment = services.find_payment(charge_id=_id_of(obj.get("id")), intent_id=intent_id)
    if payment is None:
        return PARKED if intent_id else "ignored: no such payment"
    if str(obj.get("currency", "")).lower() != payment.currency:
        log.warning("payment %s: refund in %r ignored", payment.pk, obj.get("currency"))
        return "ignored: currency mismatch"
    return services.refund_payment(payment, int(obj.get("amount_refunded", 0)))


def _dispute(obj: dict[str, Any], apply: Callable[..., str]) -> str:
    intent_id = _id_of(obj.get("payment_intent"))
    _lock_intent(intent_id)
    payment = services.find_payment(charge_id=_id_of(obj.get("charge")), intent_id=intent_id)
    if payment is None:
        return PARKED if intent_id else "ignored: no such payment"
    if str(obj.get("currency", "")).lower() != payment.currency:
        log.warning("payment %s: dispute in %r ignored", payment.pk, obj.get("currency"))
        return "ignored: currency mismatch"
    return apply(
        payment, dispute_id=_id_of(obj.get("id")), amount=int(obj.get("amount", 0)), status=str(obj.get("status", ""))
    )


def _account_updated(obj: dict[str, Any]) -> str:
    account = services.update_account(
        _id_of(obj.get("id")), bool(obj.get("payouts_enabled")), bool(obj.get("details_submitted"))
    )
    return "updated" if account else "ignored: unknown account"


def _transfer_reversed(obj: dict[str, Any]) -> str:
    payout = PayoutRequest.objects.filter(transfer_id=_id_of(obj.get("id"))).first()
    if payout is None:
        return "ignored: unknown transfer"
    if int(obj.get("amount_reversed", 0)) < payout.amount:
        return "ignored: partial reversal"  # an admin settles partial reversals by hand
    return services.restore_payout(payout.pk, "The transfer was reversed.")


HANDLERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "payment_intent.succeeded": _payment_intent_succeeded,
    "payment_intent.payment_failed": _payment_intent_failed,
    "payment_intent.canceled": lambda obj: _payment_intent_failed(obj, canceled=True),
    "checkout.session.completed": _checkout_completed,
    "checkout.session.async_payment_succeeded": _checkout_completed,
    "charge.refunded": _charge_refunded,
    "charge.dispute.created": lambda obj: _dispute(obj, services.open_dispute),
    # A won dispute is applied on charge.dispute.closed, not on funds_reinstated: closed
    # comes for every outcome (won, lost, an inquiry's warning_closed) with the final
    # status, while funds_reinstated only follows money moving back at Stripe (never for
    # an inquiry). funds_reinstated is not handled, so nothing can restore twice.
    "charge.dispute.closed": lambda obj: _dispute(obj, services.close_dispute),
    "account.updated": _account_updated,
    "transfer.reversed": _transfer_reversed,
}


def _replay_parked(intent_id: str) -> list[str]:
    """Apply the events parked for this PaymentIntent, which a payment has just learnt,
    through their own handlers in the order they were received, each once: its row is
    locked and unparked as it is applied. Returns their outcomes."""
    outcomes = []
    parked = WebhookEvent.objects.select_for_update().filter(parked_intent_id=intent_id).order_by("received_at", "id")
    for record in parked:
        outcome = HANDLERS[record.type](record.parked_object or {})
        if outcome == PARKED:  # cannot happen while the payment knows the intent: keep it rather than lose it
            continue
        log.info("stripe event %s %s replayed: %s", record.event_id, record.type, outcome)
        record.outcome = f"{PARKED}; replayed: {outcome}"[:300]
        record.parked_intent_id, record.parked_object = "", None
        record.save(update_fields=["outcome", "parked_intent_id", "parked_object"])
        outcomes.append(f"replayed {record.event_id}: {outcome}")
    return outcomes


def _park(record: WebhookEvent, obj: dict[str, Any]) -> None:
    """Keep the event's object for the completion that names its intent, and drop the
    parked events that have waited longer than ``PARK_FOR`` (their rows stay, so a late
    redelivery is still a duplicate). Cheap: the partial index holds only parked rows."""
    record.parked_intent_id = _id_of(obj.get("payment_intent"))
    record.parked_object = obj
    expired = WebhookEvent.objects.filter(~Q(parked_intent_id=""), received_at__lt=timezone.now() - PARK_FOR)
    dropped = expired.update(parked_intent_id="", parked_object=None, outcome=PARK_EXPIRED)
    if dropped:
        log.info("stripe webhook: %d parked events dropped after %s", dropped, PARK_FOR)


def handle_event(event: dict[str, Any]) -> str:
    """Apply one verified event exactly once. Returns the outcome recorded with it."""
    event_id, event_type = str(event.get("id", "")), str(event.get("type", ""))
    handler = HANDLERS.get(event_type)
    if not event_id or handler is None:
        return "ignored: not handled"
    obj = (event.get("data") or {}).get("object") or {}
    with transaction.atomic():
        try:
            with transaction.atomic():
                record = WebhookEvent.objects.create(event_id=event_id, type=event_type)
        except IntegrityError:
            return "duplicate"
        outcome = handler(obj)
        record.outcome = outcome[:300]
        if outcome == PARKED:
            _park(record, obj)
        record.save(update_fields=["outcome", "parked_intent_id", "parked_object"])
    return outcome


@csrf_exempt
@require_POST
def stripe_webhook(request: HttpRequest) -> HttpResponse:
    """POST /payments/stripe/webhook/ — Stripe's calls, authenticated by signature only."""
    if not stripe_client.configured():
        return JsonResponse({"detail": "Payments are not configured."}, status=404)
    try:
        length = int(request.headers.get("Content-Length") or 0)
    except ValueError:
        length = 0
    if length > MAX_BODY_BYTES:
        return JsonResponse({"detail": "Body too large."}, status=413)
    body = request.body
    if len(body) > MAX_BODY_BYTES:
        return JsonResponse({"detail": "Body too large."}, status=413)
    try:
        event = stripe_client.construct_event(body, request.headers.get("Stripe-Signature"))
    except stripe_client.SignatureError as exc:
        log.warning("stripe webhook refused: %s", exc)
        return JsonResponse({"detail": f"Invalid signature: {exc}"}, status=400)
    outcome = handle_event(event)
    log.info("stripe event %s %s: %s", event.get("id"), event.get("type"), outcome)
    return JsonResponse({"received": True, "outcome": outcome})
