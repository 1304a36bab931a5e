"""Admin for provider nodes and their jobs. Rows change only through the services that
keep the ledger and the sockets in step, so every model here is read-only; an operator
suspends, resumes or retires a node with actions that call ``services.set_worker_state``
(its token is refused, its live jobs end and stop on the node, and its socket closes at
once, as when its owner does it, but without the owner's reputation penalty; an
operator's suspension holds until an operator lifts it). Each asks for a confirmation and
a reason first (``config.admin_actions``); the node's owner reads the reason on the node's
page. The list says which job a busy node runs. The actions need the worker's change
permission, not just the right to view the list.
Jobs are shown, never edited: their state moves only by the settlement that pays them."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import Prefetch, QuerySet
from django.http import HttpRequest
from django.utils import timezone
from rest_framework.exceptions import ValidationError

from config.admin_actions import log_reason, reasoned_action
from ledger.admin import ReadOnlyAdmin
from workers.assignments.control import LIVE_JOB
from workers.identity import services
from workers.models import Assignment, RegistrationToken, VerificationJob, Worker
from workers.views import ago


@admin.register(Worker)
class WorkerAdmin(ReadOnlyAdmin):
    in_credits = ("earnings",)
    shortened = ("address", "public_key")
    list_display = [
        "name",
        "owner",
        "address_short",
        "status",
        "rep",
        "jobs",
        "earnings_credits",
        "gflops",
        "last_heard",
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

    @admin.display(description="status", ordering="state")
    def status(self, obj: Worker) -> str:
        """State and presence in one column: "online", "offline", "suspended by operators"."""
        if obj.state == Worker.State.SUSPENDED and obj.held_by_platform:
            return "suspended by operators"
        return obj.status()

    @admin.display(description="heard", ordering="last_heartbeat_at")
    def last_heard(self, obj: Worker) -> str:
        return "never" if obj.last_heartbeat_at is None else ago(obj.last_heartbeat_at, timezone.now())

    @admin.display(description="rep.", ordering="reputation")
    def rep(self, obj: Worker) -> int:
        return obj.reputation

    @admin.display(description="jobs", ordering="jobs_done")
    def jobs(self, obj: Worker) -> int:
        return obj.jobs_done

    @admin.display(description="GFLOP/s", ordering="benchmark_gflops")
    def gflops(self, obj: Worker) -> str:
        return "—" if obj.benchmark_gflops is None else f"{obj.benchmark_gflops:.1f}"

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

    def _set_state(self, request: HttpRequest, queryset: QuerySet[Worker], target: str, verb: str, reason: str) -> None:
        done = 0
        for worker in queryset.select_related("owner"):
            try:
                services.set_worker_state(worker.owner, worker.pk, target, by_platform=True, reason=reason)
            except ValidationError as exc:
                detail = exc.detail.get("state", exc.detail) if isinstance(exc.detail, dict) else exc.detail
                refusal = " ".join(str(m) for m in detail) if isinstance(detail, list) else str(detail)
                self.message_user(request, f"Worker “{worker.name}”: {refusal}", messages.WARNING)
            else:
                log_reason(self, request, worker, verb, reason)
                done += 1
        self.message_user(request, f"{verb} {done} worker(s).")

    @reasoned_action(
        "Suspend selected workers (only an operator resumes them)",
        permissions=["manage"],
        consequence=(
            "Each node's token is refused and its socket closed at once; its running job ends without a penalty "
            "and goes to another node. Its owner cannot resume it; they read your reason on the node's page."
        ),
    )
    def suspend(self, request: HttpRequest, queryset: QuerySet[Worker], reason: str) -> None:
        self._set_state(request, queryset, Worker.State.SUSPENDED, "Suspended", reason)

    @reasoned_action(
        "Resume selected suspended workers",
        permissions=["manage"],
        consequence="Each suspended node's token works again and it is offered jobs; its owner reads your reason.",
    )
    def resume(self, request: HttpRequest, queryset: QuerySet[Worker], reason: str) -> None:
        self._set_state(request, queryset, Worker.State.ACTIVE, "Resumed", reason)

    @reasoned_action(
        "Retire selected workers (final)",
        permissions=["manage"],
        consequence=(
            "Final: each node's token and key stop working for good, and earnings left at its address can no "
            "longer be swept. Its owner reads your reason on the node's page."
        ),
    )
    def retire(self, request: HttpRequest, queryset: QuerySet[Worker], reason: str) -> None:
        self._set_state(request, queryset, Worker.State.RETIRED, "Retired", reason)


@admin.register(Assignment)
class AssignmentAdmin(ReadOnlyAdmin):
    list_display = ["id", "task", "worker", "attempt", "state", "progress", "created_at", "settled_at", "reason"]
    list_filter = ["state", "shortfall", "task__kind"]
    search_fields = ["id", "task__id", "task__title", "worker__name", "worker__address"]
    list_select_related = ["task", "worker"]
    date_hierarchy = "created_at"


@admin.register(VerificationJob)
class VerificationJobAdmin(ReadOnlyAdmin):
    """Delegated re-executions: who verified which result, and how its answer was judged."""

    list_display = ["id", "assignment", "verifier", "state", "outcome", "created_at", "answered_at", "reason"]
    list_filter = ["state", "outcome"]
    search_fields = ["id", "assignment__id", "verifier__name", "verifier__address"]
    list_select_related = ["assignment", "verifier"]


@admin.register(RegistrationToken)
class RegistrationTokenAdmin(ReadOnlyAdmin):
    list_display = ["owner", "created_at", "expires_at", "used_at", "worker"]
    search_fields = ["owner__username"]
    list_select_related = ["owner", "worker"]
    exclude = ["token_hash", "challenge"]
