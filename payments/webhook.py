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

A verified event is still checked before any handler runs: its id must fit the column
that records it, and each field of its object that the handler reads must be of the type
Stripe documents, with no text PostgreSQL cannot store (NUL, lone surrogates). Only
Stripe holds the secret, but an event it signs and this endpoint cannot apply must not be
a 500 that Stripe redelivers for days: it is answered 200 and recorded as ``ignored:
malformed <field>`` (unrecorded when its id cannot be stored), and moves nothing.
Handlers are given only the fields they read, checked, so a parked event keeps those and
nothing it was not checked for.

Subscribe the endpoint to: payment_intent.succeeded, payment_intent.payment_failed,
payment_intent.canceled, checkout.session.completed,
checkout.session.async_payment_succeeded, charge.refunded, charge.dispute.created,
charge.dispute.closed, account.updated (Connect) and transfer.reversed (Connect).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from django.db import IntegrityError, connection, transaction
from django.db.models import Q
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from config.api.parsers import text_error
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
# The width of the id columns (the event's; the Payment's and the parked intent's are as
# wide): Stripe's ids are far shorter, and a longer one cannot be stored.
MAX_ID_LENGTH: int = WebhookEvent._meta.get_field("event_id").max_length  # type: ignore[assignment]
# A BigIntegerField's largest: the amounts are stored (refunded, disputed).
MAX_AMOUNT = 2**63 - 1


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


# What a handler reads of data.object, as what: "id" a Stripe id (or an expanded object
# with one), "str" text, "int" a non-negative amount, "int?" one or null, "bool",
# "metadata" an object of texts, "error" an object whose message is text. Every field may
# be absent, and null but for "int".
Kind = Literal["id", "str", "int", "int?", "bool", "metadata", "error"]


@dataclass(frozen=True)
class Handler:
    """How one event type is applied: ``apply`` is given the ``reads`` of its object,
    checked (``_checked_object``), and returns the outcome."""

    apply: Callable[[dict[str, Any]], str]
    reads: Mapping[str, Kind]


_CHECKOUT: dict[str, Kind] = {
    "id": "id",
    "metadata": "metadata",
    "payment_intent": "id",
    "payment_status": "str",
    "amount_total": "int",
    "currency": "str",
}
_INTENT_FAILED: dict[str, Kind] = {"id": "id", "last_payment_error": "error"}
_DISPUTE: dict[str, Kind] = {
    "id": "id",
    "charge": "id",
    "payment_intent": "id",
    "currency": "str",
    "amount": "int",
    "status": "str",
}

HANDLERS: dict[str, Handler] = {
    "payment_intent.succeeded": Handler(
        _payment_intent_succeeded,
        {
            "id": "id",
            "metadata": "metadata",
            "status": "str",
            "amount_received": "int?",
            "amount": "int",
            "currency": "str",
            "latest_charge": "id",
        },
    ),
    "payment_intent.payment_failed": Handler(_payment_intent_failed, _INTENT_FAILED),
    "payment_intent.canceled": Handler(lambda obj: _payment_intent_failed(obj, canceled=True), _INTENT_FAILED),
    "checkout.session.completed": Handler(_checkout_completed, _CHECKOUT),
    "checkout.session.async_payment_succeeded": Handler(_checkout_completed, _CHECKOUT),
    "charge.refunded": Handler(
        _charge_refunded, {"id": "id", "payment_intent": "id", "currency": "str", "amount_refunded": "int"}
    ),
    "charge.dispute.created": Handler(lambda obj: _dispute(obj, services.open_dispute), _DISPUTE),
    # A won dispute is applied on charge.dispute.closed, not on funds_reinstated: closed
    # comes for every outcome (won, lost, an inquiry's warning_closed) with the final
    # status, while funds_reinstated only follows money moving back at Stripe (never for
    # an inquiry). funds_reinstated is not handled, so nothing can restore twice.
    "charge.dispute.closed": Handler(lambda obj: _dispute(obj, services.close_dispute), _DISPUTE),
    "account.updated": Handler(_account_updated, {"id": "id", "payouts_enabled": "bool", "details_submitted": "bool"}),
    "transfer.reversed": Handler(_transfer_reversed, {"id": "id", "amount_reversed": "int"}),
}


class Malformed(Exception):
    """A verified event this endpoint cannot apply; the message names the field."""


def _storable(text: str, field: str) -> str:
    if text_error(text) is not None:
        raise Malformed(field)
    return text


def _stripe_id(value: Any, field: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_ID_LENGTH:
        raise Malformed(field)
    return _storable(value, field)


def _checked_field(kind: Kind, value: Any, field: str) -> Any:
    """``value`` if it is of ``kind``, an expanded object reduced to its id; else
    Malformed naming ``field``."""
    if value is None and kind != "int":
        return None
    if kind == "id":
        return _stripe_id(value.get("id") if isinstance(value, dict) else value, field)
    if kind == "str":
        if not isinstance(value, str):
            raise Malformed(field)
        return _storable(value, field)
    if kind in ("int", "int?"):
        # bool is an int to Python, and a float or a huge number is no amount of Stripe's.
        if type(value) is not int or not 0 <= value <= MAX_AMOUNT:
            raise Malformed(field)
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise Malformed(field)
        return value
    if not isinstance(value, dict):
        raise Malformed(field)
    if kind == "metadata":
        for key, text in value.items():
            if not isinstance(text, str):
                raise Malformed(field)
            _storable(key, field)
            _storable(text, field)
        return dict(value)
    return {"message": _checked_field("str", value.get("message"), f"{field}.message")}  # "error"


def _checked_object(handler: Handler, obj: Any) -> dict[str, Any]:
    """The fields of data.object that ``handler`` reads, each checked against its kind
    (Malformed naming the first that is not). Only those are kept: what a parked event
    stores is what its replay reads, and nothing unchecked."""
    if not isinstance(obj, dict):
        raise Malformed("data.object")
    return {
        name: _checked_field(kind, obj[name], f"data.object.{name}")
        for name, kind in handler.reads.items()
        if name in obj
    }


def _replay_parked(intent_id: str) -> list[str]:
    """Apply the events parked for this PaymentIntent, which a payment has just learnt,
    through their own handlers in the order they were received, each once: its row is
    locked and unparked as it is applied. Returns their outcomes."""
    outcomes = []
    parked = WebhookEvent.objects.select_for_update().filter(parked_intent_id=intent_id).order_by("received_at", "id")
    for record in parked:
        handler = HANDLERS[record.type]
        try:
            # Checked as it is applied, whichever of its object's fields were parked.
            outcome = handler.apply(_checked_object(handler, record.parked_object or {}))
        except Malformed as exc:
            outcome = f"ignored: malformed {exc}"
        if outcome == PARKED:  # cannot happen while the payment knows the intent: keep it rather than lose it
            continue
        log.info("stripe event %s %s replayed: %s", record.event_id, record.type, outcome)
        record.outcome = f"{PARKED}; replayed: {outcome}"[:300]
        record.parked_intent_id, record.parked_object = "", None
        record.save(update_fields=["outcome", "parked_intent_id", "parked_object"])
        outcomes.append(f"replayed {record.event_id}: {outcome}")
    return outcomes


def _park(record: WebhookEvent, obj: dict[str, Any]) -> None:
    """Keep the event's object (the fields its handler reads, checked) for the completion
    that names its intent, and drop the parked events that have waited longer than
    ``PARK_FOR`` (their rows stay, so a late redelivery is still a duplicate). Cheap: the
    partial index holds only parked rows."""
    record.parked_intent_id = _id_of(obj.get("payment_intent"))
    record.parked_object = obj
    expired = WebhookEvent.objects.filter(~Q(parked_intent_id=""), received_at__lt=timezone.now() - PARK_FOR)
    dropped = expired.update(parked_intent_id="", parked_object=None, outcome=PARK_EXPIRED)
    if dropped:
        log.info("stripe webhook: %d parked events dropped after %s", dropped, PARK_FOR)


def handle_event(event: dict[str, Any]) -> str:
    """Apply one verified event exactly once. Returns the outcome recorded with it.

    Its shape is checked before its handler runs: an event whose id cannot be stored is
    answered ``ignored: malformed id`` and not recorded; one whose object is not what its
    handler reads is recorded as ``ignored: malformed <field>``, so that its redeliveries
    are duplicates, and changes nothing else."""
    event_type = event.get("type")
    if not isinstance(event_type, str) or event_type not in HANDLERS:
        return "ignored: not handled"
    handler = HANDLERS[event_type]
    raw_id = event.get("id")
    try:
        event_id = _stripe_id(raw_id or None, "id")  # an empty id is no event's
    except Malformed:
        log.warning("stripe event %.100r %s ignored: malformed id", raw_id, event_type)
        return "ignored: malformed id"
    data = event.get("data")
    malformed = ""
    try:
        obj = _checked_object(handler, data.get("object") if isinstance(data, dict) else None)
    except Malformed as exc:
        obj, malformed = {}, f"ignored: malformed {exc}"
    with transaction.atomic():
        try:
            with transaction.atomic():
                record = WebhookEvent.objects.create(event_id=event_id, type=event_type)
        except IntegrityError:
            return "duplicate"
        if malformed:
            log.warning("stripe event %s %s %s", event_id, event_type, malformed)
            outcome = malformed
        else:
            outcome = handler.apply(obj)
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
    # Signed, but its id and type may be anything (a malformed id is an outcome, not stored).
    log.info("stripe event %.100r %.100r: %s", event.get("id"), event.get("type"), outcome)
    return JsonResponse({"received": True, "outcome": outcome})
