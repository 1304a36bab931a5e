"""The users' side of the marketplace: accounts, API tokens, datasets and tasks."""

from __future__ import annotations

import hashlib
import secrets
import uuid
from typing import ClassVar

from django.conf import settings
from django.contrib.auth.models import AbstractUser
from django.db import models
from django.utils import timezone

from config.api.exceptions import StateConflict
from config.owned import OwnedQuerySet
from ledger.units import format_credits

TOKEN_PREFIX = "pw_"  # noqa: S105 (a public prefix, not a secret)


class User(AbstractUser):
    """A person on Proofwork: requester, provider, or both."""

    email = models.EmailField("email address", blank=True)

    def __str__(self) -> str:
        return self.username


def hash_token(raw: str) -> str:
    """The stored form of an API token: its SHA-256, hex. Tokens carry 256 bits of
    entropy, so a fast hash is enough (no password stretching needed)."""
    return hashlib.sha256(raw.encode()).hexdigest()


class ApiTokenQuerySet(OwnedQuerySet["ApiToken"]):
    owner_field = "user"

    def active(self) -> ApiTokenQuerySet:
        return self.filter(revoked_at__isnull=True)


class ApiToken(models.Model):
    """A named REST credential. Only its hash is stored; the token is shown once."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=64)
    prefix = models.CharField(max_length=12, help_text="First characters, to recognise the token.")
    token_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_reason = models.CharField(
        max_length=300,
        blank=True,
        help_text="Why an operator revoked it, as its owner reads it (“Revoked by an operator: <reason>”); "
        "empty when the owner revoked it.",
    )

    objects: ClassVar[ApiTokenQuerySet] = ApiTokenQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @staticmethod
    def generate() -> str:
        return TOKEN_PREFIX + secrets.token_urlsafe(32)

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


def dataset_upload_to(instance: Dataset, filename: str) -> str:
    # The stored name never uses the client's filename: no path tricks, no collisions.
    return f"datasets/{instance.owner_id}/{uuid.uuid4().hex}"


class DatasetQuerySet(OwnedQuerySet["Dataset"]):
    pass


class Dataset(models.Model):
    """An uploaded file a task can use. Stored as bytes, never executed or unpickled."""

    class Format(models.TextChoices):
        NPY = "npy", "NumPy array (.npy)"
        SAFETENSORS = "safetensors", "safetensors"
        ZIP = "zip", "ZIP archive"
        PARQUET = "parquet", "Parquet"
        CSV = "csv", "CSV"
        JSON = "json", "JSON"
        TEXT = "text", "Plain text"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="datasets")
    name = models.CharField(max_length=200)
    file = models.FileField(upload_to=dataset_upload_to, max_length=255)
    format = models.CharField(max_length=16, choices=Format.choices)
    size_bytes = models.BigIntegerField()
    sha256 = models.CharField(max_length=64)
    created_at = models.DateTimeField(default=timezone.now)

    objects: ClassVar[DatasetQuerySet] = DatasetQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["owner", "-created_at"])]

    def __str__(self) -> str:
        return self.name


class DatasetUploadQuerySet(OwnedQuerySet["DatasetUpload"]):
    pass


class DatasetUpload(models.Model):
    """A dataset arriving in ordered parts (``marketplace/dataset_uploads.py``).

    The bytes collect outside the datasets folder; how many arrived is the length of that
    file, not a column, so the count cannot drift from the bytes. Once the last part is in
    and the file passed the same checks as a single upload, ``dataset`` points at the new
    Dataset and the row stays until it expires, so a last part sent again after its answer
    was lost is answered as complete.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="dataset_uploads")
    name = models.CharField(max_length=200)
    size_bytes = models.BigIntegerField()
    dataset = models.OneToOneField(Dataset, on_delete=models.CASCADE, null=True, blank=True, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(db_index=True)

    objects: ClassVar[DatasetUploadQuerySet] = DatasetUploadQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["owner", "-created_at"])]

    def __str__(self) -> str:
        return self.name


class IllegalTransition(StateConflict):
    """A task was asked to move to a status its current status cannot reach."""

    def __init__(self, current: str, target: str, detail: str = "") -> None:
        super().__init__(
            detail or f"A task that is {current} cannot become {target}.",
            code="illegal_transition",
            params={"current": current, "target": target},
        )
        self.current = current
        self.target = target


class TaskStatus(models.TextChoices):
    DRAFT = "draft", "Draft"
    OPEN = "open", "Open"
    ASSIGNED = "assigned", "Assigned"
    RUNNING = "running", "Running"
    VERIFYING = "verifying", "Verifying"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


S = TaskStatus
# The whole state machine. A job sent back (worker lost, result rejected) returns to
# OPEN for reassignment; COMPLETED, FAILED and CANCELLED are final.
# While work is in hand a task's status follows its replicas (workers/assignments/lifecycle.py): with
# replication > 1 one replica may be verified while another runs or waits for a worker, so
# the four active statuses reach one another, and each reaches COMPLETED when the last
# replica is verified. Only a task still without a submitted result can be cancelled.
ACTIVE = frozenset({S.OPEN, S.ASSIGNED, S.RUNNING, S.VERIFYING})
TRANSITIONS: dict[str, frozenset[str]] = {
    S.DRAFT: frozenset({S.OPEN, S.CANCELLED}),
    S.OPEN: frozenset({S.ASSIGNED, S.RUNNING, S.VERIFYING, S.COMPLETED, S.CANCELLED, S.FAILED}),
    S.ASSIGNED: frozenset({S.RUNNING, S.OPEN, S.VERIFYING, S.COMPLETED, S.CANCELLED, S.FAILED}),
    S.RUNNING: frozenset({S.VERIFYING, S.OPEN, S.ASSIGNED, S.COMPLETED, S.CANCELLED, S.FAILED}),
    S.VERIFYING: frozenset({S.COMPLETED, S.FAILED, S.OPEN, S.ASSIGNED, S.RUNNING}),
    S.COMPLETED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
}
TERMINAL = frozenset({S.COMPLETED, S.FAILED, S.CANCELLED})
CANCELLABLE = frozenset(s for s, targets in TRANSITIONS.items() if S.CANCELLED in targets)


def check_transition(current: str, target: str) -> None:
    """Raise IllegalTransition unless the state machine allows current → target."""
    if target not in TRANSITIONS.get(current, frozenset()):
        raise IllegalTransition(current, target)


class TaskQuerySet(OwnedQuerySet["Task"]):
    def public(self) -> TaskQuerySet:
        """The public marketplace listing: open tasks only."""
        return self.filter(status=TaskStatus.OPEN)


class Task(models.Model):
    """A unit of paid work posted by a requester, run by one or more workers."""

    Status = TaskStatus

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="tasks")
    title = models.CharField(max_length=200)
    kind = models.CharField(max_length=32, db_index=True)
    spec = models.JSONField(help_text="Validated by the kind's spec serializer.")
    dataset = models.ForeignKey(Dataset, null=True, blank=True, on_delete=models.PROTECT, related_name="tasks")
    budget = models.BigIntegerField(help_text="Most the requester pays, in base units (1 credit = 10^9).")
    price_estimate = models.BigIntegerField(help_text="Estimated price at posting time, in base units.")
    bid = models.BigIntegerField(
        help_text="Most the requester pays per replica, the platform's fee included, in base units: "
        "a node is offered the task only when its ask plus the fee fits (docs/market.md)."
    )
    # What the task asks of a node, read from its spec at posting, so a scheduling pass
    # over every waiting task reads columns rather than each spec (workers/market/).
    work_tflop = models.FloatField(default=0.0, help_text="The kind's work measure: estimated TFLOPs.")
    memory_bytes = models.BigIntegerField(default=0, help_text="Memory a node needs for it.")
    features = models.JSONField(default=list, blank=True, help_text="Agent features a node needs for it.")
    min_reputation = models.PositiveSmallIntegerField(default=0, help_text="0–100")
    replication = models.PositiveSmallIntegerField(default=1)
    max_attempts = models.PositiveSmallIntegerField(default=3)
    status = models.CharField(max_length=16, choices=TaskStatus.choices, default=TaskStatus.DRAFT, db_index=True)
    status_reason = models.CharField(max_length=1500, blank=True)
    progress = models.FloatField(default=0.0, help_text="Percent, 0–100.")
    metrics = models.JSONField(default=dict, blank=True, help_text="Last reported metrics.")
    result_summary = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)
    opened_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects: ClassVar[TaskQuerySet] = TaskQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["owner", "-created_at"]),
            models.Index(fields=["status", "-created_at"]),
            models.Index(fields=["status", "-budget"]),  # the public listing's ?ordering=budget
            models.Index(fields=["status", "-bid", "opened_at"]),  # the scheduler's order
        ]
        constraints = [
            models.CheckConstraint(condition=models.Q(budget__gt=0), name="task_budget_positive"),
            models.CheckConstraint(condition=models.Q(bid__gt=0), name="task_bid_positive"),
            models.CheckConstraint(condition=models.Q(replication__gte=1), name="task_replication_min_1"),
            models.CheckConstraint(condition=models.Q(min_reputation__lte=100), name="task_min_reputation_le_100"),
        ]

    def __str__(self) -> str:
        return f"{self.title} ({self.kind})"

    @property
    def budget_credits(self) -> str:
        return format_credits(self.budget)

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def is_cancellable(self) -> bool:
        return self.status in CANCELLABLE


class TaskEvent(models.Model):
    """One line of a task's timeline: status changes and notable moments."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(default=timezone.now)
    status = models.CharField(max_length=16, choices=TaskStatus.choices, blank=True)
    message = models.CharField(max_length=300)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.message}"
