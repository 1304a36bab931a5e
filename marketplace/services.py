"""State changes of the marketplace. Views and API endpoints call these; nothing else
writes tasks, datasets or tokens. A task's status moves, and its row lock, are
``marketplace.lifecycle``'s: the services here call it, as the workers app does.

Each service opens its own transaction, locks the rows it changes, and schedules side
effects with ``transaction.on_commit``. Validation errors are DRF ValidationErrors with
a dict naming the field, so both the API and the pages can show them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any
from uuid import UUID

from django.conf import settings
from django.core.cache import cache
from django.core.files import File
from django.core.files.uploadedfile import UploadedFile
from django.db import transaction
from django.utils import timezone
from rest_framework.exceptions import NotFound, ValidationError

from ledger import services as ledger
from ledger.units import format_credits
from marketplace import pricing
from marketplace.datasets import clean_name, embeddings_map, embeddings_shape, inspect_upload
from marketplace.kinds import Kind, get_kind
from marketplace.lifecycle import cancel_locked, lock_own_task, lock_task, open_locked
from marketplace.models import ApiToken, Dataset, Task, TaskEvent, TaskStatus, User, hash_token
from training.plugin import DatasetProblem, Upload

# How long a dataset's content checks are remembered (by its content hash).
CHECKED_FOR = 7 * 24 * 3600


@dataclass(frozen=True)
class TaskRequest:
    """What a requester asks for; the API serializer and the page form both build one."""

    kind: str
    spec: dict[str, Any]
    budget: int
    title: str = ""
    dataset: UUID | None = None
    min_reputation: int = 0
    replication: int = 1
    max_attempts: int = 3
    draft: bool = False
    bid: int | None = None  # per replica, fee included; None: all the budget's share per replica


def check_task_request(
    owner: User, request: TaskRequest, *, check_budget: bool = True
) -> tuple[dict[str, Any], Dataset | None, int]:
    """Validate a request against its kind. Returns (clean spec, dataset, price estimate).

    ``check_budget=False`` skips only the budget's check against the price (a quote).
    """
    kind = get_kind(request.kind)
    try:
        spec = kind.validate_spec(request.spec)
    except ValidationError as exc:
        raise ValidationError({"spec": exc.detail}) from None

    dataset = None
    if request.dataset is not None:
        dataset = Dataset.objects.owned_by(owner).filter(pk=request.dataset).first()
        if dataset is None:
            raise ValidationError({"dataset": ["No such dataset among yours."]})
        if dataset.format not in kind.dataset_formats:
            allowed = ", ".join(kind.dataset_formats) or "none"
            raise ValidationError(
                {"dataset": [f"A task of kind {kind.name} takes datasets of format {allowed}, not {dataset.format}."]}
            )
    elif kind.dataset_required(spec):
        raise ValidationError({"dataset": [f"A task of kind {kind.name} needs a dataset; upload one first."]})

    source_kind = kind.source_kind
    source_spec: dict[str, Any] | None = None
    if source_kind is not None:
        source = Task.objects.owned_by(owner).filter(pk=spec["source_task"]).only("kind", "status", "spec").first()
        if source is None:
            raise ValidationError({"spec": {"source_task": [f"No {source_kind} task of yours with this id."]}})
        if source.kind != source_kind:
            raise ValidationError(
                {
                    "spec": {
                        "source_task": [f"That task is a {source.kind} task; {kind.name} needs a {source_kind} task."]
                    }
                }
            )
        if source.status != TaskStatus.COMPLETED:
            raise ValidationError({"spec": {"source_task": ["That training task has not completed."]}})
        source_spec = source.spec
        spec["source_task"] = str(spec["source_task"])
    if dataset is not None:
        _check_dataset(kind, spec, dataset, source_spec)

    price = kind.estimate_price(spec)
    if check_budget:
        check_bid(request)
    return spec, dataset, price


def bid_of(request: TaskRequest) -> int:
    """The request's bid per replica: the one it names, or its budget's share per replica."""
    return request.bid if request.bid is not None else request.budget // request.replication


def check_bid(request: TaskRequest) -> None:
    """The bid fits the budget (every replica may be paid it) and clears the least any node
    may ask; a 400 naming ``bid``, or ``budget`` when the bid is the budget's share. A bid
    under every fitting node's ask is not an error: the task waits and says what ask it needs."""
    bid = bid_of(request)
    field = "bid" if request.bid is not None else "budget"
    copies = f" × {request.replication} replicas" if request.replication > 1 else ""
    if bid * request.replication > request.budget:
        raise ValidationError(
            {
                "bid": [
                    f"A bid of {format_credits(bid)} credits{copies} is more than the budget of"
                    f" {format_credits(request.budget)} credits."
                ]
            }
        )
    least = pricing.charge(pricing.floor_price())
    if bid < least:
        floor = format_credits(pricing.floor_price())
        cost = (
            f"The least a job may cost is {format_credits(least)} credits (the lowest ask a node may set,"
            f" {floor}, plus the platform's fee)"
        )
        if field == "bid":
            raise ValidationError({"bid": [f"{cost}; a bid of {format_credits(bid)} credits is under it."]})
        needed = format_credits(least * request.replication)
        raise ValidationError({"budget": [f"{cost}{copies}; the budget must cover {needed}."]})


def _check_dataset(kind: Kind, spec: dict[str, Any], dataset: Dataset, source: dict[str, Any] | None) -> None:
    """Run the kind's dataset check on a stored dataset; its DatasetProblem is a 400 on
    ``dataset``. Verdicts are cached by content hash (``CHECKED_FOR``)."""
    if kind.check_dataset is None:
        return

    def remember(key: str, compute: Callable[[], Any]) -> Any:
        value = cache.get(key)
        if value is None:
            value = compute()
            cache.set(key, value, CHECKED_FOR)
        return value

    path = dataset.file.path

    def shape(tensor: str) -> tuple[list[int], str]:
        with dataset.file.open("rb") as handle:
            return embeddings_shape(handle, dataset.format, tensor)

    upload = Upload(
        name=dataset.name,
        path=Path(path),
        format=dataset.format,
        id=str(dataset.pk),
        sha256=dataset.sha256,
        shape=shape,
        array=partial(embeddings_map, path, dataset.format),
        remember=remember,
    )
    try:
        kind.check_dataset(spec, upload, source)
    except DatasetProblem as exc:
        raise ValidationError({"dataset": [str(exc)]}) from None


def post_task(owner: User, request: TaskRequest) -> Task:
    """Validate and create a task; unless it is a draft, open it for workers.

    Locks the task's dataset row, if any, for the length of the insert."""
    spec, dataset, price = check_task_request(owner, request)
    kind = get_kind(request.kind)
    with transaction.atomic():
        # Lock the dataset so a concurrent delete_dataset either finishes first (and we
        # refuse here) or waits and then sees this task; never an IntegrityError.
        if dataset is not None and not Dataset.objects.select_for_update().filter(pk=dataset.pk).exists():
            raise ValidationError({"dataset": ["No such dataset among yours."]})
        task = Task.objects.create(
            owner=owner,
            title=request.title.strip() or kind.label,
            kind=kind.name,
            spec=spec,
            dataset=dataset,
            budget=request.budget,
            price_estimate=price,
            bid=bid_of(request),
            work_tflop=kind.tflop(spec),
            memory_bytes=kind.resources(spec).memory_bytes,
            features=sorted(kind.features(spec)),
            min_reputation=request.min_reputation,
            replication=request.replication,
            max_attempts=request.max_attempts,
            status=TaskStatus.DRAFT,
        )
        TaskEvent.objects.create(task=task, status=TaskStatus.DRAFT, message="Task created.")
        if not request.draft:
            open_locked(task)
    return task


def publish_task(owner: User, task_id: UUID) -> Task:
    """Open a draft for workers."""
    with transaction.atomic():
        task = lock_own_task(owner, task_id)
        open_locked(task)
    return task


def cancel_task(owner: User, task_id: UUID) -> Task:
    """Cancel one of the owner's tasks that has not reached verification; the escrow
    goes back to the owner in the same transaction.

    The workers app ends the task's jobs in the same transaction (``task_cancelling``), or
    refuses while a replica's result is being verified: that result may still be paid."""
    with transaction.atomic():
        task = lock_own_task(owner, task_id)
        cancel_locked(task)
    return task


def cancel_task_as_operator(task_id: UUID, reason: str) -> Task:
    """The platform's operators cancel a task (the admin panel): as ``cancel_task`` does,
    refunding its escrow, and the requester reads "Cancelled by an operator: <reason>" on
    its timeline and as its status reason. ``reason`` must not be blank."""
    if not reason.strip():
        raise ValueError("an operator's cancel needs a reason")
    with transaction.atomic():
        task = lock_task(task_id)
        if task is None:
            raise NotFound("No such task.")
        cancel_locked(task, operator_reason=reason.strip())
    return task


def welcome_user(user: User) -> None:
    """Open a new user's ledger account; in development, grant the configured credits
    so the embedded platform can be tried before payments exist."""

    ledger.ensure_user_account(user)
    if settings.SIGNUP_GRANT_UNITS:
        ledger.deposit(user, settings.SIGNUP_GRANT_UNITS, reference=f"signup-grant:{user.pk}")


# --- Datasets -----------------------------------------------------------------------


def upload_dataset(owner: User, upload: UploadedFile, name: str = "") -> Dataset:
    """Check, hash and store a dataset file sent in one request."""
    if upload.file is None:
        raise ValidationError({"file": ["No file was sent."]})
    return store_dataset(owner, upload, upload.size or 0, name.strip() or clean_name(upload.name))


def store_dataset(
    owner: User, content: File, size: int, name: str, *, then: Callable[[Dataset], None] | None = None
) -> Dataset:
    """The one way a file becomes a Dataset, whether it came in one request or in parts.

    Checks the size and sniffs the format (``inspect_upload``: a ValidationError naming
    ``file``), hashes it, stores it and inserts the row. Hashing is slow I/O, so it runs
    before the transaction; ``then`` runs inside it, after the insert, so a caller's own
    row change commits or rolls back with the dataset. A failed insert removes the file.
    A ``content`` with ``temporary_file_path`` is moved into place, not copied.
    """
    if content.file is None:
        raise ValidationError({"file": ["No file was sent."]})
    fmt, digest = inspect_upload(content.file, size)
    dataset = Dataset(owner=owner, name=name[:200], format=fmt, size_bytes=size, sha256=digest)
    # The file write happens before the row exists; a failed insert removes the file.
    dataset.file.save("upload", content, save=False)
    try:
        with transaction.atomic():
            dataset.save()
            if then is not None:
                then(dataset)
    except Exception:
        dataset.file.delete(save=False)
        raise
    return dataset


def delete_dataset(owner: User, dataset_id: UUID) -> None:
    """Delete an unused dataset and, after commit, its file."""
    with transaction.atomic():
        dataset = Dataset.objects.owned_by(owner).select_for_update().filter(pk=dataset_id).first()
        if dataset is None:
            from rest_framework.exceptions import NotFound

            raise NotFound("No such dataset.")
        used = dataset.tasks.count()
        if used:
            raise ValidationError({"dataset": [f"In use by {used} task(s); it cannot be deleted."]})
        storage, path = dataset.file.storage, dataset.file.name or ""
        dataset.delete()
        transaction.on_commit(lambda: storage.delete(path))


# --- API tokens ---------------------------------------------------------------------

MAX_TOKENS_PER_USER = 50


def create_api_token(user: User, name: str) -> tuple[ApiToken, str]:
    """Create a named token. Returns the row and the raw token, which is never stored."""
    name = name.strip()
    if not name:
        raise ValidationError({"name": ["Give the token a name."]})
    if len(name) > 64:
        raise ValidationError({"name": ["At most 64 characters."]})
    with transaction.atomic():
        User.objects.select_for_update().filter(pk=user.pk).first()
        if ApiToken.objects.owned_by(user).active().count() >= MAX_TOKENS_PER_USER:
            raise ValidationError({"name": [f"At most {MAX_TOKENS_PER_USER} active tokens; revoke one first."]})
        raw = ApiToken.generate()
        token = ApiToken.objects.create(user=user, name=name, prefix=raw[:10], token_hash=hash_token(raw))
    return token, raw


def revoke_api_token(user: User, token_id: int, *, operator_reason: str = "") -> ApiToken:
    """Revoke one of the user's tokens; revoking twice is harmless (the first revocation's
    time and reason stay). ``operator_reason``: an operator revokes it (the admin), and its
    owner reads why on the account page."""
    token = ApiToken.objects.filter(pk=token_id, user=user).first()
    if token is None:
        from rest_framework.exceptions import NotFound

        raise NotFound("No such token.")
    why = f"Revoked by an operator: {operator_reason}"[:300] if operator_reason else ""
    ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now(), revoked_reason=why)
    token.refresh_from_db(fields=["revoked_at", "revoked_reason"])
    return token
