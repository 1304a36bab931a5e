"""Worker registration and management endpoints."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, permissions, serializers, status, throttling
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from config.api.viewsets import OwnedViewSet
from config.serializers import StrictInput, refuse_body
from ledger.api.serializers import SubmitTransactionSerializer, TransactionSerializer
from ledger.api.views import refusal_errors
from ledger.models import TxStatus
from marketplace import pricing
from marketplace.api.serializers import CreditsField, JSONField
from marketplace.kinds import KINDS
from workers.assignments import jobs, sweep
from workers.identity import services
from workers.identity.authentication import IsWorker, WorkerTokenAuthentication
from workers.market import asks as market_asks
from workers.market import offers
from workers.models import Worker, WorkerQuerySet


class WorkerSerializer(serializers.ModelSerializer):
    status = serializers.SerializerMethodField()

    class Meta:
        model = Worker
        fields = [
            "id",
            "name",
            "address",
            "public_key",
            "state",
            "held_by_platform",
            "state_reason",
            "status",
            "capabilities",
            "reputation",
            "jobs_done",
            "earnings",
            "benchmark_gflops",
            "last_heartbeat_at",
            "created_at",
        ]
        read_only_fields = fields

    def get_status(self, worker: Worker) -> str:
        if worker.state != Worker.State.ACTIVE:
            return str(worker.state)
        return "online" if worker.is_online else "offline"


class RegisteredSerializer(WorkerSerializer):
    token = serializers.CharField(help_text="The worker API token; the agent stores it beside its key.")
    created = serializers.BooleanField()

    class Meta(WorkerSerializer.Meta):
        fields = [*WorkerSerializer.Meta.fields, "token", "created"]
        read_only_fields = fields


class ChallengeRequest(StrictInput, serializers.Serializer):
    registration_token = serializers.CharField(max_length=100)
    public_key = serializers.CharField(max_length=64)


class RegisterRequest(ChallengeRequest):
    signature = serializers.CharField(max_length=128)
    register_tx_signature = serializers.CharField(max_length=128, help_text="The signed REGISTER_WORKER template.")
    capabilities = JSONField()
    name = serializers.CharField(max_length=100, required=False, default="", allow_blank=True)


class RegistrationThrottle(throttling.AnonRateThrottle):
    rate = "30/min"


class RegistrationTokenView(APIView):
    """Create a one-time registration token for a new node (valid one hour)."""

    @extend_schema(request=None, responses={201: dict})
    def post(self, request: Request) -> Response:
        refuse_body(request.data)
        token, raw = services.create_registration_token(request.user)  # type: ignore[arg-type]
        return Response({"token": raw, "expires_at": token.expires_at}, status=status.HTTP_201_CREATED)


class ChallengeView(APIView):
    """Step 1 of registration: a nonce for the node to sign. Needs the registration token."""

    permission_classes = [permissions.AllowAny]
    authentication_classes: list[Any] = []
    throttle_classes = [RegistrationThrottle]

    @extend_schema(request=ChallengeRequest, responses={200: dict})
    def post(self, request: Request) -> Response:
        form = ChallengeRequest(data=request.data)
        form.is_valid(raise_exception=True)
        body = services.issue_challenge(form.validated_data["registration_token"], form.validated_data["public_key"])
        return Response(body)


class RegisterView(APIView):
    """Step 2: the signed challenge, the node's capabilities → the worker and its API token."""

    permission_classes = [permissions.AllowAny]
    authentication_classes: list[Any] = []
    throttle_classes = [RegistrationThrottle]

    @extend_schema(request=RegisterRequest, responses={201: RegisteredSerializer, 200: RegisteredSerializer})
    def post(self, request: Request) -> Response:
        form = RegisterRequest(data=request.data)
        form.is_valid(raise_exception=True)
        data = form.validated_data
        done = services.register_worker(
            data["registration_token"],
            data["public_key"],
            data["signature"],
            data["capabilities"],
            data["name"],
            data["register_tx_signature"],
        )
        # broker_url: the node's own login to its queue (null: the platform's embedded broker).
        body = WorkerSerializer(done.worker).data | {
            "token": done.token,
            "created": done.created,
            "broker_url": done.broker_url,
        }
        return Response(body, status=status.HTTP_201_CREATED if done.created else status.HTTP_200_OK)


class SweepTemplateSerializer(serializers.Serializer[dict[str, Any]]):
    """The unsigned TRANSFER a node signs to sweep its earnings (sign it as is)."""

    chain_id = serializers.CharField()
    type = serializers.CharField()
    amount = serializers.IntegerField(help_text="The worker's balance less the fee, in base units.")
    fee = serializers.IntegerField()
    nonce = serializers.IntegerField()
    gas_price = serializers.IntegerField()
    gas_limit = serializers.IntegerField()
    payload = serializers.DictField()

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        fields = super().get_fields()
        fields["from"] = serializers.CharField(help_text="This worker's address.")
        fields["to"] = serializers.CharField(help_text="The owner's custodial account.")
        return fields


class AbandonView(APIView):
    """A node starting up gives up the jobs it was running before: they were lost with its
    old process. 200 with the ids of the jobs given up (reassigned at once)."""

    authentication_classes = [WorkerTokenAuthentication]
    permission_classes = [IsWorker]

    @extend_schema(request=None, responses={200: dict})
    def post(self, request: Request) -> Response:
        assert isinstance(request.auth, Worker)
        refuse_body(request.data)
        abandoned = jobs.abandon_running(request.auth)
        return Response({"abandoned": [str(a.pk) for a in abandoned]})


class CapabilitiesView(APIView):
    """A node starting up reports its capabilities (as at registration), so an upgraded
    agent is offered what it now supports without registering again. 200 with them as
    stored; 400 naming a bad field."""

    authentication_classes = [WorkerTokenAuthentication]
    permission_classes = [IsWorker]

    @extend_schema(request=dict, responses={200: dict})
    def post(self, request: Request) -> Response:
        assert isinstance(request.auth, Worker)
        return Response({"capabilities": services.update_capabilities(request.auth, request.data)})


class WorkerThrottle(throttling.SimpleRateThrottle):
    """Per worker node (its token), for what a node may ask for in a loop."""

    rate = "30/min"

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        worker = request.auth
        ident = str(worker.pk) if isinstance(worker, Worker) else self.get_ident(request)
        return f"throttle_worker_{view.__class__.__name__}_{ident}"


class AskSerializer(serializers.Serializer[Any]):
    """A node's ask for one kind it offers, in credits, and what it comes to for the kind's
    default-spec job."""

    kind = serializers.CharField(read_only=True)
    per_tflop = CreditsField(source="ask.per_tflop", read_only=True, help_text="Credits per TFLOP of the job.")
    minimum = CreditsField(source="ask.minimum", read_only=True, help_text="The least the node takes for a job.")
    reference = serializers.BooleanField(
        read_only=True, help_text="True: the node set no ask for this kind and asks the platform's reference rate."
    )
    floor = CreditsField(read_only=True, help_text="The least a minimum may be.")
    default_job_tflop = serializers.FloatField(source="tflop", read_only=True)
    paid_for_default_job = CreditsField(
        source="pays", read_only=True, help_text="What the node is paid for the kind's default-spec job."
    )
    charged_for_default_job = CreditsField(
        source="charge", read_only=True, help_text="What a requester pays for it, the platform's fee included."
    )


class AskRequest(StrictInput, serializers.Serializer[dict[str, Any]]):
    per_tflop = CreditsField(min_value=Decimal(0), help_text="Credits per TFLOP of the job (0 or more).")
    minimum = CreditsField(
        required=False,
        help_text="The least the node takes for a job, in credits: at least the floor, which it is when left out.",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        return {"minimum": pricing.floor_price(), **attrs}


class NodeAskRequest(AskRequest):
    kind = serializers.CharField(max_length=32)


def _asks_by_kind(worker: Worker, kind: str) -> offers.KindAsk | None:
    return next((row for row in offers.kind_asks(worker) if row.kind == kind), None)


class NodeAsksView(APIView):
    """A node sets its own asks (at start-up, from ``run --ask``): one ask or a list of them,
    all or none. 200 with the node's asks per kind it offers; 400 naming a bad field."""

    authentication_classes = [WorkerTokenAuthentication]
    permission_classes = [IsWorker]
    throttle_classes = [WorkerThrottle]

    @extend_schema(
        request=NodeAskRequest(many=True),
        responses={200: AskSerializer(many=True)},
        description="The body is a list of asks or one ask object.",
    )
    def put(self, request: Request) -> Response:
        assert isinstance(request.auth, Worker)
        data = request.data
        items = data if isinstance(data, list) else [data]
        if not items:
            raise serializers.ValidationError({"non_field_errors": ["Send one ask or a list of them."]})
        if len(items) > len(KINDS):  # each item is a write: one per kind is all a node needs
            raise serializers.ValidationError({"non_field_errors": [f"At most {len(KINDS)} asks, one per kind."]})
        asks: list[dict[str, Any]] = []
        errors: dict[str, list[str]] = {}
        for index, item in enumerate(items):
            form = NodeAskRequest(data=item)
            if form.is_valid():
                asks.append(form.validated_data)
            for field, messages in form.errors.items():
                # Each 400 names its field; the item is named in the message.
                errors.setdefault(field, []).extend(f"item {index}: {m}" for m in messages)
        if errors:
            raise serializers.ValidationError(errors)
        offers.set_asks(request.auth, asks)
        return Response(AskSerializer(offers.kind_asks(request.auth), many=True).data)


class SweepView(APIView):
    """Move this worker's earnings to its owner's account, signed by the node's own key.

    GET: the TRANSFER template (409 while an assignment is unsettled, 400 when there is
    nothing beyond the fee). POST: the template signed (its fields plus ``public_key``
    and ``signature``); 202 when admitted, 200 for the same signed sweep again.
    """

    authentication_classes = [WorkerTokenAuthentication]
    permission_classes = [IsWorker]
    throttle_classes = [WorkerThrottle]  # a refused sweep is stored for the explorer

    @property
    def worker(self) -> Worker:
        assert isinstance(self.request.auth, Worker)
        return self.request.auth

    @extend_schema(responses={200: SweepTemplateSerializer})
    def get(self, request: Request) -> Response:
        return Response(sweep.sweep_template(self.worker))

    @extend_schema(
        request=SubmitTransactionSerializer, responses={202: TransactionSerializer, 200: TransactionSerializer}
    )
    def post(self, request: Request) -> Response:
        form = SubmitTransactionSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        row, replayed = sweep.submit_sweep(self.worker, *form.to_tx())
        if row.status == TxStatus.REFUSED:
            raise serializers.ValidationError(refusal_errors(row))
        code = status.HTTP_200_OK if replayed else status.HTTP_202_ACCEPTED
        return Response(TransactionSerializer(row).data, status=code)


class WorkerViewSet(OwnedViewSet, mixins.ListModelMixin, mixins.RetrieveModelMixin):
    """Your workers: status, capabilities, reputation, earnings; suspend, resume, retire."""

    serializer_class = WorkerSerializer
    lookup_value_regex = "[0-9a-fA-F-]{32,36}"
    ordering_fields = ["created_at", "reputation", "jobs_done"]
    ordering = ["-created_at"]

    def base_queryset(self) -> WorkerQuerySet:
        return Worker.objects.all()

    def _set(self, target: str) -> Response:
        refuse_body(self.request.data)
        worker = services.set_worker_state(self.request.user, self.get_object().pk, target)  # type: ignore[arg-type]
        return Response(WorkerSerializer(worker).data)

    @extend_schema(responses={200: AskSerializer(many=True)})
    @action(detail=True, methods=["get"])
    def asks(self, request: Request, pk: str | None = None) -> Response:
        """The node's ask per kind it offers: its own, or the platform's reference (``reference``)."""
        return Response(AskSerializer(offers.kind_asks(self.get_object()), many=True).data)

    @extend_schema(request=AskRequest, responses={200: AskSerializer})
    @action(detail=True, methods=["put"], url_path=r"asks/(?P<kind>[a-z0-9_]{1,32})")
    def set_ask(self, request: Request, pk: str | None = None, kind: str = "") -> Response:
        """Set the node's ask for one kind it offers; 400 naming a bad field."""
        worker = self.get_object()
        form = AskRequest(data=request.data)
        form.is_valid(raise_exception=True)
        market_asks.set_ask(worker, kind, form.validated_data["per_tflop"], form.validated_data["minimum"])
        return Response(AskSerializer(_asks_by_kind(worker, kind)).data)

    @extend_schema(request=None, responses={204: OpenApiResponse(description="The node asks the reference rate.")})
    @set_ask.mapping.delete
    def clear_ask(self, request: Request, pk: str | None = None, kind: str = "") -> Response:
        """Back to the platform's reference ask for the kind."""
        refuse_body(request.data)
        market_asks.clear_ask(self.get_object(), kind)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=None, responses={200: WorkerSerializer})
    @action(detail=True, methods=["post"])
    def suspend(self, request: Request, pk: str | None = None) -> Response:
        return self._set(Worker.State.SUSPENDED)

    @extend_schema(request=None, responses={200: WorkerSerializer})
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, pk: str | None = None) -> Response:
        return self._set(Worker.State.ACTIVE)

    @extend_schema(request=None, responses={200: WorkerSerializer})
    @action(detail=True, methods=["post"])
    def retire(self, request: Request, pk: str | None = None) -> Response:
        return self._set(Worker.State.RETIRED)
