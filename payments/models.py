"""Stripe on the way in (payments that buy credits) and on the way out (payouts).

The ledger is the book of record; these rows remember what Stripe was asked and what it
answered, so a webhook can be checked against what was created and every step shows on
the wallet. Amounts: ``amount`` in the currency's smallest unit (cents), ``units`` in
ledger base units (1 credit = 10^9).
"""

from __future__ import annotations

import uuid
from typing import ClassVar

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from config.owned import OwnedQuerySet


class PaymentStatus(models.TextChoices):
    CREATED = "created", "Awaiting payment"
    FAILED = "failed", "Failed"
    CANCELED = "canceled", "Canceled"
    SUCCEEDED = "succeeded", "Credited"
    REFUNDED = "refunded", "Refunded"
    DISPUTED = "disputed", "Disputed"


class PaymentQuerySet(OwnedQuerySet["Payment"]):
    owner_field = "user"


class Payment(models.Model):
    """One purchase of credits: a Stripe PaymentIntent (or Checkout Session) and, once
    the webhook confirms it, the DEPOSIT that credited it. Refunds and a dispute burn
    credits again with REVERSALs (``reversed_units``); what they could not burn, escrowed
    or spent already, is ``shortfall_units`` and becomes the account's debt (the ledger's
    ``Account.owed``, paid by credits arriving later); a dispute won gives its part back."""

    Status = PaymentStatus

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="payments")
    units = models.BigIntegerField(help_text="Credits bought, base units.")
    amount = models.BigIntegerField(help_text="Price charged, smallest currency unit.")
    currency = models.CharField(max_length=3)
    status = models.CharField(max_length=12, choices=PaymentStatus.choices, default=PaymentStatus.CREATED)
    # Unique when present; NULL (not "") when absent so that NULLs never collide.
    payment_intent_id = models.CharField(max_length=255, null=True, blank=True, unique=True)
    checkout_session_id = models.CharField(max_length=255, null=True, blank=True, unique=True)
    charge_id = models.CharField(max_length=255, blank=True, db_index=True)
    failure_message = models.CharField(max_length=300, blank=True)
    deposit = models.ForeignKey("ledger.Transaction", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    refunded_amount = models.BigIntegerField(default=0, help_text="Refunded so far, smallest currency unit.")
    disputed_amount = models.BigIntegerField(default=0, help_text="Disputed and not won back, smallest currency unit.")
    # Stripe allows one dispute per charge. Recorded even before the payment is credited
    # (events come in any order): crediting then burns what it claims at once.
    dispute_id = models.CharField(max_length=255, blank=True)
    dispute_status = models.CharField(max_length=30, blank=True, help_text="The dispute's status, as Stripe last said.")
    dispute_reversed_units = models.BigIntegerField(
        default=0, help_text="Of reversed_units, those the dispute burnt: given back if it is won."
    )
    dispute_shortfall_units = models.BigIntegerField(
        default=0, help_text="Of shortfall_units, those the dispute could not burn: forgotten if it is won."
    )
    reversed_units = models.BigIntegerField(default=0, help_text="Credits burnt by REVERSAL transactions.")
    shortfall_units = models.BigIntegerField(
        default=0, help_text="Credits that should have been reversed but had already been spent."
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    objects: ClassVar[PaymentQuerySet] = PaymentQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(condition=Q(units__gt=0) & Q(amount__gt=0), name="payments_payment_positive"),
        ]

    def __str__(self) -> str:
        return f"payment {self.id} ({self.status})"


class CustomerQuerySet(OwnedQuerySet["Customer"]):
    owner_field = "user"


class Customer(models.Model):
    """The Stripe Customer a user's payments are made as (receipts, Stripe's dashboard)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="stripe_customer")
    customer_id = models.CharField(max_length=255, unique=True)
    created_at = models.DateTimeField(default=timezone.now)

    objects: ClassVar[CustomerQuerySet] = CustomerQuerySet.as_manager()  # type: ignore[assignment]

    def __str__(self) -> str:
        return f"{self.customer_id} of {self.user}"


class WebhookEvent(models.Model):
    """A Stripe event that was processed. Recorded in the same database transaction as
    its effect, so a redelivered event finds its id here and changes nothing.

    A refund or dispute of a PaymentIntent no payment knows yet (a Checkout payment
    learns its intent from checkout.session.completed, which Stripe may send later) is
    parked: its object is kept here until that completion replays it, or is dropped
    once it has waited ``webhook.PARK_FOR``."""

    event_id = models.CharField(max_length=255, unique=True)
    type = models.CharField(max_length=100)
    outcome = models.CharField(max_length=300, blank=True)
    received_at = models.DateTimeField(default=timezone.now)
    parked_intent_id = models.CharField(
        max_length=255, blank=True, help_text="The PaymentIntent a parked event waits for; empty once applied."
    )
    parked_object = models.JSONField(
        null=True,
        blank=True,
        help_text="The fields of the parked event's data.object that its handler reads, as checked on receipt.",
    )

    class Meta:
        ordering = ["-received_at"]
        indexes = [
            models.Index(
                fields=["parked_intent_id", "received_at"],
                condition=~Q(parked_intent_id=""),
                name="payments_webhook_parked",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.type} {self.event_id}"


class ConnectedAccountQuerySet(OwnedQuerySet["ConnectedAccount"]):
    owner_field = "user"


class ConnectedAccount(models.Model):
    """A provider's Stripe Connect account, where payouts are transferred."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="stripe_account")
    account_id = models.CharField(max_length=255, unique=True)
    payouts_enabled = models.BooleanField(default=False)
    details_submitted = models.BooleanField(default=False)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    objects: ClassVar[ConnectedAccountQuerySet] = ConnectedAccountQuerySet.as_manager()  # type: ignore[assignment]

    def __str__(self) -> str:
        return f"{self.account_id} of {self.user}"


class PayoutStatus(models.TextChoices):
    REQUESTED = "requested", "Requested"
    APPROVED = "approved", "Approved, sending"
    PAID = "paid", "Paid"
    FAILED = "failed", "Failed, credits restored"
    REJECTED = "rejected", "Rejected"


class PayoutRequestQuerySet(OwnedQuerySet["PayoutRequest"]):
    owner_field = "user"


class PayoutRequest(models.Model):
    """A provider's request to turn credits into money: requested by the provider,
    approved by an admin (PAYOUT burns the credits), then a Stripe transfer; a failed
    transfer restores the credits with a DEPOSIT."""

    Status = PayoutStatus

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="payout_requests")
    units = models.BigIntegerField(help_text="Credits paid out, base units.")
    amount = models.BigIntegerField(help_text="Money transferred, smallest currency unit.")
    currency = models.CharField(max_length=3)
    status = models.CharField(max_length=12, choices=PayoutStatus.choices, default=PayoutStatus.REQUESTED)
    destination = models.CharField(max_length=255, help_text="Stripe account id the transfer goes to.")
    transfer_id = models.CharField(max_length=255, blank=True, db_index=True)
    failure_message = models.CharField(max_length=300, blank=True)
    payout_tx = models.ForeignKey(
        "ledger.Transaction", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    restore_tx = models.ForeignKey(
        "ledger.Transaction", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    approved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    objects: ClassVar[PayoutRequestQuerySet] = PayoutRequestQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(condition=Q(units__gt=0) & Q(amount__gt=0), name="payments_payout_positive"),
        ]

    def __str__(self) -> str:
        return f"payout {self.id} ({self.status})"
