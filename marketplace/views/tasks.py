"""Home, my tasks, posting a task, task detail, cancel and publish."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.files.storage import default_storage
from django.core.paginator import Paginator
from django.db.models import Count, Q
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST
from rest_framework.exceptions import APIException, NotFound, ValidationError

from config.downloads import download
from ledger import services as ledger
from ledger.costs import task_costs
from ledger.models import TxStatus
from ledger.units import credits_to_units, format_credits
from marketplace import services
from marketplace.errors import error_text
from marketplace.forms import SPEC_PREFIX, StatusFilterForm, TaskForm, error_summary
from marketplace.kinds import KINDS, Kind, memory
from marketplace.models import CANCELLABLE, Task, TaskEvent, TaskStatus, User
from marketplace.quotes import quote_task
from marketplace.views.common import current_user
from marketplace.views.runs import BadParameter, bad_request, compare_choices, own_task, rerun_initial, result_files
from marketplace.work import work

PAGE_SIZE = 20
# "Running" on the home page means a worker holds the task, whatever stage it is at.
IN_PROGRESS = (TaskStatus.ASSIGNED, TaskStatus.RUNNING, TaskStatus.VERIFYING)


def home(request: HttpRequest) -> HttpResponse:
    """The public marketplace: open tasks and platform figures."""
    stats = Task.objects.aggregate(
        open=Count("pk", filter=Q(status=TaskStatus.OPEN)),
        running=Count("pk", filter=Q(status__in=IN_PROGRESS)),
        completed=Count("pk", filter=Q(status=TaskStatus.COMPLETED)),
    )
    stats["users"] = User.objects.count()
    open_tasks = Task.objects.public().only("title", "kind", "budget", "created_at", "replication")[:PAGE_SIZE]
    return render(request, "marketplace/home.html", {"stats": stats, "open_tasks": open_tasks, "kinds": KINDS})


@login_required
def my_tasks(request: HttpRequest) -> HttpResponse:
    """The requester's tasks, newest first, filterable by status."""
    tasks = Task.objects.owned_by(request.user)
    status_form = StatusFilterForm(request.GET or None)
    status = status_form.cleaned_data["status"] if status_form.is_valid() else ""
    if status:
        tasks = tasks.filter(status=status)
    page = Paginator(tasks, PAGE_SIZE).get_page(request.GET.get("page"))
    context = {"page": page, "status_form": status_form, "status": status, "kinds": KINDS}
    return render(request, "marketplace/my_tasks.html", context)


def _kind_or_404(name: str) -> Kind:
    kind = KINDS.get(name)
    if kind is None:
        raise Http404("No such kind.")
    return kind


@login_required
def task_new(request: HttpRequest) -> HttpResponse:
    """Pick a kind; each kind has its own form."""
    rows = [(kind, _default_price(kind)) for kind in KINDS.values()]
    return render(request, "marketplace/task_new.html", {"kind_rows": rows})


def _default_price(kind: Kind) -> str | None:
    """The estimate for the kind's defaults; None where a required field (no default) feeds it."""
    fields = kind.spec_serializer().fields
    defaults = {name: f.default for name, f in fields.items() if not f.required}
    try:
        return format_credits(kind.estimate_price(defaults))
    except (KeyError, TypeError, ValueError):
        return None


@login_required
def task_post(request: HttpRequest, kind: str) -> HttpResponse:
    """The form for one kind. A valid post goes through services.post_task."""
    kind_spec = _kind_or_404(kind)
    try:
        # ?from=<task id>: a re-run, the form filled in with that task's settings and spec.
        initial = rerun_initial(request, kind) if request.method != "POST" else {}
    except BadParameter as exc:
        return bad_request(request, exc, "Cannot re-run that task")
    form = TaskForm(request.POST or None, kind=kind_spec, owner=current_user(request), initial=initial)
    if request.method == "POST":
        if form.is_valid():
            try:
                task = services.post_task(form.owner, form.task_request())
            except ValidationError as exc:
                form.add_service_errors(exc.detail)
            else:
                messages.success(request, "Draft saved." if task.status == TaskStatus.DRAFT else "Task posted.")
                return redirect("task-detail", pk=task.pk)
        return render(request, "marketplace/task_post.html", _post_context(form), status=400)
    return render(request, "marketplace/task_post.html", _post_context(form))


@login_required
@require_POST
def task_check(request: HttpRequest, kind: str) -> HttpResponse:
    """htmx: validate the form as it is filled in; return the error slots and the estimate."""
    form = TaskForm(request.POST, kind=_kind_or_404(kind), owner=current_user(request))
    if form.is_valid():
        try:
            services.check_task_request(form.owner, form.task_request())
        except ValidationError as exc:
            form.add_service_errors(exc.detail)
    return render(request, "marketplace/partials/task_check.html", _post_context(form))


def _post_context(form: TaskForm) -> dict[str, Any]:
    """What the post page and its live check show: the form, the estimate, the balance
    (and whether it falls short), the kind's quality bar for the spec as filled in."""
    balance = ledger.balance(form.owner)
    estimate = _estimate(form)
    return {
        "form": form,
        "kind": form.kind,
        "estimate": estimate,
        "balance": format_credits(balance),
        "balance_short": _balance_short(form, estimate, balance),
        "quality_bar": _quality_bar(form),
        "states_bar": form.kind.quality_bar is not None,
        "error_summary": error_summary(form, form.page_order()),
    }


def _balance_short(form: TaskForm, estimate: dict[str, Any] | None, balance: int) -> str | None:
    """The amount posting would hold, in credits, where the available ``balance`` cannot
    cover it (the budget as typed, or what the estimate says it must cover if that is more);
    None where it can, or while neither parses."""
    budget = form.get_initial_for_field(form.fields["budget"], "budget")
    if form.is_bound:
        # The field as typed: a service refusal (more than the balance) took it out of cleaned_data.
        try:
            budget = form.fields["budget"].clean(form["budget"].data)
        except DjangoValidationError:
            budget = None
    amounts = [credits_to_units(budget)] if budget is not None else []
    if estimate is not None and estimate["budget_needed_units"] is not None:
        amounts.append(estimate["budget_needed_units"])
    needed = max(amounts, default=0)
    return format_credits(needed) if needed > balance else None


def _quality_bar(form: TaskForm) -> list[str] | None:
    """What the kind's verifier will ask of a result of the spec as filled in; None while
    the spec does not validate, or where the kind has no verifier to state one."""
    spec = _valid_spec(form)
    if spec is None or form.kind.quality_bar is None:
        return None
    return form.kind.quality_bar(spec)


def _valid_spec(form: TaskForm) -> dict[str, Any] | None:
    """The spec as filled in with its defaults, or None while it is not valid."""
    if form.is_bound:
        form.is_valid()  # parse, so parsed_spec() can read cleaned_data
        spec = form.parsed_spec()
    else:
        spec = {**form.default_spec(), **_initial_spec(form)}
    if spec is None:
        return None
    try:
        return form.kind.validate_spec(spec)
    except ValidationError:
        return None


def _estimate(form: TaskForm) -> dict[str, Any] | None:
    """Price, resources, wait and run time for the spec as filled in, or None while it is not valid."""
    clean = _valid_spec(form)
    if clean is None:
        return None
    data = getattr(form, "cleaned_data", {})
    min_reputation = (
        data.get("min_reputation", form.get_initial_for_field(form.fields["min_reputation"], "min_reputation")) or 0
    )
    # None while the field does not parse: the price per replica is all that is known then.
    replication = (
        data.get("replication")
        if form.is_bound
        else form.get_initial_for_field(form.fields["replication"], "replication")
    )
    budget, bid = data.get("budget"), data.get("bid")
    if not form.is_bound and form.initial.get("bid") is not None:
        bid = Decimal(str(form.initial["bid"]))  # a re-run's bid
    if bid is not None:
        bid_units: int | None = credits_to_units(bid)
    elif budget is not None and replication:
        bid_units = credits_to_units(budget) // replication
    else:
        bid_units = None
    quote = quote_task(form.kind, clean, min_reputation, replication, bid_units)
    return {
        "bid": format_credits(bid_units) if bid_units is not None else None,
        "lowest_asks": [format_credits(c) for c in quote.supply.lowest_asks],
        "at_bid": quote.supply.at_bid if bid_units is not None else None,
        "wait_seconds": quote.wait_seconds,
        "wait": wait_text(quote.wait_seconds),
        "run_seconds": quote.run_seconds,
        "run": run_text(quote.run_seconds),
        "price": format_credits(quote.price),
        "replication": replication,
        "budget_needed": format_credits(quote.budget_needed) if quote.budget_needed is not None else None,
        "budget_needed_units": quote.budget_needed,
        "resources": quote.resources,
        "memory": memory(quote.resources.memory_bytes),  # as the waiting reasons write it
        "supply": quote.supply,
        # With no worker (or too few providers) able to take it, the post page says why
        # before the money is held.
        "warning": quote.warning,
    }


def _initial_spec(form: TaskForm) -> dict[str, Any]:
    """The spec values the unbound form starts from beyond the kind's defaults (a re-run's)."""
    return {name: form.initial[SPEC_PREFIX + name] for name in form.spec_names if SPEC_PREFIX + name in form.initial}


def wait_text(seconds: float | None) -> str:
    """A wait in words: "now", "about 5 minutes"; "unknown" when it cannot be estimated."""
    if seconds is None:
        return "unknown"
    if seconds <= 0:
        return "now"
    if seconds < 60:
        return "under a minute"
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            count = round(seconds / size)
            return f"about {count} {unit}{'s' if count != 1 else ''}"
    return "unknown"  # unreachable: seconds >= 60 here


def run_text(seconds: float | None) -> str:
    """A job's expected run time in words: "under a minute", "about 3 hours"; "unknown"
    with no history to estimate from."""
    if seconds is None:
        return "unknown"
    return "under a minute" if seconds < 60 else wait_text(seconds)


@login_required
def task_detail(request: HttpRequest, pk: UUID) -> HttpResponse:
    """One of the requester's tasks: status, spec, progress and timeline."""
    task = own_task(request, pk)
    kind = KINDS.get(task.kind)
    fields = kind.spec_serializer().fields if kind else {}
    # The kind's field order, not the stored one: PostgreSQL's jsonb reorders keys.
    keys = [key for key in fields if key in task.spec] + [key for key in task.spec if key not in fields]
    spec_rows = [(key, task.spec[key], str(getattr(fields.get(key), "help_text", "") or "")) for key in keys]
    ledger_txs = work().ledger_trail(task)
    context = {
        "task": task,
        "kind": kind,
        "spec_rows": spec_rows,
        "price_estimate": format_credits(task.price_estimate),
        "events": _timeline(list(task.events.all())),
        "metrics": {
            key: f"{value:.4g}" if isinstance(value, float) else value
            for key, value in (task.metrics if isinstance(task.metrics, dict) else {}).items()
        },
        "metrics_note": _metrics_note(task, kind),
        "start_rows": _start_rows(task),
        "status_labels": dict(TaskStatus.choices),
        "cancellable_statuses": sorted(CANCELLABLE),
        # The same JSON live.json serves on reconnect: the first paint and a recovery draw alike.
        "live": work().live_state(task),
        "result_rows": _result_rows(task.result_summary),
        "result_files": result_files(task),
        "verdict": work().verdict(task),
        "compare_choices": compare_choices(request.user, task),
        "ledger_txs": ledger_txs,
        "cost": task_costs(ledger_txs),
        # While a row waits for its block the page re-reads this section (task.js), about
        # once a block time: a sealing sends the task's socket nothing.
        "ledger_pending": any(t.status == TxStatus.PENDING for t in ledger_txs),
        "ledger_poll_seconds": settings.LEDGER_BLOCK_TIME,
    }
    return render(request, "marketplace/task_detail.html", context)


# post_task writes "created" and "opened" in one transaction, moments apart; a draft that
# was published later was opened at least this long after it was created.
_POSTED_OPEN = timedelta(seconds=1)


def _timeline(events: list[TaskEvent]) -> list[dict[str, Any]]:
    """The timeline's rows: each event's time, status badge (status and label) and message.

    Every task is created as a draft (``post_task``), but one posted straight to the market
    was a draft only inside that transaction: its first row says "Created", not "Draft"."""
    rows = [
        {"at": e.at, "status": e.status, "label": e.get_status_display() if e.status else "", "message": e.message}
        for e in events
    ]
    if len(events) > 1 and events[0].status == TaskStatus.DRAFT:
        opened = events[1]
        if opened.status == TaskStatus.OPEN and opened.at - events[0].at < _POSTED_OPEN:
            rows[0].update(status="", label="Created")
    return rows


def _metrics_note(task: Task, kind: Kind | None) -> str:
    """What the metrics list says while it is empty."""
    if kind is not None and not kind.model_files:
        # Only the training kinds (those that produce a model) report metrics, such as a
        # loss; the synthetic and inference kinds report their progress alone.
        return "This kind of task reports its progress only, no metrics."
    if task.is_terminal:
        return "No metrics were reported."
    return "No metrics reported yet."


def _start_rows(task: Task) -> list[tuple[str, datetime]]:
    """The summary's "started" rows: the task's first start, and its latest one when the
    task was run again (a reassignment, or another replica).

    ``task.started_at`` is the first time a worker started it and is never cleared, so
    once the task went back to waiting it is labelled as the first start."""
    first = task.started_at
    if first is None:
        return []
    latest = max(work().start_times(task), default=first)
    if task.status in (TaskStatus.OPEN, TaskStatus.ASSIGNED):
        return [("First started", first)]
    if latest > first:
        return [("First started", first), ("Last started", latest)]
    return [("Started", first)]


# Labels for the summary keys the platform itself writes; other keys (a kind's metrics)
# are made readable from their names.
_RESULT_LABELS = {
    "result_hash": "Result hash",
    "workers": "Workers",
    "verify_seconds": "Verification (s)",
    "gflops": "GFLOP/s, offer to result (platform-timed)",
    "reported_gflops": "GFLOP/s of the product (worker-reported)",
}


def _result_rows(summary: object) -> list[tuple[str, str]]:
    """The verified result as (label, text) rows: lists joined, keys made readable."""
    if not isinstance(summary, dict):
        return []
    rows = []
    for key, value in summary.items():
        text = ", ".join(str(v) for v in value) if isinstance(value, list) else str(value)
        label = _RESULT_LABELS.get(str(key)) or str(key).replace("_", " ").capitalize()
        rows.append((label, text))
    return rows


@login_required
def task_result_file(request: HttpRequest, pk: UUID, name: str) -> FileResponse:
    """Download one file of the requester's completed task's verified result."""
    task = own_task(request, pk)
    try:
        path = work().result_file(task, name)
    except APIException:  # none of that name (404), or the task is not completed (409)
        raise Http404("No such result file.") from None
    return download(request, default_storage.open(path, "rb"), name)


@login_required
@require_POST
def task_cancel(request: HttpRequest, pk: UUID) -> HttpResponse:
    try:
        services.cancel_task(current_user(request), pk)
    except NotFound:
        raise Http404("No such task.") from None
    except DjangoValidationError as exc:  # IllegalTransition: say why, change nothing
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, "Task cancelled.")
    return redirect("task-detail", pk=pk)


@login_required
@require_POST
def task_publish(request: HttpRequest, pk: UUID) -> HttpResponse:
    try:
        services.publish_task(current_user(request), pk)
    except NotFound:
        raise Http404("No such task.") from None
    except DjangoValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    except ValidationError as exc:  # the balance no longer covers the budget, say
        messages.error(request, error_text(exc.detail))
    else:
        messages.success(request, "Task published: workers can pick it up now.")
    return redirect("task-detail", pk=pk)
