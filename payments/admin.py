"""Admin: payments are read-only (the webhook writes them); payout requests are
approved or rejected with admin actions that call the services."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from rest_framework.exceptions import ValidationError

from config.celery import enqueue
from ledger.admin import ReadOnlyAdmin
from ledger.units import format_credits
from payments import services
from payments.models import ConnectedAccount, Payment, PayoutRequest, PayoutStatus, WebhookEvent


@admin.register(Payment)
class PaymentAdmin(ReadOnlyAdmin):
    list_display = ["id", "user", "units", "amount", "currency", "status", "created_at"]
    list_filter = ["status"]
    search_fields = ["id", "user__username", "payment_intent_id", "checkout_session_id", "charge_id"]
    list_select_related = ["user"]


@admin.register(WebhookEvent)
class WebhookEventAdmin(ReadOnlyAdmin):
    list_display = ["event_id", "type", "outcome", "received_at"]
    list_filter = ["type"]
    search_fields = ["event_id", "parked_intent_id"]


@admin.register(ConnectedAccount)
class ConnectedAccountAdmin(ReadOnlyAdmin):
    list_display = ["account_id", "user", "payouts_enabled", "details_submitted", "created_at"]
    search_fields = ["account_id", "user__username"]


def _first_message(exc: ValidationError) -> str:
    detail = exc.detail
    if isinstance(detail, dict):
        return " ".join(str(m) for msgs in detail.values() for m in (msgs if isinstance(msgs, list) else [msgs]))
    return str(detail)


@admin.register(PayoutRequest)
class PayoutRequestAdmin(ReadOnlyAdmin):
    list_display = ["id", "user", "credits", "amount", "currency", "status", "transfer_id", "created_at"]
    list_filter = ["status"]
    search_fields = ["id", "user__username", "transfer_id", "destination"]
    list_select_related = ["user"]
    actions = ["approve", "reject", "retry_sending"]

    @admin.display(description="credits")
    def credits(self, obj: PayoutRequest) -> str:
        return format_credits(obj.units)

    @admin.action(description="Approve: burn the credits (PAYOUT) and send the Stripe transfer", permissions=["manage"])
    def approve(self, request: HttpRequest, queryset: QuerySet[PayoutRequest]) -> None:
        for payout in queryset:
            try:
                services.approve_payout(payout.pk, request.user)
            except ValidationError as exc:
                self.message_user(request, f"Payout {payout.pk}: {_first_message(exc)}", messages.ERROR)
            else:
                self.message_user(request, f"Payout {payout.pk} approved; the transfer is on its way.")

    @admin.action(description="Reject: nothing moves", permissions=["manage"])
    def reject(self, request: HttpRequest, queryset: QuerySet[PayoutRequest]) -> None:
        for payout in queryset:
            try:
                services.reject_payout(payout.pk, f"Rejected by {request.user}.")
            except ValidationError as exc:
                self.message_user(request, f"Payout {payout.pk}: {_first_message(exc)}", messages.ERROR)
            else:
                self.message_user(request, f"Payout {payout.pk} rejected.")

    @admin.action(description="Send again: approved payouts whose transfer has not gone out", permissions=["manage"])
    def retry_sending(self, request: HttpRequest, queryset: QuerySet[PayoutRequest]) -> None:
        for payout in queryset.filter(status=PayoutStatus.APPROVED, transfer_id=""):
            enqueue("payments.send_payout", str(payout.pk))
            self.message_user(request, f"Payout {payout.pk}: sending again.")

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
