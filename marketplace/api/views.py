"""REST endpoints: parse, call one service, render. Whose rows a request sees is decided
by ``config.api.viewsets.OwnedViewSet``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import django_filters
from django import forms
from django.core.files.storage import default_storage
from django.db.models import Count
from django.http import FileResponse
from django_filters.fields import IsoDateTimeField
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, permissions, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from config.api.parsers import PARSERS, FormParser, JSONParser, MultiPartParser
from config.api.viewsets import OwnedViewSet
from config.downloads import download
from config.serializers import refuse_body
from ledger.units import format_credits
from marketplace import services
from marketplace.api import serializers as s
from marketplace.kinds import KINDS, get_kind
from marketplace.models import ApiToken, ApiTokenQuerySet, Dataset, DatasetQuerySet, Task, TaskQuerySet, TaskStatus
from marketplace.quotes import quote_task
from marketplace.work import work


class _UtcIsoDateTimeField(IsoDateTimeField):
    """An ISO 8601 date-time, refused with a 400 when it leaves years 1–9999 in UTC:
    ``0001-01-01T00:00:00+14:00`` parses, but the database cannot store it (SQLite's
    adapter raises OverflowError)."""

    def to_python(self, value: Any) -> datetime | None:
        parsed = super().to_python(value)
        if parsed is None:
            return None
        try:
            return parsed.astimezone(UTC)
        except OverflowError:
            raise forms.ValidationError("This date-time is outside years 1 to 9999 in UTC.", code="invalid") from None


class UtcIsoDateTimeFilter(django_filters.IsoDateTimeFilter):
    field_class = _UtcIsoDateTimeField


class TaskFilter(django_filters.FilterSet):
    status = django_filters.MultipleChoiceFilter(choices=TaskStatus.choices)
    kind = django_filters.MultipleChoiceFilter(choices=[(k, k) for k in KINDS])
    created_after = UtcIsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = UtcIsoDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = Task
        fields = ["status", "kind", "created_after", "created_before"]


class TaskViewSet(OwnedViewSet, mixins.ListModelMixin, mixins.RetrieveModelMixin):
    """Your tasks: post, list, inspect, publish a draft, cancel."""

    lookup_value_regex = "[0-9a-fA-F-]{32,36}"
    filterset_class = TaskFilter
    ordering_fields = ["created_at", "budget", "status", "progress"]
    ordering = ["-created_at"]

    def base_queryset(self) -> TaskQuerySet:
        qs = Task.objects.all()
        if self.action == "retrieve":
            qs = qs.prefetch_related("events")
        return qs

    def get_serializer_class(self) -> type[Any]:
        if self.action == "retrieve":
            return s.TaskDetailSerializer
        if self.action == "create":
            return s.TaskCreateSerializer
        if self.action == "quote":
            return s.TaskQuoteSerializer
        return s.TaskSerializer

    @extend_schema(request=s.TaskCreateSerializer, responses={201: s.TaskDetailSerializer})
    def create(self, request: Request) -> Response:
        form = s.TaskCreateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        task = services.post_task(request.user, services.TaskRequest(**form.validated_data))  # type: ignore[arg-type]
        return Response(s.TaskDetailSerializer(task).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        request=s.TaskQuoteSerializer,
        responses={200: s.TaskQuoteResultSerializer},
        description="Check and price a task without posting it: the body is what you would post "
        "(the budget may be left out), errors are the ones posting would give, and the answer says "
        "how many online workers could take it now, or why none can.",
    )
    @action(detail=False, methods=["post"])
    def quote(self, request: Request) -> Response:
        form = s.TaskQuoteSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        data = dict(form.validated_data)
        budget = data.pop("budget")
        task_request = services.TaskRequest(budget=budget or 0, **data)
        spec, _, _ = services.check_task_request(request.user, task_request, check_budget=budget is not None)  # type: ignore[arg-type]
        bid = services.bid_of(task_request) if budget is not None or task_request.bid is not None else None
        quote = quote_task(KINDS[task_request.kind], spec, task_request.min_reputation, task_request.replication, bid)
        supply = quote.supply
        body = {
            "bid": bid,
            "market": {
                "lowest_asks": supply.lowest_asks,
                "nodes_at_bid": supply.at_bid if bid is not None else None,
                "expected_wait_seconds": quote.wait_seconds,
                "expected_run_seconds": quote.run_seconds,
            },
            "kind": quote.kind.name,
            "spec": spec,
            "price_estimate": quote.price,
            "budget_needed": quote.budget_needed,
            "memory_bytes": quote.resources.memory_bytes,
            "gpu_preferred": quote.resources.gpu_preferred,
            "workers": {"online": supply.online, "fitting": supply.fitting, "free": len(supply.free)},
            "waiting_reason": quote.warning,
        }
        return Response(s.TaskQuoteResultSerializer(body).data)

    @extend_schema(request=None, responses={200: s.TaskDetailSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        refuse_body(request.data)
        task = services.cancel_task(request.user, self.get_object().pk)  # type: ignore[arg-type]
        return Response(s.TaskDetailSerializer(task).data)

    @extend_schema(request=None, responses={200: s.TaskDetailSerializer})
    @action(detail=True, methods=["post"])
    def publish(self, request: Request, pk: str | None = None) -> Response:
        refuse_body(request.data)
        task = services.publish_task(request.user, self.get_object().pk)  # type: ignore[arg-type]
        return Response(s.TaskDetailSerializer(task).data)

    @extend_schema(
        request=None,
        responses={(200, "application/octet-stream"): bytes},
        description="One file of a completed task's verified result (the kind's artifacts, e.g. "
        "model.safetensors or predictions.csv); the task detail lists them under result_files.",
    )
    @action(detail=True, methods=["get"], url_path=r"results/(?P<name>[A-Za-z0-9_.-]+)")
    def results(self, request: Request, pk: str | None = None, name: str = "") -> FileResponse:
        path = work().result_file(self.get_object(), name)
        return download(request, default_storage.open(path, "rb"), name)


class MarketplaceViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """The public listing: open tasks, public fields only. No sign-in needed."""

    permission_classes = [permissions.AllowAny]
    serializer_class = s.PublicTaskSerializer
    queryset = Task.objects.public()
    filterset_fields = ["kind"]
    ordering_fields = ["created_at", "budget"]
    ordering = ["-created_at"]


class DatasetViewSet(OwnedViewSet, mixins.ListModelMixin, mixins.RetrieveModelMixin):
    """Your datasets: upload (multipart), list, inspect, delete when unused."""

    serializer_class = s.DatasetSerializer
    lookup_value_regex = "[0-9a-fA-F-]{32,36}"
    parser_classes = [MultiPartParser, FormParser, JSONParser]
    ordering_fields = ["created_at", "name", "size_bytes"]
    ordering = ["-created_at"]

    def base_queryset(self) -> DatasetQuerySet:
        return Dataset.objects.annotate(task_count=Count("tasks"))

    @extend_schema(
        request={"multipart/form-data": s.DatasetUploadSerializer},
        responses={201: s.DatasetSerializer},
        description="Upload a dataset file in one request. The web server holds a request's whole body in "
        "memory, so send files larger than a few MiB in parts: /api/v1/dataset-uploads/.",
    )
    def create(self, request: Request) -> Response:
        form = s.DatasetUploadSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        dataset = services.upload_dataset(request.user, form.validated_data["file"], form.validated_data["name"])  # type: ignore[arg-type]
        return Response(s.DatasetSerializer(dataset).data, status=status.HTTP_201_CREATED)

    def destroy(self, request: Request, pk: str | None = None) -> Response:
        services.delete_dataset(request.user, self.get_object().pk)  # type: ignore[arg-type]
        return Response(status=status.HTTP_204_NO_CONTENT)


def kind_payload(name: str) -> dict[str, Any]:
    kind = get_kind(name)
    return {
        "name": kind.name,
        "label": kind.label,
        "description": kind.description,
        "available": kind.available,
        "dataset_formats": list(kind.dataset_formats),
        "artifacts": list(kind.artifacts),
        "default_price_estimate": format_credits(kind.estimate_price(_default_spec(name))),
        "spec_schema": kind.json_schema(),
    }


def _default_spec(name: str) -> dict[str, Any]:
    fields = get_kind(name).spec_serializer().fields
    return {key: f.default for key, f in fields.items() if not f.required}


class KindViewSet(viewsets.ViewSet):
    """The task kinds, each with its spec's JSON schema. No sign-in needed."""

    permission_classes = [permissions.AllowAny]
    lookup_field = "name"
    lookup_value_regex = "[a-z_]+"

    @extend_schema(responses={200: s.KindSerializer(many=True)})
    def list(self, request: Request) -> Response:
        return Response([kind_payload(name) for name in KINDS])

    @extend_schema(
        responses={200: s.KindSerializer},
        parameters=[OpenApiParameter("name", str, OpenApiParameter.PATH, enum=[*KINDS], description="Kind name.")],
    )
    def retrieve(self, request: Request, name: str | None = None) -> Response:
        if name not in KINDS:
            return Response({"detail": "No such kind."}, status=status.HTTP_404_NOT_FOUND)
        return Response(kind_payload(name))


class MeView(APIView):
    """Your profile."""

    parser_classes = PARSERS

    @extend_schema(responses={200: s.UserSerializer})
    def get(self, request: Request) -> Response:
        return Response(s.UserSerializer(request.user).data)

    @extend_schema(request=s.UserSerializer, responses={200: s.UserSerializer})
    def patch(self, request: Request) -> Response:
        form = s.UserSerializer(request.user, data=request.data, partial=True)
        form.is_valid(raise_exception=True)
        form.save()
        return Response(form.data)


class TokenViewSet(OwnedViewSet, mixins.ListModelMixin):
    """Your API tokens: create (shown once), list, revoke."""

    lookup_value_regex = "[0-9]+"
    serializer_class = s.ApiTokenSerializer
    pagination_class = None
    ordering_fields = ["created_at", "last_used_at", "name"]  # one user's few rows

    def base_queryset(self) -> ApiTokenQuerySet:
        return ApiToken.objects.all()

    @extend_schema(request=s.ApiTokenCreateSerializer, responses={201: s.ApiTokenCreatedSerializer})
    def create(self, request: Request) -> Response:
        form = s.ApiTokenCreateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        token, raw = services.create_api_token(request.user, form.validated_data["name"])  # type: ignore[arg-type]
        body = s.ApiTokenSerializer(token).data | {"token": raw}
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(responses={200: s.ApiTokenSerializer})
    def destroy(self, request: Request, pk: str | None = None) -> Response:
        token = services.revoke_api_token(request.user, self.get_object().pk)  # type: ignore[arg-type]
        return Response(s.ApiTokenSerializer(token).data)
