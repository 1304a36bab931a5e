from __future__ import annotations

from django.urls import path

from payments import api

urlpatterns = [
    path("config/", api.PaymentsConfig.as_view(), name="payments-config"),
    path("", api.PaymentList.as_view(), name="payments"),
    path("account/", api.ConnectedAccountView.as_view(), name="payments-account"),
    path("payouts/", api.PayoutList.as_view(), name="payments-payouts"),
    path("<uuid:pk>/", api.PaymentDetail.as_view(), name="payment"),
]
