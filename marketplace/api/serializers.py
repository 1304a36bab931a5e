"""REST serializers. Explicit fields everywhere; amounts go out as credit strings."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from config.api.parsers import refuse_unstorable_text
from config.serializers import StrictInput
from ledger.costs import task_costs
from ledger.units import UNITS_PER_CREDIT, credits_to_units, format_credits
from marketplace.dataset_uploads import received_bytes
from marketplace.kinds import KIND_NAMES, KINDS
from marketplace.models import ApiToken, Dataset, DatasetUpload, Task, TaskEvent, User
from marketplace.work import work


class JSONField(serializers.JSONField):
    """DRF's JSONField, with a 400 for a form or multipart value the JSON body's parser
    or DRF would have refused: nested too deeply, holding text that cannot be stored, or
    ``null`` where the field takes none.

    A form field's JSON is decoded here, after the parser's checks ran on the raw form
    text: ``json`` raises RecursionError on ``[[[[…``, which DRF does not catch, and a
    ``\\u0000`` or ``\\ud800`` escape decodes to a NUL or a lone surrogate, which
    PostgreSQL refuses and no UTF-8 response echoing it can encode. Each is a 400 here,
    before anything is saved (a registration must not commit and then fail to render its
    response). A form's ``null`` reaches here as text, past DRF's null check, and is
    refused as a JSON body's null is.
    """

    def to_internal_value(self, data: Any) -> Any:
        try:
            value = super().to_internal_value(data)
        except RecursionError:
            self.fail("invalid")
        if value is None and not self.allow_null:  # a form's "null": as a JSON body's null
            self.fail("null")
        refuse_unstorable_text(value)
        return value


class CreditsField(serializers.DecimalField):
    """Credits in, base units stored: '12.5' ↔ 12_500_000_000. Never a float."""

    default_error_messages = {
        "min_value": "Must be at least {min_value} credits.",
        "max_value": "Must be at most {max_value} credits.",
    }

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_digits", 19)
        kwargs.setdefault("decimal_places", 9)
        kwargs.setdefault("min_value", Decimal(1) / UNITS_PER_CREDIT)
        kwargs.setdefault("max_value", Decimal(9_000_000_000))
        super().__init__(**kwargs)
        # DRF runs min/max validators on the internal value, which here is base units,
        # not credits; the bounds are checked in credits in to_internal_value instead.
        self.validators = [v for v in self.validators if not isinstance(v, (MinValueValidator, MaxValueValidator))]

    def to_internal_value(self, data: Any) -> int:  # type: ignore[override]
        if isinstance(data, bool):
            self.fail("invalid")
        amount = super().to_internal_value(data)
        if self.min_value is not None and amount < self.min_value:
            self.fail("min_value", min_value=_credits_text(self.min_value))
        if self.max_value is not None and amount > self.max_value:
            self.fail("max_value", max_value=_credits_text(self.max_value))
        return credits_to_units(amount)

    def to_representation(self, value: Any) -> str:
        return format_credits(int(value))


def _credits_text(value: Decimal | float) -> str:
    return format_credits(credits_to_units(Decimal(str(value))))


class TaskEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = TaskEvent
        fields = ["at", "status", "message"]


class TaskSerializer(serializers.ModelSerializer):
    """A task as its owner sees it."""

    budget = CreditsField(read_only=True)
    price_estimate = CreditsField(read_only=True)
    bid = CreditsField(read_only=True)
    dataset = serializers.UUIDField(source="dataset_id", read_only=True, allow_null=True)
    kind_available = serializers.SerializerMethodField()

    class Meta:
        model = Task
        fields = [
            "id",
            "title",
            "kind",
            "kind_available",
            "spec",
            "dataset",
            "budget",
            "price_estimate",
            "bid",
            "min_reputation",
            "replication",
            "max_attempts",
            "status",
            "status_reason",
            "progress",
            "metrics",
            "result_summary",
            "created_at",
            "updated_at",
            "opened_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields

    @extend_schema_field(OpenApiTypes.BOOL)
    def get_kind_available(self, task: Task) -> bool:
        kind = KINDS.get(task.kind)
        return bool(kind and kind.available)


class TaskCostSerializer(serializers.Serializer):
    """Where the task's escrow went, in credits, summed from its ledger transactions
    (``ledger.costs``): escrowed = paid_to_workers + platform_fee + refunded + held."""

    escrowed = CreditsField(read_only=True, help_text="Locked in the task's escrow.")
    paid_to_workers = CreditsField(read_only=True, help_text="Rewards released to the workers.")
    platform_fee = CreditsField(read_only=True, help_text="FEE transactions from the escrow to the platform.")
    worker_gas = CreditsField(
        read_only=True, help_text="Gas the workers paid for their SUBMIT_RESULT, out of their rewards."
    )
    refunded = CreditsField(read_only=True, help_text="Returned to the requester.")
    held = CreditsField(read_only=True, help_text="Still in escrow.")
    spent = CreditsField(read_only=True, help_text="Paid to the workers plus the platform's fee.")


class TaskDetailSerializer(TaskSerializer):
    events = TaskEventSerializer(many=True, read_only=True)
    result_files = serializers.SerializerMethodField(
        help_text="Files of the verified result, each at /api/v1/tasks/<id>/results/<name>/ (empty until completed)."
    )
    cost = serializers.SerializerMethodField(help_text="Where the budget went, from the task's ledger transactions.")

    class Meta(TaskSerializer.Meta):
        fields = [*TaskSerializer.Meta.fields, "events", "result_files", "cost"]
        read_only_fields = fields

    def get_result_files(self, task: Task) -> list[str]:
        return work().result_files(task)

    @extend_schema_field(TaskCostSerializer)
    def get_cost(self, task: Task) -> dict[str, Any]:
        return dict(TaskCostSerializer(task_costs(work().ledger_trail(task))).data)


class TaskCreateSerializer(StrictInput, serializers.Serializer):
    """What a requester posts. The spec is checked by the kind in the service."""

    kind = serializers.ChoiceField(choices=KIND_NAMES, help_text="A kind from /api/v1/kinds/.")
    title = serializers.CharField(max_length=200, required=False, default="", allow_blank=True)
    spec = JSONField(required=False, default=dict, help_text="The kind's spec; omitted fields take their defaults.")
    dataset = serializers.UUIDField(required=False, allow_null=True, default=None)
    budget = CreditsField(help_text="Most you pay, in credits (up to 9 decimal places).")
    bid = CreditsField(
        required=False,
        default=None,
        allow_null=True,
        help_text="Most you pay per replica, the platform's fee included (docs/market.md); the job pays its"
        " node's ask and the rest comes back. Left out: the budget's share per replica.",
    )
    min_reputation = serializers.IntegerField(min_value=0, max_value=100, default=0)
    replication = serializers.IntegerField(
        min_value=1, max_value=5, default=1, help_text="Workers of different providers that each compute the job."
    )
    max_attempts = serializers.IntegerField(min_value=1, max_value=10, default=3)
    draft = serializers.BooleanField(default=False, help_text="Save without opening it to workers.")

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, Mapping):
            raise serializers.ValidationError({"non_field_errors": ["Expected a JSON object."]})
        return super().to_internal_value(data)


class TaskQuoteSerializer(TaskCreateSerializer):
    """A task as it would be posted, to price it first: the budget may be left out."""

    budget = CreditsField(
        required=False,
        default=None,
        allow_null=True,
        help_text="Checked against the price, as on posting, when given.",
    )


class WorkerSupplySerializer(serializers.Serializer):
    online = serializers.IntegerField(help_text="Workers online now.")
    fitting = serializers.IntegerField(help_text="Of them, those whose capabilities fit the task.")
    free = serializers.IntegerField(help_text="Of those, the ones not busy with another job.")


class MarketQuoteSerializer(serializers.Serializer):
    lowest_asks = serializers.ListField(
        child=CreditsField(),
        help_text="What the cheapest online nodes that fit would cost per replica, fee included, free or busy.",
    )
    nodes_at_bid = serializers.IntegerField(
        allow_null=True, help_text="Fitting online nodes, free or busy, whose ask fits the bid (null: no bid)."
    )
    expected_wait_seconds = serializers.FloatField(
        allow_null=True,
        help_text="Likely wait for a node at the bid: 0 when one is free; null when no node takes the bid or"
        " there is no history to estimate from.",
    )
    expected_run_seconds = serializers.FloatField(
        allow_null=True,
        help_text="Likely time from a node's offer to the verified result, from the kind's recent verified jobs"
        " (their median time per TFLOP); null when there is no history to estimate from.",
    )


class TaskQuoteResultSerializer(serializers.Serializer):
    """What posting the task would cost and who could take it now. Nothing is written."""

    kind = serializers.CharField()
    spec = serializers.JSONField(help_text="The spec with its defaults filled in, as it would be stored.")
    price_estimate = CreditsField(help_text="Per replica, at the platform's reference ask, fee included.")
    bid = CreditsField(allow_null=True, help_text="The bid per replica, as it would be stored (null: no budget given).")
    market = MarketQuoteSerializer()
    budget_needed = CreditsField(help_text="The price times the replication: the least budget accepted.")
    memory_bytes = serializers.IntegerField(help_text="Memory a worker needs for the task.")
    gpu_preferred = serializers.BooleanField()
    workers = WorkerSupplySerializer()
    waiting_reason = serializers.CharField(
        help_text="Why the task would wait: no online worker fits it, or fitting workers of fewer providers"
        " than its replication (replicas go to different providers); empty otherwise (free or busy)."
    )


class PublicTaskSerializer(serializers.ModelSerializer):
    """An open task as the public marketplace shows it: no spec, no owner."""

    budget = CreditsField(read_only=True)

    class Meta:
        model = Task
        fields = ["id", "title", "kind", "budget", "min_reputation", "replication", "created_at"]
        read_only_fields = fields


class DatasetSerializer(serializers.ModelSerializer):
    in_use = serializers.SerializerMethodField()

    class Meta:
        model = Dataset
        fields = ["id", "name", "format", "size_bytes", "sha256", "created_at", "in_use"]
        read_only_fields = fields

    @extend_schema_field(OpenApiTypes.BOOL)
    def get_in_use(self, dataset: Dataset) -> bool:
        return bool(getattr(dataset, "task_count", 0))


class DatasetUploadSerializer(StrictInput, serializers.Serializer):
    file = serializers.FileField(allow_empty_file=True, help_text="The dataset file (multipart).")
    name = serializers.CharField(max_length=200, required=False, default="", allow_blank=True)


class DatasetUploadSessionCreateSerializer(StrictInput, serializers.Serializer):
    size_bytes = serializers.IntegerField(help_text="The whole file's size in bytes.")
    name = serializers.CharField(max_length=200, required=False, default="", allow_blank=True)
    filename = serializers.CharField(
        max_length=1000, required=False, default="", allow_blank=True, help_text="Names the dataset when name is blank."
    )


class DatasetUploadSessionSerializer(serializers.ModelSerializer):
    """An upload in parts: how much is in, the part limit, and the Dataset once complete."""

    received = serializers.SerializerMethodField()
    part_bytes = serializers.SerializerMethodField()

    class Meta:
        model = DatasetUpload
        fields = ["id", "name", "size_bytes", "received", "part_bytes", "dataset", "created_at", "expires_at"]
        read_only_fields = fields

    @extend_schema_field(OpenApiTypes.INT64)
    def get_received(self, upload: DatasetUpload) -> int:
        return received_bytes(upload)

    @extend_schema_field(OpenApiTypes.INT)
    def get_part_bytes(self, upload: DatasetUpload) -> int:
        return int(settings.DATASET_UPLOAD_PART_BYTES)


class DatasetUploadProgressSerializer(serializers.Serializer):
    received = serializers.IntegerField(help_text="Bytes in so far: the next part starts here.")
    size_bytes = serializers.IntegerField()
    complete = serializers.BooleanField()


class KindSerializer(serializers.Serializer):
    name = serializers.CharField()
    label = serializers.CharField()  # type: ignore[assignment]
    description = serializers.CharField()
    available = serializers.BooleanField(help_text="Whether providers can run it yet.")
    dataset_formats = serializers.ListField(child=serializers.CharField())
    artifacts = serializers.ListField(child=serializers.CharField())
    default_price_estimate = serializers.CharField(help_text="Credits for the default spec.")
    spec_schema = serializers.DictField(help_text="JSON schema of the spec.")


class UserSerializer(StrictInput, serializers.ModelSerializer):
    class Meta:
        model = User
        fields = ["id", "username", "email", "first_name", "last_name", "date_joined"]
        read_only_fields = ["id", "username", "date_joined"]


class ApiTokenSerializer(serializers.ModelSerializer):
    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "created_at", "last_used_at", "revoked_at"]
        read_only_fields = fields


class ApiTokenCreatedSerializer(ApiTokenSerializer):
    token = serializers.CharField(read_only=True, help_text="Shown once; store it now.")

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "token"]
        read_only_fields = fields


class ApiTokenCreateSerializer(StrictInput, serializers.Serializer):
    name = serializers.CharField(max_length=64)
