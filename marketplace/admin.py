"""Admin for the marketplace's models. Tasks change state only through services, so
the admin shows them read-only apart from a cancel action."""

from __future__ import annotations

from axes.admin import AccessAttemptAdmin as AxesAccessAttemptAdmin
from axes.models import AccessAttempt
from django.contrib import admin, messages
from django.contrib.auth.admin import UserAdmin as BaseUserAdmin
from django.db.models import QuerySet
from django.http import HttpRequest

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
    readonly_fields = ("user", "name", "prefix", "token_hash", "created_at", "last_used_at", "revoked_at")
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # tokens are created by their owner, who alone sees the secret

    @admin.action(description="Revoke selected tokens", permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        for token in queryset:
            services.revoke_api_token(token.user, token.pk)
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
class TaskAdmin(admin.ModelAdmin[Task]):
    list_display = ("title", "kind", "owner", "status", "budget_credits", "progress", "created_at")
    list_filter = ("status", "kind")
    search_fields = ("id", "title", "owner__username")
    date_hierarchy = "created_at"
    list_select_related = ("owner",)
    inlines = [TaskEventInline]
    actions = ["cancel"]

    def get_readonly_fields(self, request: HttpRequest, obj: Task | None = None) -> list[str]:
        return [f.name for f in Task._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # tasks are posted through the marketplace, which validates and escrows

    def has_delete_permission(self, request: HttpRequest, obj: Task | None = None) -> bool:
        # A task is a record of money held and paid (its escrow on the ledger, its workers'
        # results) and the source of its inference tasks' models: cancel it instead.
        return False

    @admin.action(description="Cancel selected tasks", permissions=["change"])
    def cancel(self, request: HttpRequest, queryset: QuerySet[Task]) -> None:
        done = 0
        for task in queryset.select_related("owner"):
            try:
                services.cancel_task(task.owner, task.pk)
                done += 1
            except IllegalTransition as exc:
                self.message_user(request, f"{task}: {exc.messages[0]}", level=messages.WARNING)
        self.message_user(request, f"Cancelled {done} task(s).")
