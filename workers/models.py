"""Provider workers: identity, registration, and the jobs they are assigned."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import ClassVar

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from config.owned import OwnedQuerySet


class RegistrationTokenQuerySet(OwnedQuerySet["RegistrationToken"]):
    pass


class RegistrationToken(models.Model):
    """A one-time token a provider creates on the registration page and gives to a node.

    Only its hash is stored. It expires after an hour and is spent by the first
    successful registration.
    """

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="registration_tokens")
    token_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    challenge = models.CharField(max_length=64, blank=True, help_text="The nonce the node must sign.")
    worker = models.ForeignKey("Worker", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    objects: ClassVar[RegistrationTokenQuerySet] = RegistrationTokenQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"registration token of {self.owner} ({'used' if self.used_at else 'unused'})"

    @property
    def is_usable(self) -> bool:
        return self.used_at is None and self.expires_at > timezone.now()


def online_cutoff(now: datetime | None = None) -> datetime:
    """The one rule for a node's presence: an active node is online while its last
    heartbeat is newer than this (``WORKER_HEARTBEAT_TIMEOUT`` ago), offline from then on.
    ``Worker.is_online``, ``WorkerQuerySet.online``, the pages' wording and the scheduler's
    expiry of silent nodes' jobs all read it."""
    return (now or timezone.now()) - timedelta(seconds=settings.WORKER_HEARTBEAT_TIMEOUT)


class WorkerQuerySet(OwnedQuerySet["Worker"]):
    def usable(self) -> WorkerQuerySet:
        """Workers that may act: active, of an owner whose account is active (a
        deactivated account's nodes are refused as a suspended node is)."""
        return self.filter(state=Worker.State.ACTIVE, owner__is_active=True)

    def online(self) -> WorkerQuerySet:
        return self.usable().filter(last_heartbeat_at__gte=online_cutoff())


class Worker(models.Model):
    """A provider node, known by the ed25519 public key whose private half stays on it."""

    class State(models.TextChoices):
        ACTIVE = "active", "Active"
        SUSPENDED = "suspended", "Suspended"
        RETIRED = "retired", "Retired"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="workers")
    name = models.CharField(max_length=100)
    address = models.CharField(max_length=90, unique=True, help_text="cpc1… address of the node's key.")
    public_key = models.CharField(max_length=64, unique=True, help_text="Raw ed25519 public key, hex.")
    token_hash = models.CharField(max_length=64, unique=True, help_text="SHA-256 of the worker API token.")
    state = models.CharField(max_length=12, choices=State.choices, default=State.ACTIVE, db_index=True)
    held_by_platform = models.BooleanField(
        default=False, help_text="Suspended by the platform's operators: only they can resume it."
    )
    capabilities = models.JSONField(default=dict)
    reputation = models.PositiveSmallIntegerField(default=50, help_text="0–100")
    jobs_done = models.PositiveIntegerField(default=0)
    earnings = models.BigIntegerField(default=0, help_text="Base units earned from verified work.")
    benchmark_gflops = models.FloatField(
        null=True, blank=True, help_text="Achieved GFLOP/s on verified synthetic work."
    )
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    state_reason = models.CharField(
        max_length=300,
        blank=True,
        help_text="Who put the node in its state and why, as its owner reads it: "
        "“Suspended by an operator: <reason>”, “Retired by you.”",
    )
    created_at = models.DateTimeField(default=timezone.now)
    retired_at = models.DateTimeField(null=True, blank=True)

    objects: ClassVar[WorkerQuerySet] = WorkerQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.address[:12]}…)"

    @property
    def queue(self) -> str:
        """The node's own Celery queue."""
        return f"w.{self.address}"

    @property
    def is_online(self) -> bool:
        if self.state != self.State.ACTIVE or self.last_heartbeat_at is None:
            return False
        return self.last_heartbeat_at >= online_cutoff()

    def status(self, busy: bool = False) -> str:
        """online / busy / offline from heartbeats, or the provider's suspended / retired."""
        if self.state != self.State.ACTIVE:
            return str(self.state)
        if not self.is_online:
            return "offline"
        return "busy" if busy else "online"


class Ask(models.Model):
    """A provider's price for one kind on one node (docs/market.md). A node without one
    for a kind asks the platform's reference rate (``marketplace.pricing.reference_ask``)."""

    worker = models.ForeignKey(Worker, on_delete=models.CASCADE, related_name="asks")
    kind = models.CharField(max_length=32)
    per_tflop = models.BigIntegerField(help_text="Base units per TFLOP of the kind's work measure.")
    minimum = models.BigIntegerField(help_text="Least the node takes for one job, in base units.")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["kind"]
        constraints = [
            models.UniqueConstraint(fields=["worker", "kind"], name="ask_one_per_worker_kind"),
            models.CheckConstraint(condition=models.Q(per_tflop__gte=0), name="ask_per_tflop_not_negative"),
            models.CheckConstraint(condition=models.Q(minimum__gt=0), name="ask_minimum_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.worker_id} {self.kind}: {self.per_tflop}/TFLOP, min {self.minimum}"


class AssignmentState(models.TextChoices):
    OFFERED = "offered", "Offered"
    RUNNING = "running", "Running"
    SUBMITTED = "submitted", "Submitted"
    ACCEPTED = "accepted", "Accepted"
    REJECTED = "rejected", "Rejected"
    EXPIRED = "expired", "Expired"


A = AssignmentState
ASSIGNMENT_TRANSITIONS: dict[str, frozenset[str]] = {
    A.OFFERED: frozenset({A.RUNNING, A.EXPIRED}),
    A.RUNNING: frozenset({A.SUBMITTED, A.EXPIRED}),
    A.SUBMITTED: frozenset({A.ACCEPTED, A.REJECTED}),
    A.ACCEPTED: frozenset(),
    A.REJECTED: frozenset(),
    A.EXPIRED: frozenset(),
}
SETTLED = frozenset({A.ACCEPTED, A.REJECTED, A.EXPIRED})
# A worker holds at most one of these at a time: its SUBMIT_RESULT nonce is then the next one.
UNSETTLED = (A.OFFERED, A.RUNNING, A.SUBMITTED)
# A provider with a replica of a task in one of these states is not given another of it
# (replicas go to different providers: workers/assignments/scheduler.py).
REPLICA_HELD = (*UNSETTLED, A.ACCEPTED)


class Shortfall(models.TextChoices):
    """A rejected result whose claim was true but whose model missed the task's quality bar
    (see ``verification.Verdict``): not penalised at once, since the spec may make the bar
    unreachable; penalised once another worker's result on the task meets the bar."""

    NONE = "", "—"
    PENDING = "pending", "Short of the bar, not penalised"
    PENALISED = "penalised", "Short of a bar another worker met, penalised"


# A provider with such an assignment of a task is not offered the task (again): a live or
# accepted replica (replicas go to different providers), or a result short of the task's
# quality bar (its other nodes run the same code and would fall short the same way, or a
# node would burn the task's attempts at no cost).
BARS_PROVIDER = Q(state__in=REPLICA_HELD) | ~Q(shortfall=Shortfall.NONE)


class Assignment(models.Model):
    """One worker's attempt at one task: the unit that is run, submitted and paid."""

    State = AssignmentState

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    task = models.ForeignKey("marketplace.Task", on_delete=models.CASCADE, related_name="assignments")
    worker = models.ForeignKey(Worker, on_delete=models.PROTECT, related_name="assignments")
    attempt = models.PositiveSmallIntegerField(default=1)
    state = models.CharField(max_length=12, choices=AssignmentState.choices, default=A.OFFERED, db_index=True)
    seed_block_hash = models.CharField(max_length=64, help_text="Latest block hash at assignment: seed material.")
    deadline = models.DateTimeField()
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    submitted_at = models.DateTimeField(null=True, blank=True)
    verify_sent_at = models.DateTimeField(
        null=True, blank=True, help_text="When verification was last asked for (sent again if it stalls)."
    )
    verify_attempts = models.PositiveSmallIntegerField(
        default=0, help_text="Verification runs started and not finished (the verifier process was killed)."
    )
    settled_at = models.DateTimeField(null=True, blank=True)
    progress = models.FloatField(default=0.0, help_text="Percent, 0–100.")
    metrics = models.JSONField(default=dict, blank=True)
    history = models.JSONField(default=list, blank=True, help_text="Bounded series of progress samples.")
    log_tail = models.JSONField(
        default=list, blank=True, help_text="Last log lines the worker sent (the whole log: LogLine)."
    )
    log_count = models.PositiveBigIntegerField(
        default=0, help_text="Log lines the job has had: the number of its last LogLine."
    )
    last_progress_at = models.DateTimeField(null=True, blank=True)
    result = models.JSONField(default=dict, blank=True, help_text="The signed ComputeResult.")
    challenge = models.JSONField(
        default=list,
        blank=True,
        help_text="Segments of the committed training trace the platform re-executes, drawn once the result was "
        "signed (docs/proof-of-training.md); the result waits for their checkpoints while still running.",
    )
    reason = models.CharField(max_length=300, blank=True, help_text="Why it was rejected or expired.")
    price = models.BigIntegerField(
        null=True,
        blank=True,
        help_text="What the job pays its node if verified, in base units: the node's ask when it was offered "
        "(docs/market.md). Empty on jobs offered before the market, which pay the task's estimate.",
    )
    shortfall = models.CharField(
        max_length=10,
        choices=Shortfall.choices,
        default=Shortfall.NONE,
        blank=True,
        help_text="A true claim short of the task's quality bar: penalised only once another worker meets the bar.",
    )
    artifacts_deleted_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When a rejected result's uploads were deleted (workers/assignments/retention.py).",
    )

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["task", "worker", "attempt"], name="assignment_unique_attempt"),
        ]
        indexes = [models.Index(fields=["worker", "state"])]

    def __str__(self) -> str:
        return f"{self.task_id} → {self.worker_id} (attempt {self.attempt}, {self.state})"


class LogLine(models.Model):
    """One line of a job's log, numbered from 1 in the order the platform stored it.

    Only the newest ``workers.api.node_socket.LOG_KEEP`` lines of a job are kept, each at
    most ``LOG_LINE_CHARS`` characters, so a node cannot grow the table past that bound per
    job whatever it sends (``workers.live.log``).
    """

    assignment = models.ForeignKey(Assignment, on_delete=models.CASCADE, related_name="log_lines")
    number = models.PositiveBigIntegerField()
    text = models.TextField()

    class Meta:
        ordering = ["assignment", "number"]
        constraints = [models.UniqueConstraint(fields=["assignment", "number"], name="logline_unique_number")]

    def __str__(self) -> str:
        return f"{self.assignment_id} #{self.number}"


class VerificationJob(models.Model):
    """Challenged segments of a trained result offered to a node of another provider to
    re-execute (``PROOFWORK_SEGMENT_REEXECUTION=delegated``, workers/assignments/delegation.py).

    Its ``slots`` mix the real segments with canaries whose ends the platform trained again
    with some steps on other rows (files kept under the job's own folder, never in the result's), in
    an order and under names the verifier cannot map to the trace; which slot is which is
    known here only. The verifier's signed answer is judged when the result is verified:
    ``outcome`` says how, ``reason`` why, as an operator reads it. Verifiers are not paid.
    """

    class State(models.TextChoices):
        OFFERED = "offered", "Offered"
        ANSWERED = "answered", "Answered"
        EXPIRED = "expired", "Expired"

    class Outcome(models.TextChoices):
        PENDING = "", "—"
        AGREED = "agreed", "Agreed with the worker; the canaries failed as they must"
        UPHELD = "upheld", "Said a segment fails; the platform's re-execution agreed"
        CAUGHT = "caught", "Passed a canary: answer discarded"
        OVERRULED = "overruled", "Failed a segment the platform's re-execution passed: answer discarded"
        MOOT = "moot", "Not judged: the worker's result failed on the platform first"
        UNJUDGED = "unjudged", "Not judged: the result was settled without it"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    assignment = models.ForeignKey(Assignment, on_delete=models.CASCADE, related_name="verification_jobs")
    verifier = models.ForeignKey(Worker, on_delete=models.PROTECT, related_name="verification_jobs")
    state = models.CharField(max_length=10, choices=State.choices, default=State.OFFERED, db_index=True)
    slots = models.JSONField(
        default=list, help_text="Per slot: its id, the segment it stands for, and whether it is real or a canary."
    )
    deadline = models.DateTimeField()
    created_at = models.DateTimeField(default=timezone.now)
    answered_at = models.DateTimeField(null=True, blank=True)
    answer = models.JSONField(default=dict, blank=True, help_text="The verifier's signed answer, as sent.")
    outcome = models.CharField(max_length=10, choices=Outcome.choices, default=Outcome.PENDING, blank=True)
    reason = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"verification of {self.assignment_id} by {self.verifier_id} ({self.state})"
