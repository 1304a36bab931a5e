"""``{% payments_panel %}``: buying credits, payments and payouts on the wallet page."""

from __future__ import annotations

from typing import Any

from django import template
from django.conf import settings

from payments import services
from payments.models import Payment, PayoutRequest
from payments.serializers import config_data

register = template.Library()

LISTED = 20


@register.inclusion_tag("payments/_wallet_panel.html", takes_context=True)
def payments_panel(context: dict[str, Any]) -> dict[str, Any]:
    request = context["request"]
    user = request.user
    config = config_data()
    return {
        "request": request,
        "user": user,
        "csrf_token": context.get("csrf_token"),
        "config": config,
        "price": services.price_of(1),
        "stripe_js_url": settings.STRIPE_JS_URL,
        "debug": settings.DEBUG,
        "payments": list(Payment.objects.owned_by(user).select_related("deposit")[:LISTED]),
        "payouts": list(PayoutRequest.objects.owned_by(user).select_related("payout_tx", "restore_tx")[:LISTED]),
        "account": services.connected_account(user),
        "payout_fee": services.payout_fee() if config["connect"] else 0,
    }


@register.filter
def money(amount: int | None, currency: str) -> str:
    """1234, "usd" → "12.34 USD" (two-decimal currencies; Stripe's zero-decimal ones aside)."""
    value = int(amount or 0)
    return f"{value // 100}.{value % 100:02d} {currency.upper()}"
