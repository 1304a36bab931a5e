"""Admin for the marketplace's models. Tasks change state only through services, so
the admin shows them read-only apart from a cancel action. Actions that change what a
user owns ask for a confirmation and a reason first (``config.admin_actions``)."""

from __future__ import annotations

from axes.admin import AccessAttemptAdmin as AxesAccessAttemptAdmin
from axes.models import AccessAttempt
from django.contrib import admin, messages
from django.contrib.auth.admin import UserAdmin as BaseUserAdmin
from django.db.models import QuerySet
from django.http import HttpRequest

from config.admin_actions import log_reason, reasoned_action
from ledger.admin import AmountsAdminMixin
from marketplace import services
from marketplace.models import ApiToken, Dataset, IllegalTransition, Task, TaskEvent, User


@admin.register(User)
class UserAdmin(BaseUserAdmin):
    list_display = ("username", "email", "is_staff", "is_active", "date_joined")


@admin.register(AccessAttempt)
class AccessAttemptAdmin(AxesAccessAttemptAdmin):
    """Failed logins that count toward a lock (django-axes, docs/pages.md): deleting a row
    lifts its part of a lock. Its clean-up action needs the delete permission, as deleting
    does; staff who may only view are offered none."""

    @admin.action(description="Clean up expired attempts", permissions=["delete"])
    def cleanup_expired_attempts(self, request: HttpRequest, queryset: QuerySet[AccessAttempt]) -> None:
        super().cleanup_expired_attempts(request, queryset)


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin[ApiToken]):
    list_display = ("name", "user", "prefix", "created_at", "last_used_at", "revoked_at")
    list_filter = ("revoked_at",)
    search_fields = ("name", "prefix", "user__username")
    readonly_fields = (
        "user",
        "name",
        "prefix",
        "token_hash",
        "created_at",
        "last_used_at",
        "revoked_at",
        "revoked_reason",
    )
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # tokens are created by their owner, who alone sees the secret

    @reasoned_action(
        "Revoke selected tokens",
        permissions=["change"],
        consequence="Programs using these tokens are refused from now on; their owners must make new ones.",
    )
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken], reason: str) -> None:
        for token in queryset.select_related("user"):
            services.revoke_api_token(token.user, token.pk, operator_reason=reason)
            log_reason(self, request, token, "Revoked", reason)
        self.message_user(request, f"Revoked {queryset.count()} token(s).")


@admin.register(Dataset)
class DatasetAdmin(admin.ModelAdmin[Dataset]):
    list_display = ("name", "owner", "format", "size_bytes", "created_at")
    list_filter = ("format",)
    search_fields = ("name", "sha256", "owner__username")
    readonly_fields = ("id", "owner", "file", "format", "size_bytes", "sha256", "created_at")


class TaskEventInline(admin.TabularInline[TaskEvent, Task]):
    model = TaskEvent
    extra = 0
    can_delete = False
    readonly_fields = ("at", "status", "message")

    def has_add_permission(self, request: HttpRequest, obj: Task | None = None) -> bool:
        return False


@admin.register(Task)
class TaskAdmin(AmountsAdminMixin, admin.ModelAdmin[Task]):
    in_credits = ("budget", "price_estimate", "bid")
    list_display = ("title", "kind", "owner", "status", "budget_credits", "progress", "created_at")
    list_filter = ("status", "kind")
    search_fields = ("id", "title", "owner__username")
    date_hierarchy = "created_at"
    list_select_related = ("owner",)
    inlines = [TaskEventInline]
    actions = ["cancel"]
    readonly_fields = [f.name for f in Task._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # tasks are posted through the marketplace, which validates and escrows

    def has_delete_permission(self, request: HttpRequest, obj: Task | None = None) -> bool:
        # A task is a record of money held and paid (its escrow on the ledger, its workers'
        # results) and the source of its inference tasks' models: cancel it instead.
        return False

    @reasoned_action(
        "Cancel selected tasks",
        permissions=["change"],
        consequence=(
            "Each task ends, its jobs stop on their nodes and its escrow goes back to its requester, who reads "
            "“Cancelled by an operator:” and your reason on the task's page. A task whose result is being "
            "verified, or that has ended, is left as it is."
        ),
    )
    def cancel(self, request: HttpRequest, queryset: QuerySet[Task], reason: str) -> None:
        done = 0
        for task in queryset:
            try:
                services.cancel_task_as_operator(task.pk, reason)
            except IllegalTransition as exc:
                self.message_user(request, f"{task}: {exc.messages[0]}", level=messages.WARNING)
            else:
                log_reason(self, request, task, "Cancelled", reason)
                done += 1
        self.message_user(request, f"Cancelled {done} task(s).")
