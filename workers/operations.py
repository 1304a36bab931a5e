"""The operations dashboard (``/admin/operations/``, staff only, linked from the admin's
index): the platform's state at a glance, for an operator deciding what to look at.

Each figure is one query, whatever the number of rows (``tests/workers/test_operations.py``
pins the count): tasks waiting per kind, nodes online / busy / free (presence by
``workers.models.online_cutoff``), results awaiting verification, the chain's height, its
pending transactions and the fees of the last 24 hours, and the latest failed tasks and
rejected or expired jobs, each linking to its admin page. Amounts are in credits.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import admin
from django.db.models import Count, Exists, Max, Min, OuterRef, Q, Sum
from django.db.models.functions import Coalesce
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone

from ledger.models import Block, Transaction, TxStatus, TxType
from ledger.units import format_credits
from marketplace.models import Task, TaskStatus
from workers.models import Assignment, Worker, online_cutoff

RECENT_FAILURES = 10
LIVE_JOB = (Assignment.State.OFFERED, Assignment.State.RUNNING)


def figures(now: Any = None) -> dict[str, Any]:
    """Every figure of the page, one query each."""
    now = now or timezone.now()
    since = now - timedelta(hours=24)
    waiting = list(
        Task.objects.filter(status=TaskStatus.OPEN)
        .values("kind")
        .annotate(tasks=Count("pk"), oldest=Min("opened_at"))
        .order_by("kind")
    )
    busy = Exists(Assignment.objects.filter(worker=OuterRef("pk"), state__in=LIVE_JOB))
    online = Q(state=Worker.State.ACTIVE, owner__is_active=True, last_heartbeat_at__gte=online_cutoff(now))
    nodes = Worker.objects.aggregate(
        online=Count("pk", filter=online),
        busy=Count("pk", filter=online & Q(busy)),
        suspended=Count("pk", filter=Q(state=Worker.State.SUSPENDED)),
        held=Count("pk", filter=Q(state=Worker.State.SUSPENDED, held_by_platform=True)),
    )
    nodes["free"] = nodes["online"] - nodes["busy"]
    verification = Assignment.objects.filter(state=Assignment.State.SUBMITTED).aggregate(
        results=Count("pk"), oldest=Min("submitted_at")
    )
    height = Block.objects.aggregate(height=Max("height"), at=Max("timestamp"))
    sealed_today = Q(status=TxStatus.SEALED, block__timestamp__gte=since)
    ledger = Transaction.objects.aggregate(
        pending=Count("pk", filter=Q(status=TxStatus.PENDING)),
        gas=Coalesce(Sum("fee", filter=sealed_today), 0),
        platform=Coalesce(Sum("amount", filter=sealed_today & Q(type=TxType.FEE)), 0),
    )
    failed_tasks = list(
        Task.objects.filter(status=TaskStatus.FAILED)
        .select_related("owner")
        .only("title", "kind", "status_reason", "finished_at", "owner__username")
        .order_by("-finished_at")[:RECENT_FAILURES]
    )
    failed_jobs = list(
        Assignment.objects.filter(state__in=(Assignment.State.REJECTED, Assignment.State.EXPIRED))
        .select_related("task", "worker")
        .only("state", "reason", "settled_at", "task__title", "task__kind", "worker__name")
        .order_by("-settled_at")[:RECENT_FAILURES]
    )
    return {
        "waiting": waiting,
        "waiting_total": sum(row["tasks"] for row in waiting),
        "nodes": nodes,
        "verification": verification,
        "height": height,
        "ledger": {
            **ledger,
            "gas_credits": format_credits(ledger["gas"]),
            "platform_credits": format_credits(ledger["platform"]),
        },
        "failed_tasks": failed_tasks,
        "failed_jobs": failed_jobs,
        "now": now,
    }


def operations(request: HttpRequest) -> HttpResponse:
    """The page; ``admin.site.admin_view`` (in ``urls``) lets in active staff only and sends
    anyone else to the admin's login."""
    context = {**admin.site.each_context(request), "title": "Operations", **figures()}
    return TemplateResponse(request, "admin/operations.html", context)
