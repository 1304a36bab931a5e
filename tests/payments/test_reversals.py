"""Refunds and disputes against the user's credits when Stripe's events come out of
order (a refund or dispute before the success it undoes: Stripe neither orders its
events nor stops retrying a failed delivery for days), and disputes that close: won
gives the credits back, lost leaves them burnt. Events are signed with the test secret
as in test_purchase; the charges and refunds are localstripe's."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.db.models import Q
from django.utils import timezone

from ledger import services as ledger
from ledger.models import Transaction
from ledger.units import UNITS_PER_CREDIT
from payments.models import Payment, WebhookEvent
from payments.webhook import PARK_EXPIRED, PARK_FOR, PARKED, handle_event
from tests.payments.conftest import event
from tests.payments.helpers import chain_agrees, charge_id_of, charge_of, credited, dispute, paid_checkout, paid_intent

pytestmark = pytest.mark.django_db

CREDIT = UNITS_PER_CREDIT


def refund(ls: Any, charge_id: str, amount: int | None = None) -> dict[str, Any]:
    """Refund at localstripe (all of it without ``amount``); the charge as it is then."""
    ls.post("/v1/refunds", data={"charge": charge_id, **({"amount": amount} if amount else {})}).raise_for_status()
    return charge_of(ls, charge_id)


def history(user: Any) -> list[tuple[str, int, str]]:
    """The user's ledger transactions in the order they were made: (type, amount, reference)."""
    address = ledger.ensure_user_account(user).address
    rows = Transaction.objects.filter(Q(sender=address) | Q(recipient=address)).order_by("id")
    return [(t.type, t.amount, str(t.reference)) for t in rows]


def audited() -> None:
    """The chain, sealed, replays from genesis (and the operator's command agrees)."""
    chain_agrees()
    call_command("verify_chain")


# --- Refunds and disputes before the success event -----------------------------------


@pytest.mark.parametrize(("refunded", "left"), [(300, 7), (1000, 0)])
def test_a_refund_before_the_success_event_credits_what_was_not_refunded(
    carol: Any, ls: Any, deliver: Any, refunded: int, left: int
) -> None:
    payment, intent = paid_intent(ls, carol, credits=10)
    charge = refund(ls, charge_id_of(intent), refunded if refunded < 1000 else None)
    assert charge["amount_refunded"] == refunded
    assert deliver(event("charge.refunded", charge)).json()["outcome"] == "recorded: not credited yet"
    assert ledger.balance(carol) == 0

    outcome = deliver(event("payment_intent.succeeded", intent)).json()["outcome"]
    assert outcome.startswith("credited; refund: reversed"), outcome
    assert ledger.balance(carol) == left * CREDIT
    payment.refresh_from_db()
    assert (payment.status, payment.refunded_amount) == ("refunded", refunded)
    assert payment.reversed_units == (10 - left) * CREDIT
    assert history(carol) == [
        ("DEPOSIT", 10 * CREDIT, f"payment:{payment.pk}"),
        ("REVERSAL", (10 - left) * CREDIT, f"refund:{payment.pk}:{refunded}"),
    ]
    # Stripe's retries of either event change nothing more.
    assert deliver(event("charge.refunded", charge)).json()["outcome"] == "ignored: no new refund"
    assert deliver(event("payment_intent.succeeded", intent)).json()["outcome"] == "ignored: already refunded"
    assert ledger.balance(carol) == left * CREDIT
    audited()


def test_a_later_refund_after_an_early_one_burns_only_the_new_part(carol: Any, ls: Any, deliver: Any) -> None:
    payment, intent = paid_intent(ls, carol, credits=10)
    deliver(event("charge.refunded", refund(ls, charge_id_of(intent), 300)))
    deliver(event("payment_intent.succeeded", intent))
    assert ledger.balance(carol) == 7 * CREDIT
    charge = refund(ls, charge_id_of(intent), 200)
    assert deliver(event("charge.refunded", charge)).json()["outcome"] == f"reversed {2 * CREDIT} units"
    assert ledger.balance(carol) == 5 * CREDIT
    payment.refresh_from_db()
    assert (payment.status, payment.refunded_amount, payment.reversed_units) == ("refunded", 500, 5 * CREDIT)
    audited()


@pytest.mark.parametrize(("disputed", "left"), [(400, 6), (1000, 0)])
def test_a_dispute_before_the_success_event_burns_the_disputed_credits_once_credited(
    carol: Any, ls: Any, deliver: Any, disputed: int, left: int
) -> None:
    payment, intent = paid_intent(ls, carol, credits=10)
    opened = dispute(payment, charge_id_of(intent), amount=disputed)
    assert deliver(event("charge.dispute.created", opened)).json()["outcome"] == "recorded: not credited yet"
    assert ledger.balance(carol) == 0

    outcome = deliver(event("payment_intent.succeeded", intent)).json()["outcome"]
    assert outcome.startswith("credited; dispute: reversed"), outcome
    assert ledger.balance(carol) == left * CREDIT
    payment.refresh_from_db()
    assert (payment.status, payment.disputed_amount) == ("disputed", disputed)
    assert history(carol) == [
        ("DEPOSIT", 10 * CREDIT, f"payment:{payment.pk}"),
        ("REVERSAL", (10 - left) * CREDIT, "dispute:dp_test_1"),
    ]
    audited()


def test_a_dispute_won_before_the_success_event_leaves_the_whole_payment_credited(
    carol: Any, ls: Any, deliver: Any
) -> None:
    payment, intent = paid_intent(ls, carol, credits=10)
    opened = dispute(payment, charge_id_of(intent))
    deliver(event("charge.dispute.created", opened))
    deliver(event("charge.dispute.closed", {**opened, "status": "won"}))
    assert deliver(event("payment_intent.succeeded", intent)).json()["outcome"] == "credited"
    assert ledger.balance(carol) == 10 * CREDIT
    payment.refresh_from_db()
    assert (payment.status, payment.disputed_amount, payment.reversed_units) == ("succeeded", 0, 0)
    audited()


# --- Disputes that close ---------------------------------------------------------------


@pytest.mark.parametrize("closed_as", ["won", "warning_closed"])
def test_a_dispute_won_gives_the_credits_back_once(carol: Any, ls: Any, deliver: Any, closed_as: str) -> None:
    payment, charge = credited(ls, carol, deliver, credits=10)
    opened = dispute(payment, charge["id"], status="needs_response" if closed_as == "won" else "warning_needs_response")
    deliver(event("charge.dispute.created", opened))
    assert ledger.balance(carol) == 0

    won = event("charge.dispute.closed", {**opened, "status": closed_as})
    assert deliver(won).json()["outcome"] == f"restored {10 * CREDIT} units"
    assert ledger.balance(carol) == 10 * CREDIT
    payment.refresh_from_db()
    assert (payment.status, payment.disputed_amount, payment.reversed_units) == ("succeeded", 0, 0)
    # The same event again, a second one about the same close, and Stripe's
    # funds_reinstated (not subscribed: closed is the one trigger) credit nothing more.
    assert deliver(won).json()["outcome"] == "duplicate"
    again = event("charge.dispute.closed", {**opened, "status": closed_as})
    assert deliver(again).json()["outcome"] == f"ignored: dispute already {closed_as}"
    assert deliver(event("charge.dispute.funds_reinstated", opened)).json()["outcome"] == "ignored: not handled"
    assert ledger.balance(carol) == 10 * CREDIT
    assert history(carol) == [
        ("DEPOSIT", 10 * CREDIT, f"payment:{payment.pk}"),
        ("REVERSAL", 10 * CREDIT, "dispute:dp_test_1"),
        ("DEPOSIT", 10 * CREDIT, "dispute-won:dp_test_1"),
    ]
    audited()


def test_a_dispute_won_after_a_partial_refund_leaves_the_payment_refunded(carol: Any, ls: Any, deliver: Any) -> None:
    payment, charge = credited(ls, carol, deliver, credits=10)
    deliver(event("charge.refunded", refund(ls, charge["id"], 300)))
    opened = dispute(payment, charge["id"], amount=700)
    deliver(event("charge.dispute.created", opened))
    assert ledger.balance(carol) == 0
    deliver(event("charge.dispute.closed", {**opened, "status": "won"}))
    assert ledger.balance(carol) == 7 * CREDIT
    payment.refresh_from_db()
    assert (payment.status, payment.refunded_amount, payment.disputed_amount) == ("refunded", 300, 0)
    assert payment.reversed_units == 3 * CREDIT
    audited()


def test_a_dispute_won_gives_back_only_what_it_burnt_and_forgets_its_shortfall(
    carol: Any, bob: Any, ls: Any, deliver: Any
) -> None:
    payment, charge = credited(ls, carol, deliver, credits=10)
    ledger.transfer(carol, ledger.ensure_user_account(bob).address, 7 * CREDIT, reference="spend")
    left = ledger.balance(carol)
    opened = dispute(payment, charge["id"])
    deliver(event("charge.dispute.created", opened))
    payment.refresh_from_db()
    assert (payment.reversed_units, payment.shortfall_units) == (left, 10 * CREDIT - left)
    deliver(event("charge.dispute.closed", {**opened, "status": "won"}))
    assert ledger.balance(carol) == left
    payment.refresh_from_db()
    assert (payment.status, payment.reversed_units, payment.shortfall_units) == ("succeeded", 0, 0)
    audited()


def test_a_dispute_lost_leaves_the_credits_burnt(carol: Any, ls: Any, deliver: Any) -> None:
    payment, charge = credited(ls, carol, deliver, credits=10)
    opened = dispute(payment, charge["id"], amount=400)
    deliver(event("charge.dispute.created", opened))
    assert ledger.balance(carol) == 6 * CREDIT
    outcome = deliver(event("charge.dispute.closed", {**opened, "status": "lost"})).json()["outcome"]
    assert outcome == "dispute lost: nothing more to do"
    assert ledger.balance(carol) == 6 * CREDIT
    payment.refresh_from_db()
    assert (payment.status, payment.disputed_amount, payment.reversed_units) == ("disputed", 400, 4 * CREDIT)
    assert not Transaction.objects.filter(reference__startswith="dispute-won:").exists()
    audited()


def test_a_close_that_overtakes_its_dispute_is_applied_and_the_late_dispute_ignored(
    carol: Any, ls: Any, deliver: Any
) -> None:
    won, charge = credited(ls, carol, deliver, credits=10)
    opened = dispute(won, charge["id"])
    assert deliver(event("charge.dispute.closed", {**opened, "status": "won"})).json()["outcome"] == (
        "recorded: won before it was opened"
    )
    assert deliver(event("charge.dispute.created", opened)).json()["outcome"] == "ignored: dispute already won"
    assert ledger.balance(carol) == 10 * CREDIT
    # A lost one that overtakes its dispute burns what the dispute would have.
    lost, charge = credited(ls, carol, deliver, credits=5)
    opened = dispute(lost, charge["id"], amount=500, id="dp_test_2")
    assert (
        deliver(event("charge.dispute.closed", {**opened, "status": "lost"})).json()["outcome"].startswith("reversed")
    )
    assert deliver(event("charge.dispute.created", opened)).json()["outcome"] == "ignored: dispute already lost"
    assert ledger.balance(carol) == 10 * CREDIT
    lost.refresh_from_db()
    assert lost.status == "disputed"
    audited()


def test_a_dispute_about_another_charge_of_the_payment_is_not_restored(carol: Any, ls: Any, deliver: Any) -> None:
    payment, charge = credited(ls, carol, deliver, credits=10)
    deliver(event("charge.dispute.created", dispute(payment, charge["id"])))
    other = dispute(payment, charge["id"], status="won", id="dp_somebody_else")
    assert deliver(event("charge.dispute.closed", other)).json()["outcome"] == "ignored: not this payment's dispute"
    assert ledger.balance(carol) == 0


def test_a_reversal_made_again_with_its_reference_is_counted_once(carol: Any, ls: Any, deliver: Any) -> None:
    from payments import services

    payment, intent = paid_intent(ls, carol, credits=10)
    deliver(event("payment_intent.succeeded", intent))
    for expected in ("reversed", "ignored: already reversed"):
        with transaction.atomic():
            locked = Payment.objects.select_for_update().get(pk=payment.pk)
            outcome = services.reverse_payment(locked, amount=300, reason="refund", reference="refund:again")
        assert outcome.startswith(expected), outcome
    payment.refresh_from_db()
    assert payment.reversed_units == 3 * CREDIT
    assert ledger.balance(carol) == 7 * CREDIT
    audited()


# --- Checkout payments: refunds and disputes before checkout.session.completed ---------
# The payment knows only its session until the completion names its PaymentIntent, so a
# refund or dispute that comes first is parked and replayed by the completion.


def parked(evt: dict[str, Any]) -> WebhookEvent:
    return WebhookEvent.objects.get(event_id=evt["id"])


@pytest.mark.parametrize(("refunded", "left"), [(300, 7), (1000, 0)])
def test_a_refund_before_the_checkout_completion_is_parked_then_burnt_once_credited(
    carol: Any, ls: Any, deliver: Any, refunded: int, left: int
) -> None:
    payment, session, intent = paid_checkout(ls, carol, credits=10)
    charge = refund(ls, charge_id_of(intent), refunded if refunded < 1000 else None)
    refunded_event = event("charge.refunded", charge)
    assert deliver(refunded_event).json()["outcome"] == PARKED
    assert parked(refunded_event).parked_intent_id == intent["id"]
    assert ledger.balance(carol) == 0

    completed = event("checkout.session.completed", session)
    outcome = deliver(completed).json()["outcome"]
    assert outcome == f"credited; replayed {refunded_event['id']}: reversed {(10 - left) * CREDIT} units", outcome
    assert ledger.balance(carol) == left * CREDIT
    payment.refresh_from_db()
    assert (payment.status, payment.payment_intent_id, payment.refunded_amount) == ("refunded", intent["id"], refunded)
    assert history(carol) == [
        ("DEPOSIT", 10 * CREDIT, f"payment:{payment.pk}"),
        ("REVERSAL", (10 - left) * CREDIT, f"refund:{payment.pk}:{refunded}"),
    ]
    record = parked(refunded_event)
    assert (record.parked_intent_id, record.parked_object) == ("", None)
    assert record.outcome.startswith(f"{PARKED}; replayed: reversed")
    # Stripe's retries of either event, and the async success, change nothing more.
    assert deliver(refunded_event).json()["outcome"] == "duplicate"
    assert deliver(completed).json()["outcome"] == "duplicate"
    assert deliver(event("charge.refunded", charge)).json()["outcome"] == "ignored: no new refund"
    assert (
        deliver(event("checkout.session.async_payment_succeeded", session)).json()["outcome"]
        == "ignored: already refunded"
    )
    assert ledger.balance(carol) == left * CREDIT
    audited()


def test_refunds_parked_before_the_completion_are_replayed_in_the_order_received(
    carol: Any, ls: Any, deliver: Any
) -> None:
    payment, session, intent = paid_checkout(ls, carol, credits=10)
    first = event("charge.refunded", refund(ls, charge_id_of(intent), 300))
    second = event("charge.refunded", refund(ls, charge_id_of(intent), 200))
    assert deliver(first).json()["outcome"] == deliver(second).json()["outcome"] == PARKED
    # A redelivery while parked is a duplicate, not a second parked copy.
    assert deliver(first).json()["outcome"] == "duplicate"

    outcome = deliver(event("checkout.session.completed", session)).json()["outcome"]
    assert outcome.count("replayed") == 2, outcome
    assert ledger.balance(carol) == 5 * CREDIT
    assert history(carol) == [
        ("DEPOSIT", 10 * CREDIT, f"payment:{payment.pk}"),
        ("REVERSAL", 3 * CREDIT, f"refund:{payment.pk}:300"),
        ("REVERSAL", 2 * CREDIT, f"refund:{payment.pk}:500"),
    ]
    assert deliver(first).json()["outcome"] == deliver(second).json()["outcome"] == "duplicate"
    assert ledger.balance(carol) == 5 * CREDIT
    audited()


@pytest.mark.parametrize(("disputed", "left"), [(400, 6), (1000, 0)])
def test_a_dispute_before_the_async_checkout_success_is_parked_then_burnt_once_credited(
    carol: Any, ls: Any, deliver: Any, disputed: int, left: int
) -> None:
    payment, session, intent = paid_checkout(ls, carol, credits=10)
    opened = event(
        "charge.dispute.created", dispute(payment, charge_id_of(intent), amount=disputed, payment_intent=intent["id"])
    )
    assert deliver(opened).json()["outcome"] == PARKED
    assert ledger.balance(carol) == 0

    outcome = deliver(event("checkout.session.async_payment_succeeded", session)).json()["outcome"]
    assert outcome.startswith(f"credited; replayed {opened['id']}: reversed"), outcome
    assert ledger.balance(carol) == left * CREDIT
    payment.refresh_from_db()
    assert (payment.status, payment.disputed_amount, payment.dispute_id) == ("disputed", disputed, "dp_test_1")
    assert history(carol) == [
        ("DEPOSIT", 10 * CREDIT, f"payment:{payment.pk}"),
        ("REVERSAL", (10 - left) * CREDIT, "dispute:dp_test_1"),
    ]
    assert deliver(opened).json()["outcome"] == "duplicate"
    assert ledger.balance(carol) == left * CREDIT
    audited()


def test_a_dispute_opened_and_won_before_the_completion_is_replayed_in_order(carol: Any, ls: Any, deliver: Any) -> None:
    payment, session, intent = paid_checkout(ls, carol, credits=10)
    opened = {**dispute(payment, charge_id_of(intent)), "payment_intent": intent["id"]}
    assert deliver(event("charge.dispute.created", opened)).json()["outcome"] == PARKED
    assert deliver(event("charge.dispute.closed", {**opened, "status": "won"})).json()["outcome"] == PARKED

    deliver(event("checkout.session.completed", session))
    # Opened, then won: burnt, then given back (in the other order the win would be
    # "won before it was opened" and nothing would move).
    assert history(carol) == [
        ("DEPOSIT", 10 * CREDIT, f"payment:{payment.pk}"),
        ("REVERSAL", 10 * CREDIT, "dispute:dp_test_1"),
        ("DEPOSIT", 10 * CREDIT, "dispute-won:dp_test_1"),
    ]
    assert ledger.balance(carol) == 10 * CREDIT
    payment.refresh_from_db()
    assert (payment.status, payment.dispute_status, payment.reversed_units) == ("succeeded", "won", 0)
    audited()


def test_an_event_of_an_intent_that_never_becomes_ours_stays_parked_then_is_dropped(
    carol: Any, ls: Any, deliver: Any
) -> None:
    _, session, _ = paid_checkout(ls, carol, credits=10)
    stranger = {"id": "ch_elsewhere", "object": "charge", "payment_intent": "pi_elsewhere", "currency": "usd"}
    theirs = event("charge.refunded", {**stranger, "amount_refunded": 500})
    assert deliver(theirs).json()["outcome"] == PARKED
    # Our own completion replays nothing of another intent's.
    assert deliver(event("checkout.session.completed", session)).json()["outcome"] == "credited"
    assert ledger.balance(carol) == 10 * CREDIT
    assert parked(theirs).parked_intent_id == "pi_elsewhere"

    WebhookEvent.objects.filter(event_id=theirs["id"]).update(
        received_at=timezone.now() - PARK_FOR - timedelta(hours=1)
    )
    recent = event("charge.refunded", {**stranger, "amount_refunded": 600})
    assert deliver(recent).json()["outcome"] == PARKED  # parking drops what waited too long
    old = parked(theirs)
    assert (old.parked_intent_id, old.parked_object, old.outcome) == ("", None, PARK_EXPIRED)
    assert parked(recent).parked_intent_id == "pi_elsewhere"
    # The dropped event's row stays: a very late redelivery is still a duplicate.
    assert deliver(theirs).json()["outcome"] == "duplicate"
    # An event naming no intent at all cannot be matched later: ignored as before.
    no_intent = {**stranger, "id": "ch_nothing", "payment_intent": None}
    assert deliver(event("charge.refunded", no_intent)).json()["outcome"] == "ignored: no such payment"
    assert WebhookEvent.objects.exclude(parked_intent_id="").count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="needs PostgreSQL's row visibility; SQLite serialises every writer"
)
def test_a_refund_racing_the_checkout_completion_is_applied_not_parked_for_ever(carol: Any, ls: Any) -> None:
    _, session, intent = paid_checkout(ls, carol, credits=10)
    charge = refund(ls, charge_id_of(intent), 300)
    completing = threading.Event()

    def complete() -> str:
        try:
            with transaction.atomic():
                outcome = handle_event(event("checkout.session.completed", session))
                completing.set()
                time.sleep(1)  # the refund comes now, while the intent id is not committed
            return outcome
        finally:
            completing.set()
            connections.close_all()

    def refunded() -> str:
        try:
            completing.wait(20)
            return handle_event(event("charge.refunded", charge))
        finally:
            connections.close_all()

    with ThreadPoolExecutor(2) as pool:
        outcomes = [f.result() for f in [pool.submit(complete), pool.submit(refunded)]]
    assert outcomes == ["credited", f"reversed {3 * CREDIT} units"]
    assert ledger.balance(carol) == 7 * CREDIT
    assert not WebhookEvent.objects.exclude(parked_intent_id="").exists()
