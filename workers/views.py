"""Provider pages: register a node, my workers, one worker, and a task's live state as JSON.

Every view is login-protected and reads workers through ``Worker.objects.owned_by``:
another user's worker is a 404.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Count, OuterRef, Q, QuerySet, Subquery, Sum
from django.db.models.functions import Coalesce
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST
from rest_framework.exceptions import APIException, NotFound, PermissionDenied, Throttled, ValidationError

from ledger.models import Account, Transaction, TxStatus
from ledger.units import credits_to_units, format_credits
from marketplace import formnonce
from marketplace.errors import error_text
from marketplace.models import Task, User
from workers.assignments import supply, sweep
from workers.forms import AskForm
from workers.identity import services
from workers.live import log as job_log
from workers.live.task_page import task_live_state
from workers.market import asks as market_asks
from workers.market import offers
from workers.models import Assignment, Worker

RECENT_ASSIGNMENTS = 20
# The page's buttons name verbs; the service takes the state they lead to.
ACTIONS: dict[str, str] = {
    "suspend": Worker.State.SUSPENDED,
    "resume": Worker.State.ACTIVE,
    "retire": Worker.State.RETIRED,
}
ACTION_DONE = {"suspend": "suspended", "resume": "resumed", "retire": "retired"}
LIVE_STATES = (Assignment.State.OFFERED, Assignment.State.RUNNING)
REGISTRATION_FORM = "registration-token"
# How the pages tell a provider to run the agent: the project is not installed as a
# package, so ``workers`` imports only with the checkout's root as the working folder,
# and its dependencies are in the checkout's .venv (``make install``).
AGENT = ".venv/bin/python -m workers.agent"


def current_user(request: HttpRequest) -> User:
    """The signed-in user; only for views behind login_required.

    Not marketplace.views.common's: the task page imports this module, and importing
    the marketplace views package from here would make that import circular.
    """
    user = request.user
    assert isinstance(user, User), "view must be behind login_required"
    return user


def broker_argument() -> str:
    """What ``run`` needs to be told about the broker on this platform: nothing with a
    node broker (registration gave the node its own login), else the folder of the
    filesystem broker its node queues are on (the node must run on this machine)."""
    if settings.NODE_BROKER_URL:
        return ""
    folder = Path(settings.NODE_QUEUE_DIR).resolve()
    return f" --broker filesystem:// --broker-folder {folder}"


def capability_rows(caps: Any) -> list[tuple[str, str]]:
    """Human rows for a worker's reported capabilities; absent fields are left out."""
    if not isinstance(caps, dict):
        return []
    rows: list[tuple[str, str]] = []
    if caps.get("cpu_cores"):
        rows.append(("CPU", f"{caps['cpu_cores']} cores"))
    if caps.get("ram_bytes"):
        rows.append(("RAM", _gib(caps["ram_bytes"])))
    if caps.get("gpu_name"):
        memory = f" ({_gib(caps['gpu_memory_bytes'])})" if caps.get("gpu_memory_bytes") else ""
        rows.append(("GPU", f"{caps['gpu_name']}{memory}"))
    else:
        rows.append(("GPU", "none"))
    if caps.get("cuda_version"):
        rows.append(("CUDA", str(caps["cuda_version"])))
    if caps.get("kinds"):
        rows.append(("Kinds", ", ".join(str(k) for k in caps["kinds"])))
    if caps.get("features"):
        rows.append(("Features", ", ".join(str(f) for f in caps["features"])))
    if caps.get("agent_version"):
        rows.append(("Agent", str(caps["agent_version"])))
    return rows


def _gib(value: Any) -> str:
    try:
        return f"{int(value) / 2**30:.1f} GiB"
    except (TypeError, ValueError):
        return "?"


def ago(when: datetime, now: datetime) -> str:
    """A short age: "45 s ago", "5 min ago", "3 h ago", "2 days ago"."""
    seconds = max(0, int((now - when).total_seconds()))
    if seconds < 60:
        return f"{seconds} s ago"
    if seconds < 3600:
        return f"{seconds // 60} min ago"
    if seconds < 48 * 3600:
        return f"{seconds // 3600} h ago"
    return f"{seconds // 86400} days ago"


def presence(worker: Worker, now: datetime | None = None) -> str:
    """The line under a worker's status badge. Online or offline is ``Worker.is_online``'s
    rule (``workers.models.online_cutoff``), so an offline node never reads "just now":
    "heartbeat just now" (online, under 10 s), "heartbeat 12 s ago" (online), "last
    heartbeat 5 min ago" (offline), "no heartbeat yet"; a suspended or retired node says
    who stopped it and why when it was not its owner's plain choice."""
    if worker.state != Worker.State.ACTIVE and worker.state_reason:
        return worker.state_reason
    when = worker.last_heartbeat_at
    if when is None:
        return "no heartbeat yet"
    now = now or timezone.now()
    if worker.is_online:
        return "heartbeat just now" if now - when < timedelta(seconds=10) else f"heartbeat {ago(when, now)}"
    return f"last heartbeat {ago(when, now)}"


def _worker_row(worker: Worker, unswept: int) -> dict[str, Any]:
    """A worker as its pages show it; ``unswept`` is the balance at its address, which
    the retire button's confirmation names (a retired worker can no longer sweep it)."""
    busy = bool(getattr(worker, "live_assignments", 0))
    return {
        "worker": worker,
        "status": worker.status(busy),
        "presence": presence(worker),
        "capabilities": capability_rows(worker.capabilities),
        "earnings": format_credits(worker.earnings),
        "actions": _actions_for(worker),
        "unswept": unswept,
        # The sweep's fee comes out of the balance: a balance under it cannot be swept.
        "sweepable": unswept > sweep.sweep_fee(),
    }


def _actions_for(worker: Worker) -> list[str]:
    if worker.state == Worker.State.ACTIVE:
        return ["suspend", "retire"]
    if worker.state == Worker.State.SUSPENDED:
        return ["retire"] if worker.held_by_platform else ["resume", "retire"]
    return []


@login_required
def start(request: HttpRequest) -> HttpResponse:
    """Where a login lands (``LOGIN_REDIRECT_URL``) when it names no ``next``: My workers
    for a provider who runs nodes and has posted no task, My tasks for everyone else."""
    user = current_user(request)
    provider_only = Worker.objects.owned_by(user).exists() and not Task.objects.owned_by(user).exists()
    return redirect("my-workers" if provider_only else "my-tasks")


@never_cache
@login_required
def register(request: HttpRequest) -> HttpResponse:
    """Create a one-time registration token (POST) and show it, with the node's commands, once.

    Once per rendering of the form (its nonce): a reload of that response, a double-click
    or a resubmitted old form creates nothing and goes back to the page, saying why.
    """
    ttl_minutes = settings.WORKER_REGISTRATION_TTL // 60
    context: dict[str, Any] = {
        "ttl_minutes": ttl_minutes,
        "server_url": request.build_absolute_uri("/").rstrip("/"),
        "broker": broker_argument(),
        "agent": AGENT,
    }
    if request.method == "POST":
        submitted = formnonce.consume(request, REGISTRATION_FORM)
        if submitted is not formnonce.Nonce.FRESH:
            already_created = (
                "This form was already submitted: the registration token was shown once and is not "
                "shown again. If you did not copy it, create another; registration tokens expire "
                f"after {ttl_minutes} minutes unused."
            )
            return formnonce.refuse(request, submitted, "worker-register-page", already_created)
        # The raw token lives only in this response.
        try:
            token, raw = services.create_registration_token(current_user(request))
        except (PermissionDenied, Throttled) as exc:
            formnonce.release(request, REGISTRATION_FORM)
            context["refusal"] = str(exc.detail)
        else:
            context.update({"raw_token": raw, "token": token})
    if "raw_token" not in context:
        context["form_nonce"] = formnonce.issue(request, REGISTRATION_FORM)
    return render(request, "workers/register.html", context)


@login_required
def my_workers(request: HttpRequest) -> HttpResponse:
    """The provider's workers, with status, capabilities, benchmark and earnings."""
    balance = Account.objects.filter(address=OuterRef("address")).values("available")[:1]
    owned: QuerySet[Worker] = Worker.objects.owned_by(current_user(request))
    workers = owned.annotate(
        live_assignments=Count("assignments", filter=Q(assignments__state__in=LIVE_STATES)),
        unswept=Coalesce(Subquery(balance), 0),
    )
    rows = [_worker_row(worker, worker.unswept) for worker in workers]
    return render(request, "workers/my_workers.html", {"rows": rows})


def current_job(worker: Worker) -> Assignment | None:
    """The job the worker holds now (offered or running; a node runs one at a time), its task loaded."""
    return Assignment.objects.filter(worker=worker, state__in=LIVE_STATES).select_related("task").first()


@login_required
def worker_detail(request: HttpRequest, pk: UUID) -> HttpResponse:
    """One of the provider's workers, its recent assignments, its asks per kind (a form
    each, POSTed here), and its unswept earnings with the command that sweeps them into the
    provider's wallet."""
    worker = get_object_or_404(Worker.objects.owned_by(current_user(request)), pk=pk)
    bound: dict[str, AskForm] = {}
    if request.method == "POST":
        done = _post_ask(request, worker, bound)
        if done is not None:
            return done
    assignments = list(
        Assignment.objects.filter(worker=worker).select_related("task").order_by("-created_at")[:RECENT_ASSIGNMENTS]
    )
    sweep_state = sweep.sweep_state(worker)
    row = _worker_row(worker, sweep_state.balance)
    # Rewards are paid gross; the node pays the gas of its results and sweeps from them.
    row["gas_paid"] = (
        Transaction.objects.filter(sender=worker.address)
        .exclude(status=TxStatus.REFUSED)
        .aggregate(total=Coalesce(Sum("fee"), 0))["total"]
    )
    row["status"] = worker.status(busy=any(a.state in LIVE_STATES for a in assignments))
    server_url = request.build_absolute_uri("/").rstrip("/")
    context = {
        "row": row,
        "current": current_job(worker),
        "assignments": assignments,
        "status": row["status"],
        "sweep": sweep_state,
        "demand": supply.demand(worker) if worker.state != Worker.State.RETIRED else None,
        "sweep_command": f"{AGENT} --key worker.pem sweep --server {server_url}",
        "asks": _ask_rows(worker, bound) if worker.state != Worker.State.RETIRED else [],
    }
    return render(request, "workers/worker_detail.html", context, status=400 if bound else 200)


def _ask_form(kind: str, data: Any = None, initial: dict[str, str] | None = None) -> AskForm:
    return AskForm(data, prefix=f"ask-{kind}", initial=initial)


def _ask_rows(worker: Worker, bound: dict[str, AskForm]) -> list[dict[str, Any]]:
    """Each offered kind's ask and its form: the one just refused, or one holding the ask now."""
    rows = []
    for offer in offers.kind_asks(worker):
        initial = {"per_tflop": format_credits(offer.ask.per_tflop), "minimum": format_credits(offer.ask.minimum)}
        rows.append({"offer": offer, "form": bound.get(offer.kind) or _ask_form(offer.kind, initial=initial)})
    return rows


def _post_ask(request: HttpRequest, worker: Worker, bound: dict[str, AskForm]) -> HttpResponse | None:
    """Set or clear the ask the POST names: a redirect when done, None to show the form's
    errors (in ``bound``)."""
    kind = request.POST.get("ask_kind", "")
    if kind not in offers.offered_kinds(worker):
        messages.error(request, "This worker does not offer that kind of task; nothing changed.")
        return redirect("worker-detail", pk=worker.pk)
    if worker.state == Worker.State.RETIRED:
        messages.error(request, "A retired worker takes no jobs: its prices cannot change.")
        return redirect("worker-detail", pk=worker.pk)
    if request.POST.get("ask_action") == "clear":
        market_asks.clear_ask(worker, kind)
        messages.success(request, f"{kind}: back to the platform's reference price.")
        return redirect("worker-detail", pk=worker.pk)
    form = _ask_form(kind, request.POST)
    if form.is_valid():
        data = form.cleaned_data
        try:
            market_asks.set_ask(worker, kind, credits_to_units(data["per_tflop"]), credits_to_units(data["minimum"]))
        except ValidationError as exc:
            form.add_service_errors(exc.detail)
        else:
            messages.success(request, f"{kind}: ask set.")
            return redirect(f"{reverse('worker-detail', args=[worker.pk])}#ask-{kind}")
    bound[kind] = form
    return None


@login_required
@require_POST
def worker_action(request: HttpRequest, pk: UUID, action: str) -> HttpResponse:
    """Suspend, resume or retire: the service decides; a refused transition is a message."""
    target = ACTIONS.get(action)
    if target is None:
        raise Http404("No such action.")
    try:
        worker = services.set_worker_state(current_user(request), pk, target)
    except NotFound:
        raise Http404("No such worker.") from None
    except APIException as exc:
        messages.error(request, error_text(exc.detail))
    else:
        messages.success(request, f"Worker “{worker.name}” {ACTION_DONE[action]}.")
    next_url = request.POST.get("next")
    if next_url == "detail":
        return redirect("worker-detail", pk=pk)
    return redirect("my-workers")


@login_required
def task_live(request: HttpRequest, pk: UUID) -> JsonResponse:
    """``live.json``: the task's assignments' progress, history and log tail, for its owner only."""
    user: User = current_user(request)
    task = get_object_or_404(Task.objects.owned_by(user), pk=pk)
    return JsonResponse(task_live_state(task))


def _count(request: HttpRequest, name: str, default: int, high: int) -> int:
    """The query parameter ``name`` as an integer in [0, high]; ValueError(name, why) if not."""
    raw = request.GET.get(name)
    if raw is None or raw == "":
        return default
    # ASCII digits only, and no more of them than ``high`` has: str.isdigit also takes "²"
    # and other scripts' digits, which int() refuses or reads, and int() refuses a
    # number past 4,300 digits.
    if not (raw.isascii() and raw.isdigit() and len(raw) <= len(str(high))) or int(raw) > high:
        raise ValueError(name, f"{name} must be a whole number from 0 to {high}.")
    return int(raw)


@never_cache
@login_required
def task_log(request: HttpRequest, pk: UUID) -> JsonResponse:
    """``log.json?assignment=<id>&after=<n>&limit=<k>``: one job's stored log lines numbered
    after ``n`` (``workers.live.log.page``), for the task's owner only."""
    user: User = current_user(request)
    task = get_object_or_404(Task.objects.owned_by(user), pk=pk)
    try:
        job_id = UUID(request.GET.get("assignment", ""))
    except ValueError:
        return JsonResponse({"assignment": ["Name one of this task's jobs by its id."]}, status=400)
    job = get_object_or_404(Assignment.objects.select_related("worker"), pk=job_id, task=task)
    try:
        after = _count(request, "after", 0, 2**53)
        limit = _count(request, "limit", job_log.PAGE_LINES, job_log.PAGE_LINES)
    except ValueError as exc:
        field, why = exc.args
        return JsonResponse({field: [why]}, status=400)
    return JsonResponse(job_log.page(job, after, limit))


@never_cache
@login_required
def task_log_download(request: HttpRequest, pk: UUID) -> StreamingHttpResponse:
    """``log.txt``: the task's whole stored log as a text file, for its owner only."""
    user: User = current_user(request)
    task = get_object_or_404(Task.objects.owned_by(user), pk=pk)
    response = StreamingHttpResponse(job_log.text_lines(task), content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="task-{task.pk}-log.txt"'
    response["X-Content-Type-Options"] = "nosniff"
    return response
