"""Payments REST API: configuration, purchases, the Connect account and payouts.
Thin: parse, call one service, render. A user sees only their own rows."""

from __future__ import annotations

from typing import Any

from django.http import Http404
from django.urls import reverse
from drf_spectacular.utils import extend_schema
from rest_framework import generics, permissions, status
from rest_framework.request import Request
from rest_framework.response import Response

from config.api.viewsets import OwnedRowsMixin
from payments import serializers as s
from payments import services
from payments.models import Payment, PaymentQuerySet, PayoutRequest, PayoutRequestQuerySet


class PaymentsConfig(generics.GenericAPIView[Any]):
    """Whether payments are on, the publishable key, price and bounds."""

    permission_classes = [permissions.AllowAny]
    serializer_class = s.ConfigSerializer

    def get(self, request: Request) -> Response:
        return Response(s.ConfigSerializer(s.config_data()).data)


class PaymentList(OwnedRowsMixin, generics.ListAPIView[Payment]):
    """Your purchases of credits, newest first. POST starts one: a PaymentIntent whose
    client_secret Stripe.js confirms (or a Checkout URL). Credits arrive when Stripe's
    webhook confirms the payment, not before. 503 when payments are not configured."""

    serializer_class = s.PaymentSerializer
    ordering_fields = ["created_at", "amount"]  # one user's rows

    def base_queryset(self) -> PaymentQuerySet:
        return Payment.objects.select_related("deposit")

    @extend_schema(request=s.PurchaseRequestSerializer, responses={201: s.PurchaseSerializer})
    def post(self, request: Request) -> Response:
        form = s.PurchaseRequestSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        wallet = request.build_absolute_uri(reverse("wallet"))
        purchase = services.start_purchase(
            request.user,
            form.validated_data["credits"],
            checkout=form.validated_data["checkout"],
            success_url=f"{wallet}?checkout=done",
            cancel_url=f"{wallet}?checkout=canceled",
        )
        body = {
            "payment": purchase.payment,
            "client_secret": purchase.client_secret,
            "checkout_url": purchase.checkout_url,
            "publishable_key": s.config_data()["publishable_key"],
        }
        return Response(s.PurchaseSerializer(body).data, status=status.HTTP_201_CREATED)


class PaymentDetail(OwnedRowsMixin, generics.RetrieveAPIView[Payment]):
    """One of your purchases and its state."""

    serializer_class = s.PaymentSerializer

    def base_queryset(self) -> PaymentQuerySet:
        return Payment.objects.select_related("deposit")


class ConnectedAccountView(generics.GenericAPIView[Any]):
    """Your Stripe Connect account (404 until linked). POST links one, or returns a fresh
    onboarding URL for the linked one."""

    serializer_class = s.ConnectedAccountSerializer

    def get(self, request: Request) -> Response:
        account = services.connected_account(request.user)
        if account is None:
            raise Http404("No Stripe account is linked.")
        return Response(s.ConnectedAccountSerializer(account).data)

    @extend_schema(request=s.AccountLinkRequestSerializer, responses={201: s.AccountLinkSerializer})
    def post(self, request: Request) -> Response:
        form = s.AccountLinkRequestSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        back = request.build_absolute_uri(reverse("payments-connect-return"))
        url = services.link_account(
            request.user,
            refresh_url=request.build_absolute_uri(reverse("wallet")),
            return_url=form.validated_data.get("return_url") or back,
        )
        return Response({"url": url}, status=status.HTTP_201_CREATED)


class PayoutList(OwnedRowsMixin, generics.ListAPIView[PayoutRequest]):
    """Your payout requests. POST asks for one: at least the minimum, to your linked
    Stripe account, within your balance (plus the PAYOUT fee). An admin approves it."""

    serializer_class = s.PayoutSerializer
    ordering_fields = ["created_at", "amount"]  # one user's rows

    def base_queryset(self) -> PayoutRequestQuerySet:
        return PayoutRequest.objects.select_related("payout_tx", "restore_tx")

    @extend_schema(request=s.PayoutRequestSerializer, responses={201: s.PayoutSerializer})
    def post(self, request: Request) -> Response:
        form = s.PayoutRequestSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        payout = services.request_payout(request.user, form.validated_data["amount"])
        return Response(s.PayoutSerializer(payout).data, status=status.HTTP_201_CREATED)
