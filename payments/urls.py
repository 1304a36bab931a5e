"""Payment pages and Stripe's webhook."""

from __future__ import annotations

from django.urls import path

from payments import views, webhook

urlpatterns = [
    path("payments/stripe/webhook/", webhook.stripe_webhook, name="stripe-webhook"),
    path("payments/buy/", views.buy, name="payments-buy"),
    path("payments/payout/", views.payout, name="payments-payout"),
    path("payments/connect/", views.connect, name="payments-connect"),
    path("payments/connect/return/", views.connect_return, name="payments-connect-return"),
]
