"""Admin for provider nodes and their jobs. Rows change only through the services that
keep the ledger and the sockets in step, so every model here is read-only; an operator
suspends, resumes or retires a node with actions that call ``services.set_worker_state``
(its token is refused, its live jobs end and stop on the node, and its socket closes at
once, as when its owner does it, but without the owner's reputation penalty; an
operator's suspension holds until an operator lifts it). The list says which job a busy
node runs. The actions need the worker's
change permission, not just the right to view the list.
Jobs are shown, never edited: their state moves only by the settlement that pays them."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import Prefetch, QuerySet
from django.http import HttpRequest
from rest_framework.exceptions import ValidationError

from ledger.admin import ReadOnlyAdmin
from ledger.units import format_credits
from workers.assignments.control import LIVE_JOB
from workers.identity import services
from workers.models import Assignment, RegistrationToken, Worker


@admin.register(Worker)
class WorkerAdmin(ReadOnlyAdmin):
    list_display = [
        "name",
        "owner",
        "address",
        "state",
        "held_by_platform",
        "online",
        "reputation",
        "jobs_done",
        "earned",
        "benchmark_gflops",
        "last_heartbeat_at",
        "current_job",
    ]
    list_filter = ["state", "held_by_platform"]
    readonly_fields = ["current_job"]
    search_fields = ["name", "address", "owner__username"]
    exclude = ["token_hash"]
    list_select_related = ["owner"]
    actions = ["suspend", "resume", "retire"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Worker]:
        live = Assignment.objects.filter(state__in=LIVE_JOB).select_related("task")
        return super().get_queryset(request).prefetch_related(Prefetch("assignments", live, to_attr="live_jobs"))

    @admin.display(boolean=True)
    def online(self, obj: Worker) -> bool:
        return obj.is_online

    @admin.display(description="current job")
    def current_job(self, obj: Worker) -> str:
        """Which job a busy node runs: task, kind, since when, progress ("—" when idle)."""
        jobs = getattr(obj, "live_jobs", None)
        if jobs is None:
            jobs = list(Assignment.objects.filter(worker=obj, state__in=LIVE_JOB).select_related("task"))
        if not jobs:
            return "—"
        job = jobs[0]
        since = (job.started_at or job.created_at).strftime("%Y-%m-%d %H:%M:%S")
        return f"{job.get_state_display()} {job.task.kind} “{job.task.title}” since {since} UTC, {job.progress:.0f} %"

    @admin.display(description="earnings (credits)")
    def earned(self, obj: Worker) -> str:
        return format_credits(obj.earnings)

    def _set_state(self, request: HttpRequest, queryset: QuerySet[Worker], target: str, verb: str) -> None:
        done = 0
        for worker in queryset.select_related("owner"):
            try:
                services.set_worker_state(worker.owner, worker.pk, target, by_platform=True)
            except ValidationError as exc:
                detail = exc.detail.get("state", exc.detail) if isinstance(exc.detail, dict) else exc.detail
                reason = " ".join(str(m) for m in detail) if isinstance(detail, list) else str(detail)
                self.message_user(request, f"Worker “{worker.name}”: {reason}", messages.WARNING)
            else:
                done += 1
        self.message_user(request, f"{verb} {done} worker(s).")

    @admin.action(
        description="Suspend: refuse the node's token and close its socket (only an operator can resume it)",
        permissions=["manage"],
    )
    def suspend(self, request: HttpRequest, queryset: QuerySet[Worker]) -> None:
        self._set_state(request, queryset, Worker.State.SUSPENDED, "Suspended")

    @admin.action(description="Resume suspended workers (also those their owners suspended)", permissions=["manage"])
    def resume(self, request: HttpRequest, queryset: QuerySet[Worker]) -> None:
        self._set_state(request, queryset, Worker.State.ACTIVE, "Resumed")

    @admin.action(description="Retire: final, the key can never work again", permissions=["manage"])
    def retire(self, request: HttpRequest, queryset: QuerySet[Worker]) -> None:
        self._set_state(request, queryset, Worker.State.RETIRED, "Retired")


@admin.register(Assignment)
class AssignmentAdmin(ReadOnlyAdmin):
    list_display = ["id", "task", "worker", "attempt", "state", "progress", "created_at", "settled_at", "reason"]
    list_filter = ["state", "shortfall", "task__kind"]
    search_fields = ["id", "task__id", "task__title", "worker__name", "worker__address"]
    list_select_related = ["task", "worker"]
    date_hierarchy = "created_at"


@admin.register(RegistrationToken)
class RegistrationTokenAdmin(ReadOnlyAdmin):
    list_display = ["owner", "created_at", "expires_at", "used_at", "worker"]
    search_fields = ["owner__username"]
    list_select_related = ["owner", "worker"]
    exclude = ["token_hash", "challenge"]
