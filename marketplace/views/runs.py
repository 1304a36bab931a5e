"""A task as a run: all its result files in one ZIP, re-running it with the same
settings, and two runs of one kind side by side."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.contrib.auth.decorators import login_required
from django.core.files.storage import default_storage
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404, render
from rest_framework.exceptions import APIException

from config.downloads import zip_download
from ledger.costs import TaskCosts, task_costs
from ledger.units import format_credits
from marketplace.forms import SPEC_PREFIX
from marketplace.kinds import KINDS
from marketplace.models import Task
from marketplace.work import work

# How many of the owner's other runs of a kind the task page offers to compare with.
COMPARE_CHOICES = 50


class BadParameter(Exception):
    """A query parameter that does not parse: the page answers 400 naming it."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name
        self.message = message


def own_task(request: HttpRequest, pk: UUID) -> Task:
    """One of the signed-in user's tasks; anyone else's, or none, is a 404."""
    return get_object_or_404(Task.objects.owned_by(request.user).select_related("dataset"), pk=pk)


def task_id_param(request: HttpRequest, name: str) -> UUID:
    """The task id in query parameter ``name``; BadParameter when missing or not an id."""
    raw = request.GET.get(name, "").strip()
    if not raw:
        raise BadParameter(name, "a task id is required.")
    try:
        return UUID(raw)
    except ValueError:
        raise BadParameter(name, f"{raw[:40]!r} is not a task id.") from None


def bad_request(request: HttpRequest, error: BadParameter, title: str) -> HttpResponse:
    return render(request, "marketplace/bad_request.html", {"title": title, "error": error}, status=400)


def result_files(task: Task) -> list[tuple[str, int]]:
    """The task's verified result files with their sizes in bytes (none until completed)."""
    rows = []
    for name in work().result_files(task):
        try:
            rows.append((name, default_storage.size(work().result_file(task, name))))
        except (APIException, OSError):  # gone since it was listed
            continue
    return rows


@login_required
def task_results_zip(request: HttpRequest, pk: UUID) -> StreamingHttpResponse:
    """Every file of the requester's completed task's verified result, as one ZIP."""
    task = own_task(request, pk)
    members = []
    for name in work().result_files(task):
        path = work().result_file(task, name)
        members.append((name, lambda path=path: default_storage.open(path, "rb")))
    if not members:
        raise Http404("This task has no result files.")
    return zip_download(request, members, f"task-{task.pk}-results.zip")


def rerun_initial(request: HttpRequest, kind: str) -> dict[str, Any]:
    """The post form's initial values for ``?from=<task id>``: that task's settings and
    spec, for a task of the signed-in user of this ``kind``; {} without ``from``.

    BadParameter for an id that does not parse or a task of another kind; Http404 for a
    task that is not the user's."""
    if "from" not in request.GET:
        return {}
    source = own_task(request, task_id_param(request, "from"))
    if source.kind != kind:
        raise BadParameter("from", f"that task is a {source.kind} task, not {kind}.")
    bid = source.bid if source.bid else None
    initial: dict[str, Any] = {
        "title": source.title,
        "budget": source.budget_credits,
        "bid": format_credits(bid) if bid is not None else None,
        "min_reputation": source.min_reputation,
        "replication": source.replication,
        "max_attempts": source.max_attempts,
    }
    if source.dataset_id is not None:
        initial["dataset"] = source.dataset_id
    spec = source.spec if isinstance(source.spec, dict) else {}
    initial.update({SPEC_PREFIX + key: str(value) if isinstance(value, UUID) else value for key, value in spec.items()})
    return initial


@login_required
def task_compare(request: HttpRequest) -> HttpResponse:
    """Two of the requester's runs of one kind side by side: settings and spec (the rows
    that differ marked), verdicts, final metrics and costs."""
    try:
        a = own_task(request, task_id_param(request, "a"))
        b = own_task(request, task_id_param(request, "b"))
        if a.kind != b.kind:
            raise BadParameter("b", f"runs compare within one kind: a is {a.kind}, b is {b.kind}.")
    except BadParameter as exc:
        return bad_request(request, exc, "Cannot compare these runs")
    kind = KINDS.get(a.kind)
    fields = list(kind.spec_serializer().fields) if kind else []
    keys = [k for k in fields if k in a.spec or k in b.spec]
    keys += sorted({*a.spec, *b.spec} - set(keys))
    missing = "—"
    settings_rows = [
        ("Status", a.get_status_display(), b.get_status_display()),
        ("Dataset", _dataset(a), _dataset(b)),
        ("Budget (credits)", a.budget_credits, b.budget_credits),
        ("Bid per replica (credits)", format_credits(a.bid), format_credits(b.bid)),
        ("Minimum reputation", a.min_reputation, b.min_reputation),
        ("Replication", a.replication, b.replication),
        ("Max attempts", a.max_attempts, b.max_attempts),
    ]
    spec_rows = [(key, a.spec.get(key, missing), b.spec.get(key, missing)) for key in keys]
    verdicts = (work().verdict(a), work().verdict(b))
    final_a, final_b = _final_metrics(a), _final_metrics(b)
    metric_rows = [
        (key, final_a.get(key, missing), final_b.get(key, missing)) for key in dict.fromkeys([*final_a, *final_b])
    ]
    costs = (task_costs(work().ledger_trail(a)), task_costs(work().ledger_trail(b)))
    context = {
        "a": a,
        "b": b,
        "kind": kind,
        "settings_rows": _marked(settings_rows),
        "spec_rows": _marked(spec_rows),
        "verdicts": verdicts,
        "metric_rows": _marked(metric_rows),
        "cost_rows": _cost_rows(*costs),
    }
    return render(request, "marketplace/task_compare.html", context)


def _dataset(task: Task) -> str:
    return task.dataset.name if task.dataset is not None else "none"


def _final_metrics(task: Task) -> dict[str, Any]:
    """What the run ended with: its verified result's numbers once completed, else the
    metrics its worker last reported."""
    source = task.result_summary if task.result_summary else task.metrics
    if not isinstance(source, dict):
        return {}
    return {
        key: f"{value:.6g}" if isinstance(value, float) else value
        for key, value in source.items()
        if isinstance(value, int | float | str) and key != "result_hash"
    }


def _marked(rows: list[tuple[Any, Any, Any]]) -> list[tuple[Any, Any, Any, bool]]:
    """Each (label, a, b) row with whether the two sides differ."""
    return [(label, left, right, str(left) != str(right)) for label, left, right in rows]


def _cost_rows(a: TaskCosts, b: TaskCosts) -> list[tuple[str, str, str, bool]]:
    rows = [
        ("Paid to workers", a.paid_to_workers, b.paid_to_workers),
        ("Platform fee", a.platform_fee, b.platform_fee),
        ("Of which workers' gas", a.worker_gas, b.worker_gas),
        ("Refunded", a.refunded, b.refunded),
        ("Still in escrow", a.held, b.held),
    ]
    return [(label, format_credits(x), format_credits(y), x != y) for label, x, y in rows]


def compare_choices(owner: Any, task: Task) -> list[Task]:
    """The owner's other runs of the task's kind, newest first, to compare it with."""
    return list(
        Task.objects.owned_by(owner)
        .filter(kind=task.kind)
        .exclude(pk=task.pk)
        .only("pk", "title", "status", "created_at")
        .order_by("-created_at")[:COMPARE_CHOICES]
    )
