"""Datasets: upload, list, inspect, delete when unused."""

from __future__ import annotations

from uuid import UUID

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Count
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST
from rest_framework.exceptions import NotFound, ValidationError

from marketplace import services
from marketplace.forms import DatasetUploadForm, error_messages
from marketplace.models import Dataset
from marketplace.views.common import current_user


@login_required
def datasets(request: HttpRequest) -> HttpResponse:
    """The user's datasets and the upload form."""
    user = current_user(request)
    uploaded = _own_dataset(request, request.GET.get("uploaded"))
    if uploaded is not None:
        # datasets.js sent the file in parts and lands here: the same message as a form post,
        # then the plain URL, so a reload does not say it again.
        _say_uploaded(request, uploaded)
        return redirect("datasets")
    form = DatasetUploadForm(request.POST or None, request.FILES or None, max_bytes=settings.DATASET_MAX_BYTES)
    status = 200
    if request.method == "POST":
        if form.is_valid():
            try:
                dataset = services.upload_dataset(user, form.cleaned_data["file"], form.cleaned_data["name"])
            except ValidationError as exc:
                form.add_service_errors(exc.detail)
            else:
                _say_uploaded(request, dataset)
                return redirect("datasets")
        status = 400
    rows = Dataset.objects.owned_by(user).annotate(task_count=Count("tasks"))
    context = {
        "form": form,
        "datasets": rows,
        "max_bytes": settings.DATASET_MAX_BYTES,
        # datasets.js sends the file in parts of this size (marketplace/dataset_uploads.py).
        "part_bytes": settings.DATASET_UPLOAD_PART_BYTES,
    }
    return render(request, "marketplace/datasets.html", context, status=status)


def _say_uploaded(request: HttpRequest, dataset: Dataset) -> None:
    messages.success(request, f"Uploaded “{dataset.name}” ({dataset.get_format_display()}).")


def _own_dataset(request: HttpRequest, raw_id: str | None) -> Dataset | None:
    """The user's dataset named by ``raw_id``, or None (also for a malformed id)."""
    if not raw_id:
        return None
    try:
        pk = UUID(raw_id)
    except ValueError:
        return None
    return Dataset.objects.owned_by(current_user(request)).filter(pk=pk).first()


@login_required
def dataset_detail(request: HttpRequest, pk: UUID) -> HttpResponse:
    dataset = get_object_or_404(Dataset.objects.owned_by(current_user(request)), pk=pk)
    tasks = dataset.tasks.only("pk", "title", "status", "created_at")
    return render(request, "marketplace/dataset_detail.html", {"dataset": dataset, "tasks": tasks})


@login_required
@require_POST
def dataset_delete(request: HttpRequest, pk: UUID) -> HttpResponse:
    try:
        services.delete_dataset(current_user(request), pk)
    except NotFound:
        raise Http404("No such dataset.") from None
    except ValidationError as exc:
        detail = list(exc.detail.values()) if isinstance(exc.detail, dict) else exc.detail
        messages.error(request, " ".join(error_messages(detail)))
    else:
        messages.success(request, "Dataset deleted.")
    return redirect("datasets")
