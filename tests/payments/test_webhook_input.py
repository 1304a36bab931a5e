"""Signed events the webhook cannot apply: a field of the wrong type, an id no column can
hold, text PostgreSQL cannot store (NUL, a lone surrogate). Only Stripe holds the secret,
but each of these was a 500, which Stripe redelivers for days: now each is answered 200
with an ``ignored: malformed <field>`` outcome, recorded when its id can be, and moves
no money; the well-formed event still credits. Run on SQLite and on PostgreSQL (where
the NUL and surrogate cases were DataErrors)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

from ledger import services as ledger
from ledger.models import Transaction
from ledger.units import UNITS_PER_CREDIT
from payments.models import Payment, WebhookEvent
from payments.webhook import PARKED
from tests.payments.conftest import event
from tests.payments.helpers import charge_id_of, charge_of, credited, deposits_for, dispute, paid_checkout

pytestmark = pytest.mark.django_db

CREDIT = UNITS_PER_CREDIT
LONG_ID = "x" * 256  # one more than the id columns hold


def uncredited(payment: Payment, user: Any) -> None:
    """Nothing moved: the payment is as it was started, and the user has no credits."""
    payment.refresh_from_db()
    assert (payment.status, payment.payment_intent_id, payment.deposit_id) == ("created", None, None)
    assert deposits_for(payment) == 0
    assert ledger.balance(user) == 0


def ignored(response: Any, field: str) -> None:
    assert response.status_code == 200, response.content
    assert response.json()["outcome"] == f"ignored: malformed {field}"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda s: {**s, "metadata": "x"}, "metadata"),
        (lambda s: {**s, "metadata": {**s["metadata"], "payment_id": 5}}, "metadata"),
        (lambda s: {**s, "metadata": {**s["metadata"], "user_id": "1\x00"}}, "metadata"),
        (lambda s: {**s, "metadata": {**s["metadata"], "\ud800": "x"}}, "metadata"),
        (lambda s: {**s, "payment_intent": "pi_\x00"}, "payment_intent"),
        (lambda s: {**s, "payment_intent": {"id": "pi_\ud800", "object": "payment_intent"}}, "payment_intent"),
        (lambda s: {**s, "payment_intent": LONG_ID}, "payment_intent"),
        (lambda s: {**s, "id": s["id"] + "\x00"}, "id"),
        (lambda s: {**s, "id": ["cs"]}, "id"),
        (lambda s: {**s, "amount_total": str(s["amount_total"])}, "amount_total"),
        (lambda s: {**s, "amount_total": None}, "amount_total"),
        (lambda s: {**s, "amount_total": True}, "amount_total"),
        (lambda s: {**s, "amount_total": 2**64}, "amount_total"),
        (lambda s: {**s, "currency": "usd\ud800"}, "currency"),
    ],
    ids=[
        "metadata a string",
        "metadata value a number",
        "metadata value with NUL",
        "metadata key a lone surrogate",
        "intent id with NUL",
        "expanded intent with a surrogate",
        "intent id too long",
        "session id with NUL",
        "session id a list",
        "amount a string",
        "amount null",
        "amount a bool",
        "amount too big",
        "currency with a surrogate",
    ],
)
def test_a_completion_it_cannot_apply_is_recorded_as_ignored_and_credits_nothing(
    carol: Any,
    ls: Any,
    deliver: Any,
    caplog: pytest.LogCaptureFixture,
    change: Callable[[dict[str, Any]], dict[str, Any]],
    field: str,
) -> None:
    payment, session, _ = paid_checkout(ls, carol, credits=10)
    bad = event("checkout.session.completed", change(session))
    with caplog.at_level(logging.WARNING, logger="payments.webhook"):
        ignored(deliver(bad), f"data.object.{field}")
    assert f"ignored: malformed data.object.{field}" in caplog.text
    assert WebhookEvent.objects.get(event_id=bad["id"]).outcome == f"ignored: malformed data.object.{field}"
    uncredited(payment, carol)
    # Stripe's redeliveries of it are duplicates; the well-formed completion credits.
    assert deliver(bad).json()["outcome"] == "duplicate"
    assert deliver(event("checkout.session.completed", session)).json()["outcome"] == "credited"
    assert ledger.balance(carol) == 10 * CREDIT


@pytest.mark.parametrize(
    "event_id",
    ["evt_" + LONG_ID, "evt_" + 400 * LONG_ID, "evt_\x00", "evt_\udfff", 5, ["evt_1"], "", None],
    ids=["too long", "100 kB", "NUL", "lone surrogate", "a number", "a list", "empty", "null"],
)
def test_an_event_whose_id_cannot_be_stored_is_ignored_unrecorded(
    carol: Any, ls: Any, deliver: Any, event_id: Any, caplog: pytest.LogCaptureFixture
) -> None:
    payment, session, _ = paid_checkout(ls, carol, credits=10)
    bad = {**event("checkout.session.completed", session), "id": event_id}
    with caplog.at_level(logging.INFO, logger="payments.webhook"):
        ignored(deliver(bad), "id")
    assert all(len(record.getMessage()) < 400 for record in caplog.records)  # the id is quoted, cut short
    assert not WebhookEvent.objects.exists()
    uncredited(payment, carol)
    assert deliver(event("checkout.session.completed", session)).json()["outcome"] == "credited"


@pytest.mark.parametrize(
    "data",
    ["x", None, {}, {"object": "x"}, {"object": [1]}, {"object": None}],
    ids=["a string", "null", "no object", "object a string", "object a list", "object null"],
)
def test_an_event_without_an_object_is_ignored(carol: Any, ls: Any, deliver: Any, data: Any) -> None:
    payment, session, _ = paid_checkout(ls, carol, credits=10)
    bad = {**event("checkout.session.completed", session), "data": data}
    ignored(deliver(bad), "data.object")
    assert WebhookEvent.objects.get(event_id=bad["id"]).outcome == "ignored: malformed data.object"
    uncredited(payment, carol)
    assert deliver(event("checkout.session.completed", session)).json()["outcome"] == "credited"


def test_an_event_type_that_is_not_text_is_not_handled(deliver: Any) -> None:
    response = deliver({**event("checkout.session.completed", {}), "type": ["checkout.session.completed"]})
    assert (response.status_code, response.json()["outcome"]) == (200, "ignored: not handled")
    assert not WebhookEvent.objects.exists()


@pytest.mark.parametrize(
    ("event_type", "change", "field"),
    [
        ("payment_intent.succeeded", lambda p, c: {"id": p.payment_intent_id, "metadata": "x"}, "metadata"),
        (
            "payment_intent.succeeded",
            lambda p, c: {"id": p.payment_intent_id, "amount_received": 1.5, "metadata": {}},
            "amount_received",
        ),
        (
            "payment_intent.succeeded",
            lambda p, c: {"id": p.payment_intent_id, "latest_charge": {"id": 5}},
            "latest_charge",
        ),
        (
            "payment_intent.payment_failed",
            lambda p, c: {"id": p.payment_intent_id, "last_payment_error": "x"},
            "last_payment_error",
        ),
        (
            "payment_intent.payment_failed",
            lambda p, c: {"id": p.payment_intent_id, "last_payment_error": {"message": "no\x00"}},
            "last_payment_error.message",
        ),
        ("payment_intent.canceled", lambda p, c: {"id": p.payment_intent_id + "\x00"}, "id"),
        ("charge.refunded", lambda p, c: {**c, "amount_refunded": 2**63}, "amount_refunded"),
        ("charge.refunded", lambda p, c: {**c, "amount_refunded": str(c["amount"])}, "amount_refunded"),
        ("charge.refunded", lambda p, c: {**c, "currency": "usd\x00"}, "currency"),
        ("charge.refunded", lambda p, c: {**c, "payment_intent": p.payment_intent_id + "\x00"}, "payment_intent"),
        ("charge.dispute.created", lambda p, c: dispute(p, c["id"], status="lost\x00"), "status"),
        ("charge.dispute.created", lambda p, c: dispute(p, c["id"], id="dp_" + LONG_ID), "id"),
        ("charge.dispute.created", lambda p, c: dispute(p, c["id"], amount=-1000), "amount"),
        ("charge.dispute.closed", lambda p, c: dispute(p, c["id"], charge=c["id"] + "\ud800"), "charge"),
    ],
)
def test_other_events_it_cannot_apply_move_nothing(
    carol: Any, ls: Any, deliver: Any, event_type: str, change: Callable[[Payment, dict[str, Any]], Any], field: str
) -> None:
    payment, charge = credited(ls, carol, deliver, credits=10)
    before = Payment.objects.filter(pk=payment.pk).values().get()
    transactions = Transaction.objects.count()
    bad = event(event_type, change(payment, charge))
    ignored(deliver(bad), f"data.object.{field}")
    assert WebhookEvent.objects.get(event_id=bad["id"]).outcome == f"ignored: malformed data.object.{field}"
    assert Payment.objects.filter(pk=payment.pk).values().get() == before
    assert Transaction.objects.count() == transactions
    assert ledger.balance(carol) == 10 * CREDIT


@pytest.mark.parametrize(
    ("event_type", "obj", "field"),
    [
        ("account.updated", {"id": "acct_1", "payouts_enabled": "false"}, "payouts_enabled"),
        ("account.updated", {"id": "acct_\x00", "payouts_enabled": True}, "id"),
        ("transfer.reversed", {"id": "tr_1", "amount_reversed": "lots"}, "amount_reversed"),
    ],
)
def test_connect_events_it_cannot_apply_are_ignored(deliver: Any, event_type: str, obj: Any, field: str) -> None:
    ignored(deliver(event(event_type, obj)), f"data.object.{field}")


def test_a_parked_refund_keeps_only_what_its_replay_reads(carol: Any, ls: Any, deliver: Any) -> None:
    """Text no column can hold, in a field the webhook does not read, neither stops the
    refund from being parked (a DataError on PostgreSQL, before) nor is stored."""
    payment, session, intent = paid_checkout(ls, carol, credits=10)
    ls.post("/v1/refunds", data={"charge": charge_id_of(intent), "amount": 300}).raise_for_status()
    charge = charge_of(ls, charge_id_of(intent))
    refunded = event(
        "charge.refunded",
        {**charge, "description": "\ud800", "billing_details": {"name": "a\x00b"}, "metadata": {"note": "\x00"}},
    )
    assert deliver(refunded).json()["outcome"] == PARKED
    record = WebhookEvent.objects.get(event_id=refunded["id"])
    assert record.parked_object == {
        "id": charge["id"],
        "payment_intent": intent["id"],
        "currency": "usd",
        "amount_refunded": 300,
    }
    outcome = deliver(event("checkout.session.completed", session)).json()["outcome"]
    assert outcome == f"credited; replayed {refunded['id']}: reversed {3 * CREDIT} units"
    assert ledger.balance(carol) == 7 * CREDIT
    payment.refresh_from_db()
    assert (payment.status, payment.refunded_amount) == ("refunded", 300)


def test_a_malformed_object_parked_before_the_check_is_dropped_when_replayed(carol: Any, ls: Any, deliver: Any) -> None:
    """Events parked before objects were checked kept them whole: the completion that
    replays a malformed one still credits (it was a 500, for ever), and unparks it."""
    _, session, intent = paid_checkout(ls, carol, credits=10)
    WebhookEvent.objects.create(
        event_id="evt_parked_whole",
        type="charge.refunded",
        outcome=PARKED,
        parked_intent_id=intent["id"],
        parked_object={"id": "ch_1", "payment_intent": intent["id"], "currency": "usd", "amount_refunded": "lots"},
    )
    outcome = deliver(event("checkout.session.completed", session)).json()["outcome"]
    assert outcome == "credited; replayed evt_parked_whole: ignored: malformed data.object.amount_refunded"
    assert ledger.balance(carol) == 10 * CREDIT
    record = WebhookEvent.objects.get(event_id="evt_parked_whole")
    assert (record.parked_intent_id, record.parked_object) == ("", None)
    assert record.outcome == f"{PARKED}; replayed: ignored: malformed data.object.amount_refunded"
