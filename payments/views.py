"""Payment pages: the forms on the wallet post here. Thin: parse, call one service,
redirect back to the wallet with a message. Paying by card happens in the browser
(Stripe.js, static/js/payments.js) through the REST API."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST
from rest_framework.exceptions import APIException, ValidationError

from ledger.units import credits_to_units, format_credits
from payments import services


def _error_text(exc: APIException) -> str:
    detail = exc.detail
    if isinstance(detail, dict):
        return " ".join(
            f"{field}: {' '.join(str(m) for m in (msgs if isinstance(msgs, list) else [msgs]))}"
            for field, msgs in detail.items()
        )
    return str(detail)


@login_required
@require_POST
def buy(request: HttpRequest) -> HttpResponse:
    """Without JavaScript only Stripe Checkout can take a card: redirect there."""
    try:
        credits = int(request.POST.get("credits", ""))
    except ValueError:
        messages.error(request, "credits: A whole number of credits is required.")
        return redirect("wallet")
    if not request.POST.get("checkout"):
        messages.error(request, "Paying by card on this page needs JavaScript; use Stripe Checkout instead.")
        return redirect("wallet")
    wallet = request.build_absolute_uri(reverse("wallet"))
    try:
        purchase = services.start_purchase(
            request.user,
            credits,
            checkout=True,
            success_url=f"{wallet}?checkout=done",
            cancel_url=f"{wallet}?checkout=canceled",
        )
    except APIException as exc:
        messages.error(request, _error_text(exc))
        return redirect("wallet")
    return redirect(purchase.checkout_url)


@login_required
@require_POST
def payout(request: HttpRequest) -> HttpResponse:
    try:
        units = credits_to_units(request.POST.get("amount", "").strip())
    except ValueError as exc:
        messages.error(request, f"amount: {exc}")
        return redirect("wallet")
    try:
        request_ = services.request_payout(request.user, units)
    except (ValidationError, APIException) as exc:
        messages.error(request, _error_text(exc))
        return redirect("wallet")
    messages.success(request, f"Payout of {format_credits(request_.units)} credits requested; an admin approves it.")
    return redirect("wallet")


@login_required
@require_POST
def connect(request: HttpRequest) -> HttpResponse:
    try:
        url = services.link_account(
            request.user,
            refresh_url=request.build_absolute_uri(reverse("wallet")),
            return_url=request.build_absolute_uri(reverse("payments-connect-return")),
        )
    except APIException as exc:
        messages.error(request, _error_text(exc))
        return redirect("wallet")
    return redirect(url)


@login_required
@require_GET
def connect_return(request: HttpRequest) -> HttpResponse:
    try:
        account = services.refresh_account(request.user)
    except APIException as exc:
        messages.error(request, _error_text(exc))
        return redirect("wallet")
    if account is not None and account.payouts_enabled:
        messages.success(request, "Your Stripe account is linked and can receive payouts.")
    elif account is not None:
        messages.info(
            request, "Your Stripe account is linked; Stripe still needs details before it can receive payouts."
        )
    return redirect("wallet")
