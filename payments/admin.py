"""Admin: payments are read-only (the webhook writes them); payout requests are
approved or rejected with admin actions that call the services, each after a confirmation
page that asks for a reason (``config.admin_actions``): a rejection's reason is what the
provider reads on their wallet."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from rest_framework.exceptions import ValidationError

from config.admin_actions import log_reason, reasoned_action
from config.celery import enqueue
from ledger.admin import ReadOnlyAdmin
from payments import services
from payments.models import ConnectedAccount, Payment, PayoutRequest, PayoutStatus, WebhookEvent


@admin.register(Payment)
class PaymentAdmin(ReadOnlyAdmin):
    in_credits = ("units", "reversed_units", "shortfall_units", "dispute_reversed_units", "dispute_shortfall_units")
    list_display = ["id", "user", "units_credits", "amount", "currency", "status", "created_at"]
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
    in_credits = ("units",)
    list_display = ["id", "user", "units_credits", "amount", "currency", "status", "transfer_id", "created_at"]
    list_filter = ["status"]
    search_fields = ["id", "user__username", "transfer_id", "destination"]
    list_select_related = ["user"]
    actions = ["approve", "reject", "retry_sending"]

    @reasoned_action(
        "Approve selected payouts (burn the credits, send the transfer)",
        permissions=["manage"],
        consequence="Each payout's credits are burnt from its provider's wallet and the transfer goes to their bank.",
    )
    def approve(self, request: HttpRequest, queryset: QuerySet[PayoutRequest], reason: str) -> None:
        for payout in queryset:
            try:
                services.approve_payout(payout.pk, request.user)
            except ValidationError as exc:
                self.message_user(request, f"Payout {payout.pk}: {_first_message(exc)}", messages.ERROR)
            else:
                log_reason(self, request, payout, "Approved", reason)
                self.message_user(request, f"Payout {payout.pk} approved; the transfer is on its way.")

    @reasoned_action(
        "Reject selected payouts (nothing moves)",
        permissions=["manage"],
        consequence="Nothing moves; each provider reads “Rejected by an operator:” and your reason on their wallet.",
    )
    def reject(self, request: HttpRequest, queryset: QuerySet[PayoutRequest], reason: str) -> None:
        for payout in queryset:
            try:
                services.reject_payout(payout.pk, f"Rejected by an operator: {reason}")
            except ValidationError as exc:
                self.message_user(request, f"Payout {payout.pk}: {_first_message(exc)}", messages.ERROR)
            else:
                log_reason(self, request, payout, "Rejected", reason)
                self.message_user(request, f"Payout {payout.pk} rejected.")

    @admin.action(description="Send again approved payouts whose transfer has not gone out", permissions=["manage"])
    def retry_sending(self, request: HttpRequest, queryset: QuerySet[PayoutRequest]) -> None:
        for payout in queryset.filter(status=PayoutStatus.APPROVED, transfer_id=""):
            enqueue("payments.send_payout", str(payout.pk))
            self.message_user(request, f"Payout {payout.pk}: sending again.")

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
