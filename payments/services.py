"""State changes of payments. Views, the API, the admin and the webhook call these;
nothing else writes Payment or PayoutRequest rows or asks the ledger to move money
for Stripe.

Buying credits: ``start_purchase`` records a Payment and creates its PaymentIntent (or
Checkout Session); only ``credit_payment``, called by the webhook for a verified event,
credits it. Refunds and disputes burn the credits again (``refund_payment``,
``open_dispute``: ``reverse_payment``), in whatever order Stripe's events come: one that
comes before the payment is credited is recorded, and burnt right after the DEPOSIT.
Credits already escrowed or spent become the account's debt, paid first by whatever
arrives later, and a debtor can request no payout. A dispute the platform wins gives
its credits back and forgets its debt (``close_dispute``).
Payouts: ``request_payout`` → ``approve_payout`` (admin: PAYOUT burns the credits) →
``send_payout`` (Stripe transfer, outside any transaction; a refusal restores the
credits with a DEPOSIT).

Input errors are DRF ValidationErrors naming the field, so the API and the pages both
show them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial
from typing import Any
from uuid import UUID

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from rest_framework import status
from rest_framework.exceptions import APIException, ValidationError

from config.celery import enqueue
from ledger import services as ledger
from ledger.chain import context
from ledger.gas import fee_for
from ledger.units import UNITS_PER_CREDIT, format_credits
from payments import stripe_client
from payments.models import ConnectedAccount, Customer, Payment, PaymentStatus, PayoutRequest, PayoutStatus
from protocol.encoding import PAYOUT

log = logging.getLogger(__name__)


class NotConfigured(APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "Payments are not configured on this server."
    default_code = "payments_not_configured"


class ProviderUnavailable(APIException):
    """Stripe refused the request or could not be reached."""

    status_code = status.HTTP_502_BAD_GATEWAY
    default_code = "payment_provider_error"


def _require_payments() -> None:
    if not stripe_client.configured():
        raise NotConfigured()


def _require_connect() -> None:
    _require_payments()
    if not settings.STRIPE_CONNECT:
        raise NotConfigured("Payouts through Stripe Connect are not enabled on this server.")


# --- Buying credits --------------------------------------------------------------


def price_of(credits: int) -> int:
    """What ``credits`` whole credits cost, in the currency's smallest unit."""
    return credits * settings.CREDIT_PRICE_MINOR


def units_for_amount(payment: Payment, amount: int) -> int:
    """The credits (base units) that ``amount`` of this payment's money bought."""
    return payment.units * min(amount, payment.amount) // payment.amount


def check_credits(credits: Any) -> int:
    """A purchasable number of whole credits, else ValidationError naming ``credits``."""
    if type(credits) is not int:
        raise ValidationError({"credits": ["A whole number of credits is required."]})
    low, high = settings.PURCHASE_MIN_CREDITS, settings.PURCHASE_MAX_CREDITS
    if not low <= credits <= high:
        raise ValidationError({"credits": [f"Buy between {low} and {high} credits at a time."]})
    return credits


def customer_of(user: Any) -> str:
    """The user's Stripe Customer id, created on their first purchase."""
    known = Customer.objects.owned_by(user).values_list("customer_id", flat=True).first()
    if known:
        return known
    customer_id = stripe_client.create_customer(
        getattr(user, "email", ""), user.pk, idempotency_key=f"customer:{user.pk}"
    )
    row, _ = Customer.objects.get_or_create(user=user, defaults={"customer_id": customer_id})
    return row.customer_id


@dataclass(frozen=True)
class Purchase:
    """A started purchase: the row, and what the browser needs to pay it."""

    payment: Payment
    client_secret: str = ""
    checkout_url: str = ""


def start_purchase(
    user: Any, credits: int, *, checkout: bool = False, success_url: str = "", cancel_url: str = ""
) -> Purchase:
    """Record a Payment for ``credits`` whole credits and create its PaymentIntent (or,
    with ``checkout``, a Checkout Session). Nothing is credited here: the webhook does.
    The Stripe call runs after the row is committed, outside any transaction, with the
    payment's id as idempotency key, so a retried call creates nothing twice."""
    _require_payments()
    credits = check_credits(credits)
    if checkout and not settings.STRIPE_CHECKOUT:
        raise ValidationError({"checkout": ["Stripe Checkout is not enabled on this server."]})
    ledger.ensure_user_account(user)
    payment = Payment.objects.create(
        user=user,
        units=credits * UNITS_PER_CREDIT,
        amount=price_of(credits),
        currency=settings.STRIPE_CURRENCY,
    )
    metadata = {"payment_id": str(payment.pk), "user_id": str(user.pk), "units": str(payment.units)}
    try:
        if checkout:
            session = stripe_client.create_checkout_session(
                payment.amount,
                payment.currency,
                f"{credits} Proofwork credits",
                metadata,
                success_url,
                cancel_url,
                idempotency_key=f"purchase:{payment.pk}",
            )
            payment.checkout_session_id = session.id
            payment.save(update_fields=["checkout_session_id", "updated_at"])
            return Purchase(payment, checkout_url=session.url)
        intent = stripe_client.create_payment_intent(
            payment.amount,
            payment.currency,
            customer_of(user),
            metadata,
            idempotency_key=f"purchase:{payment.pk}",
        )
    except stripe_client.ProviderError as exc:
        payment.status = PaymentStatus.FAILED
        payment.failure_message = str(exc)
        payment.save(update_fields=["status", "failure_message", "updated_at"])
        log.warning("payment %s: Stripe refused to start it (%s)", payment.pk, exc.code or "error")
        raise ProviderUnavailable(f"The payment provider refused the payment: {exc}") from None
    payment.payment_intent_id = intent.id
    payment.save(update_fields=["payment_intent_id", "updated_at"])
    return Purchase(payment, client_secret=intent.client_secret)


def find_payment(*, intent_id: str = "", session_id: str = "", charge_id: str = "", payment_id: str = "") -> Any:
    """The payment a Stripe object refers to, locked (select_for_update), or None."""
    rows = Payment.objects.select_for_update()
    for field, value in (
        ("payment_intent_id", intent_id),
        ("checkout_session_id", session_id),
        ("charge_id", charge_id),
    ):
        if value:
            found = rows.filter(**{field: value}).first()
            if found is not None:
                return found
    if payment_id:
        try:
            return rows.filter(pk=UUID(payment_id)).first()
        except ValueError:
            return None
    return None


def credit_payment(
    payment: Payment, *, amount: int, currency: str, metadata: dict[str, Any], charge_id: str = ""
) -> str:
    """Post the payment's one DEPOSIT after checking what Stripe reports against what
    was created: amount, currency, and the user and payment named in the metadata.
    A refund or dispute recorded before this (Stripe's events come in any order) is
    burnt right after the DEPOSIT. Expects the payment row locked by the caller's
    transaction. Returns the outcome (``credited``, then any such reversal, or why it was
    ignored); a mismatch credits nothing."""
    problems = []
    if amount != payment.amount:
        problems.append(f"amount {amount} ≠ {payment.amount}")
    if (currency or "").lower() != payment.currency:
        problems.append(f"currency {currency!r} ≠ {payment.currency!r}")
    if str(metadata.get("user_id", "")) != str(payment.user_id):
        problems.append("metadata.user_id does not match")
    if str(metadata.get("payment_id", "")) != str(payment.pk):
        problems.append("metadata.payment_id does not match")
    if problems:
        log.warning("payment %s: event ignored, %s", payment.pk, "; ".join(problems))
        return "ignored: " + "; ".join(problems)
    if payment.status not in (PaymentStatus.CREATED, PaymentStatus.FAILED):
        return f"ignored: already {payment.status}"
    tx = ledger.deposit(payment.user, payment.units, reference=f"payment:{payment.pk}")
    payment.deposit = tx
    payment.failure_message = ""
    if charge_id:
        payment.charge_id = charge_id
    log.info("payment %s: credited %s credits (tx %s)", payment.pk, format_credits(payment.units), tx.hash)
    # A refund or dispute that came before this event was only recorded: burn it now,
    # with the references its own event would have used.
    outcomes = ["credited"]
    if payment.refunded_amount:
        reference = f"refund:{payment.pk}:{payment.refunded_amount}"
        outcomes.append(
            "refund: " + reverse_payment(payment, amount=payment.refunded_amount, reason="refund", reference=reference)
        )
    if payment.disputed_amount:
        outcomes.append("dispute: " + _reverse_dispute(payment))
    payment.status = _settled_status(payment)
    payment.save(update_fields=["deposit", "status", "failure_message", "charge_id", "updated_at"])
    return "; ".join(outcomes)


def fail_payment(payment: Payment, message: str, *, canceled: bool = False) -> str:
    """Record a declined or canceled attempt; a later success still credits."""
    if payment.status != PaymentStatus.CREATED and not (payment.status == PaymentStatus.FAILED and canceled):
        return f"ignored: already {payment.status}"
    payment.status = PaymentStatus.CANCELED if canceled else PaymentStatus.FAILED
    payment.failure_message = message[:300]
    payment.save(update_fields=["status", "failure_message", "updated_at"])
    return payment.status


def reverse_payment(payment: Payment, *, amount: int, reason: str, reference: str) -> str:
    """Burn the credits ``amount`` of the payment's money bought (a refund or dispute)
    with a REVERSAL transaction. Credits the user has already escrowed or spent cannot be
    burnt now: they are recorded as the payment's shortfall, become the account's debt
    (the ledger's ``owed``, which credits arriving later pay first: an escrow coming back,
    a new purchase) and are logged. Expects the payment row locked by the caller's
    transaction."""
    if payment.deposit_id is None:
        return "ignored: never credited"
    if ledger.find_by_reference(reference) is not None:
        return "ignored: already reversed"  # counted when it was made: never twice
    target = min(units_for_amount(payment, amount), payment.units - payment.reversed_units - payment.shortfall_units)
    if target <= 0:
        return "ignored: nothing left to reverse"
    tx = ledger.reverse_deposit(payment.user, target, reference=reference, reason=reason)
    taken = tx.amount if tx is not None else 0
    payment.reversed_units += taken
    payment.shortfall_units += target - taken
    payment.save(update_fields=["reversed_units", "shortfall_units", "updated_at"])
    if taken < target:
        log.warning(
            "payment %s: %s; %s credits had already been spent and could not be reversed",
            payment.pk,
            reason,
            format_credits(target - taken),
        )
    return f"reversed {taken} units" + (f", shortfall {target - taken}" if taken < target else "")


def _settled_status(payment: Payment) -> str:
    """The status of a credited payment: disputed while a dispute holds money back, else
    refunded if any of it was refunded, else succeeded."""
    if payment.disputed_amount:
        return PaymentStatus.DISPUTED
    if payment.refunded_amount:
        return PaymentStatus.REFUNDED
    return PaymentStatus.SUCCEEDED


def refund_payment(payment: Payment, refunded: int) -> str:
    """Record Stripe's running total of refunds of the payment's charge and burn the
    credits the new part bought. Before the payment is credited the total is only
    recorded: ``credit_payment`` burns it right after its DEPOSIT. Expects the payment row
    locked by the caller's transaction."""
    delta = refunded - payment.refunded_amount
    if delta <= 0:
        return "ignored: no new refund"
    payment.refunded_amount = refunded
    if payment.deposit_id is None:
        payment.save(update_fields=["refunded_amount", "updated_at"])
        return "recorded: not credited yet"
    outcome = reverse_payment(payment, amount=delta, reason="refund", reference=f"refund:{payment.pk}:{refunded}")
    payment.status = _settled_status(payment)
    payment.save(update_fields=["refunded_amount", "status", "updated_at"])
    return outcome


# Closed in the platform's favour: the money stays (a won chargeback is reinstated; an
# inquiry closed as warning_closed never took any), so the credits it burnt come back.
DISPUTE_WON = frozenset({"won", "warning_closed"})


def _reverse_dispute(payment: Payment) -> str:
    """Burn the credits the payment's dispute claims, remembering which part of the
    payment's reversed units and shortfall is the dispute's (a won dispute gives back
    exactly that). Once per dispute: the REVERSAL's reference is the dispute's id."""
    reversed_before, shortfall_before = payment.reversed_units, payment.shortfall_units
    outcome = reverse_payment(
        payment, amount=payment.disputed_amount, reason="dispute", reference=f"dispute:{payment.dispute_id}"
    )
    payment.dispute_reversed_units += payment.reversed_units - reversed_before
    payment.dispute_shortfall_units += payment.shortfall_units - shortfall_before
    payment.save(update_fields=["dispute_reversed_units", "dispute_shortfall_units", "updated_at"])
    return outcome


def open_dispute(payment: Payment, *, dispute_id: str, amount: int, status: str) -> str:
    """A dispute of the payment's charge (charge.dispute.created): burn the credits
    ``amount`` of its money bought. Before the payment is credited it is only recorded,
    and ``credit_payment`` burns it right after its DEPOSIT. A dispute already recorded,
    even one that closed first, changes nothing. Expects the payment row locked."""
    if payment.dispute_id:
        if payment.dispute_id != dispute_id:
            log.warning("payment %s: dispute %s ignored, %s came first", payment.pk, dispute_id, payment.dispute_id)
            return "ignored: not this payment's dispute"
        return f"ignored: dispute already {payment.dispute_status}"
    payment.dispute_id = dispute_id
    payment.dispute_status = status[:30]
    payment.disputed_amount = amount
    payment.save(update_fields=["dispute_id", "dispute_status", "disputed_amount", "updated_at"])
    if payment.deposit_id is None:
        return "recorded: not credited yet"
    outcome = _reverse_dispute(payment)
    payment.status = _settled_status(payment)
    payment.save(update_fields=["status", "updated_at"])
    return outcome


def close_dispute(payment: Payment, *, dispute_id: str, amount: int, status: str) -> str:
    """The payment's dispute closed (charge.dispute.closed). Won (``DISPUTE_WON``): the
    debt its shortfall left on the account is forgotten as far as it is still owed, a
    DEPOSIT gives back the credits the dispute burnt and the part of its debt already paid
    (reference ``dispute-won:<id>``), and the status goes back to succeeded or refunded.
    Lost: nothing more. A close that overtook its dispute's creation is applied as the
    creation would have been, then recorded so the late creation changes nothing.
    Expects the payment row locked by the caller's transaction."""
    if not payment.dispute_id:
        if status not in DISPUTE_WON:
            return open_dispute(payment, dispute_id=dispute_id, amount=amount, status=status)
        payment.dispute_id, payment.dispute_status = dispute_id, status[:30]
        payment.save(update_fields=["dispute_id", "dispute_status", "updated_at"])
        return "recorded: won before it was opened"
    if payment.dispute_id != dispute_id:
        log.warning("payment %s: close of dispute %s ignored, not %s", payment.pk, dispute_id, payment.dispute_id)
        return "ignored: not this payment's dispute"
    if payment.dispute_status in DISPUTE_WON:
        return f"ignored: dispute already {payment.dispute_status}"
    payment.dispute_status = status[:30]
    if status not in DISPUTE_WON:
        payment.save(update_fields=["dispute_status", "updated_at"])
        return f"dispute {status}: nothing more to do"
    # What the dispute could not burn became the account's debt; what of that debt is still
    # owed is forgotten, and what was paid already (credits that arrived since) is given
    # back with what the dispute burnt.
    claimed = payment.dispute_shortfall_units
    forgiven = ledger.forgive_debt(payment.user, claimed) if claimed else 0
    restored = payment.dispute_reversed_units + claimed - forgiven
    if restored:
        ledger.deposit(payment.user, restored, reference=f"dispute-won:{dispute_id}")
    payment.reversed_units -= payment.dispute_reversed_units
    payment.shortfall_units -= payment.dispute_shortfall_units
    payment.dispute_reversed_units = payment.dispute_shortfall_units = 0
    payment.disputed_amount = 0
    if payment.deposit_id is not None:
        payment.status = _settled_status(payment)
    payment.save(
        update_fields=[
            "reversed_units",
            "shortfall_units",
            "dispute_reversed_units",
            "dispute_shortfall_units",
            "disputed_amount",
            "dispute_status",
            "status",
            "updated_at",
        ]
    )
    log.info("payment %s: dispute %s %s, %s credits restored", payment.pk, dispute_id, status, format_credits(restored))
    return f"restored {restored} units"


# --- Payouts ----------------------------------------------------------------------


def connected_account(user: Any) -> ConnectedAccount | None:
    return ConnectedAccount.objects.owned_by(user).first()


def link_account(user: Any, *, refresh_url: str, return_url: str) -> str:
    """Create the user's Stripe Connect (Express) account on first call and return a
    one-time onboarding URL for it."""
    _require_connect()
    account = connected_account(user)
    try:
        if account is None:
            state = stripe_client.create_connected_account(
                getattr(user, "email", ""), user.pk, idempotency_key=f"connect:{user.pk}"
            )
            account, _ = ConnectedAccount.objects.get_or_create(
                user=user,
                defaults={
                    "account_id": state.id,
                    "payouts_enabled": state.payouts_enabled,
                    "details_submitted": state.details_submitted,
                },
            )
        return stripe_client.create_account_link(account.account_id, refresh_url, return_url)
    except stripe_client.ProviderError as exc:
        raise ProviderUnavailable(f"Stripe could not link an account: {exc}") from None


def refresh_account(user: Any) -> ConnectedAccount | None:
    """Re-read the user's connected account from Stripe (after onboarding)."""
    _require_connect()
    account = connected_account(user)
    if account is None:
        return None
    try:
        state = stripe_client.retrieve_account(account.account_id)
    except stripe_client.ProviderError as exc:
        raise ProviderUnavailable(f"Stripe could not be asked about the account: {exc}") from None
    return update_account(account.account_id, state.payouts_enabled, state.details_submitted)


def update_account(account_id: str, payouts_enabled: bool, details_submitted: bool) -> ConnectedAccount | None:
    """Record what Stripe says of a connected account (webhook account.updated)."""
    account = ConnectedAccount.objects.filter(account_id=account_id).first()
    if account is None:
        return None
    account.payouts_enabled = payouts_enabled
    account.details_submitted = details_submitted
    account.save(update_fields=["payouts_enabled", "details_submitted", "updated_at"])
    return account


def payout_fee() -> int:
    """The gas the provider pays for the PAYOUT transaction, base units."""
    return fee_for(PAYOUT, context().min_gas_price)


def amount_for_units(units: int) -> int:
    """Money for ``units`` of credits in the smallest currency unit; ValidationError
    naming ``amount`` when it is not a whole number of them."""
    minor, rest = divmod(units * settings.CREDIT_PRICE_MINOR, UNITS_PER_CREDIT)
    if rest:
        currency = settings.STRIPE_CURRENCY.upper()
        raise ValidationError(
            {"amount": [f"The amount must come to a whole number of {currency} minor units (cents)."]}
        )
    return minor


def _check_not_owing(user: Any) -> None:
    """ValidationError naming ``amount`` and the debt while the user's account owes."""
    try:
        ledger.check_not_owing(user, "request payouts")
    except ledger.Owes as exc:
        raise ValidationError({"amount": [str(exc)]}) from None


def request_payout(user: Any, units: int) -> PayoutRequest:
    """A provider asks for ``units`` of their credits to be paid to their linked
    account. Checks the minimum, the linked account, that the account owes nothing
    (``ledger.check_not_owing``) and the balance (amount plus the PAYOUT gas); one open
    request at a time. Moves nothing until an admin approves."""
    _require_connect()
    if type(units) is not int or units <= 0:
        raise ValidationError({"amount": ["A positive amount of credits is required."]})
    minimum = settings.PAYOUT_MIN_CREDITS * UNITS_PER_CREDIT
    if units < minimum:
        raise ValidationError({"amount": [f"The smallest payout is {settings.PAYOUT_MIN_CREDITS} credits."]})
    amount = amount_for_units(units)
    account = connected_account(user)
    if account is None:
        raise ValidationError({"destination": ["Link a Stripe account before requesting a payout."]})
    if not account.payouts_enabled:
        raise ValidationError({"destination": ["Your Stripe account cannot receive payouts yet: finish onboarding."]})
    _check_not_owing(user)
    with transaction.atomic():
        # One lock per user serialises two concurrent requests of the same provider.
        get_user_model().objects.select_for_update().filter(pk=user.pk).first()
        if (
            PayoutRequest.objects.owned_by(user)
            .filter(status__in=[PayoutStatus.REQUESTED, PayoutStatus.APPROVED])
            .exists()
        ):
            raise ValidationError({"status": ["You already have a payout waiting; wait for it to finish."]})
        needed = units + payout_fee()
        available = ledger.balance(user)
        if needed > available:
            raise ValidationError(
                {
                    "amount": [
                        f"You have {format_credits(available)} credits; this payout needs {format_credits(needed)} (with its fee)."
                    ]
                }
            )
        return PayoutRequest.objects.create(
            user=user, units=units, amount=amount, currency=settings.STRIPE_CURRENCY, destination=account.account_id
        )


def approve_payout(payout_id: UUID, admin: Any) -> PayoutRequest:
    """Admin approval: a PAYOUT transaction burns the credits, then (after commit) the
    transfer is sent by a Celery task. Raises ValidationError naming ``status`` when the
    request is not waiting for approval, ``amount`` when the credits are gone or the
    provider's account owes credits."""

    with transaction.atomic():
        payout = PayoutRequest.objects.select_for_update().filter(pk=payout_id).first()
        if payout is None or payout.status != PayoutStatus.REQUESTED:
            raise ValidationError({"status": [f"This payout is {payout.status if payout else 'gone'}, not requested."]})
        debt = ledger.owed(payout.user)
        if debt:
            raise ValidationError(
                {
                    "amount": [
                        f"The provider's account owes {format_credits(debt)} credits from a refunded or disputed "
                        "purchase: nothing is paid out until it is paid."
                    ]
                }
            )
        try:
            tx = ledger.payout(payout.user, payout.units, reference=f"payout:{payout.pk}")
        except ledger.InsufficientFunds:
            raise ValidationError({"amount": ["The provider no longer has these credits (plus the fee)."]}) from None
        payout.payout_tx = tx
        payout.status = PayoutStatus.APPROVED
        payout.approved_by = admin
        payout.save(update_fields=["payout_tx", "status", "approved_by", "updated_at"])
        transaction.on_commit(partial(enqueue, "payments.send_payout", str(payout.pk)))
    return payout


def reject_payout(payout_id: UUID, reason: str) -> PayoutRequest:
    """Admin refusal of a waiting request; nothing had moved."""
    with transaction.atomic():
        payout = PayoutRequest.objects.select_for_update().filter(pk=payout_id).first()
        if payout is None or payout.status != PayoutStatus.REQUESTED:
            raise ValidationError({"status": [f"This payout is {payout.status if payout else 'gone'}, not requested."]})
        payout.status = PayoutStatus.REJECTED
        payout.failure_message = reason[:300]
        payout.save(update_fields=["status", "failure_message", "updated_at"])
    return payout


def send_payout(payout_id: UUID | str) -> str:
    """Create the Stripe transfer of an approved payout. Safe to run again: it returns
    at once unless the payout is approved and unsent, and the transfer's idempotency key
    is the payout's id. A refusal restores the credits; a connection error is raised
    (``ProviderError.transient``) for the caller to retry."""
    payout = PayoutRequest.objects.filter(pk=payout_id).first()
    if payout is None or payout.status != PayoutStatus.APPROVED or payout.transfer_id:
        return "skipped"
    try:
        transfer_id = stripe_client.create_transfer(
            payout.amount,
            payout.currency,
            payout.destination,
            {"payout_id": str(payout.pk), "user_id": str(payout.user_id)},
            idempotency_key=f"payout:{payout.pk}",
        )
    except stripe_client.ProviderError as exc:
        if exc.transient:
            raise
        restore_payout(payout.pk, f"Stripe refused the transfer: {exc}")
        return "failed"
    PayoutRequest.objects.filter(pk=payout.pk, status=PayoutStatus.APPROVED).update(
        status=PayoutStatus.PAID, transfer_id=transfer_id
    )
    log.info("payout %s: transfer %s sent", payout.pk, transfer_id)
    return "paid"


def restore_payout(payout_id: UUID, message: str) -> str:
    """Give the credits of a failed or reversed transfer back with a DEPOSIT."""
    with transaction.atomic():
        payout = PayoutRequest.objects.select_for_update().filter(pk=payout_id).first()
        if payout is None or payout.status not in (PayoutStatus.APPROVED, PayoutStatus.PAID):
            return "ignored: not sent"
        tx = ledger.deposit(payout.user, payout.units, reference=f"payout-restore:{payout.pk}")
        payout.restore_tx = tx
        payout.status = PayoutStatus.FAILED
        payout.failure_message = message[:300]
        payout.save(update_fields=["restore_tx", "status", "failure_message", "updated_at"])
    log.warning("payout %s: credits restored (%s)", payout.pk, message)
    return "restored"
