"""JSON shapes of the payments API. Credits are decimal strings (as everywhere in the
API); money is an integer in the currency's smallest unit."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.conf import settings
from rest_framework import serializers

from config.serializers import StrictInput
from ledger.units import credits_to_units, units_to_credits
from payments.models import ConnectedAccount, Payment, PayoutRequest


class CreditsField(serializers.DecimalField):
    """Credits in, base units out; base units in (to_representation), credits out."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(max_digits=28, decimal_places=9, **kwargs)

    def to_internal_value(self, data: Any) -> int:  # type: ignore[override]
        value = super().to_internal_value(data)
        assert isinstance(value, Decimal)
        return credits_to_units(value)

    def to_representation(self, value: Any) -> Any:
        return super().to_representation(units_to_credits(int(value)))


class PurchaseRequestSerializer(StrictInput, serializers.Serializer[dict[str, Any]]):
    credits = serializers.IntegerField(help_text="Whole credits to buy, within the server's bounds.")
    checkout = serializers.BooleanField(
        default=False, help_text="Pay on Stripe's hosted Checkout page instead of with Stripe.js on ours."
    )


class PaymentSerializer(serializers.ModelSerializer[Payment]):
    credits = CreditsField(source="units", read_only=True)
    reversed_credits = CreditsField(source="reversed_units", read_only=True)
    deposit_tx = serializers.CharField(source="deposit.hash", read_only=True, allow_null=True, default=None)

    class Meta:
        model = Payment
        fields = [
            "id",
            "credits",
            "amount",
            "currency",
            "status",
            "failure_message",
            "payment_intent_id",
            "checkout_session_id",
            "deposit_tx",
            "refunded_amount",
            "disputed_amount",
            "reversed_credits",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields


class PurchaseSerializer(serializers.Serializer[dict[str, Any]]):
    payment = PaymentSerializer()
    client_secret = serializers.CharField(help_text="Hand to Stripe.js confirmCardPayment; empty for Checkout.")
    checkout_url = serializers.CharField(help_text="Stripe Checkout page to send the buyer to; empty otherwise.")
    publishable_key = serializers.CharField()


class PayoutRequestSerializer(StrictInput, serializers.Serializer[dict[str, Any]]):
    amount = CreditsField(help_text="Credits to pay out (at least the server's minimum).")


class PayoutSerializer(serializers.ModelSerializer[PayoutRequest]):
    credits = CreditsField(source="units", read_only=True)
    payout_tx = serializers.CharField(source="payout_tx.hash", read_only=True, allow_null=True, default=None)
    restore_tx = serializers.CharField(source="restore_tx.hash", read_only=True, allow_null=True, default=None)

    class Meta:
        model = PayoutRequest
        fields = [
            "id",
            "credits",
            "amount",
            "currency",
            "status",
            "destination",
            "transfer_id",
            "failure_message",
            "payout_tx",
            "restore_tx",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields


class AccountLinkRequestSerializer(StrictInput, serializers.Serializer[dict[str, Any]]):
    return_url = serializers.URLField(
        required=False, help_text="Where Stripe sends the provider back; defaults to the wallet."
    )


class ConnectedAccountSerializer(serializers.ModelSerializer[ConnectedAccount]):
    class Meta:
        model = ConnectedAccount
        fields = ["account_id", "payouts_enabled", "details_submitted", "created_at"]
        read_only_fields = fields


class AccountLinkSerializer(serializers.Serializer[dict[str, Any]]):
    url = serializers.URLField(help_text="One-time Stripe onboarding URL.")


class ConfigSerializer(serializers.Serializer[dict[str, Any]]):
    enabled = serializers.BooleanField()
    publishable_key = serializers.CharField()
    currency = serializers.CharField()
    credit_price = serializers.IntegerField(help_text="Price of one credit, smallest currency unit.")
    min_credits = serializers.IntegerField()
    max_credits = serializers.IntegerField()
    checkout = serializers.BooleanField()
    connect = serializers.BooleanField()
    payout_min_credits = serializers.IntegerField()


def config_data() -> dict[str, Any]:
    enabled = bool(settings.PAYMENTS_ENABLED)
    return {
        "enabled": enabled,
        "publishable_key": settings.STRIPE_PUBLISHABLE_KEY if enabled else "",
        "currency": settings.STRIPE_CURRENCY,
        "credit_price": settings.CREDIT_PRICE_MINOR,
        "min_credits": settings.PURCHASE_MIN_CREDITS,
        "max_credits": settings.PURCHASE_MAX_CREDITS,
        "checkout": enabled and settings.STRIPE_CHECKOUT,
        "connect": enabled and settings.STRIPE_CONNECT,
        "payout_min_credits": settings.PAYOUT_MIN_CREDITS,
    }
