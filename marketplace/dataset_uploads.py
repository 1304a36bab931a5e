"""Datasets in ordered parts, so that no request carries more than one part.

Daphne holds a request's whole body in memory before Django sees any of it, so a 512 MiB
dataset in one request costs the web process 512 MiB. A client (the /datasets page does
this with JavaScript) instead declares the upload (``begin_dataset_upload``: name and size,
the size checked against the limit at once) and then PUTs the file in parts of at most
``settings.DATASET_UPLOAD_PART_BYTES``, each with

    Content-Range: bytes START-END/TOTAL

as workers send large artifacts (``workers/assignments/uploads.py``; both parse the header and refuse a
part out of order with ``config/api/uploads.py``). Parts go in order: START must be what has been received so far, and a part
that does not follow is refused with 409 naming ``received``, so a client whose answer got
lost continues from there; START 0 begins again. The bytes collect in
``dataset-uploads/<id>.part``, outside the datasets folder: no Dataset row or file exists
until the last part is in and the whole file passed ``services.store_dataset``, the same
checks a single upload gets (the file is then moved into place, not copied). A file that
fails them is deleted with its upload. The format is also sniffed as soon as its first
64 KiB are in, so a file of the wrong type is refused after one part, not after all.

Every write to one upload's bytes holds its file lock (``_exclusive``) and re-reads the
upload's row under it: a retried part that overlaps its original cannot interleave with
it, and nothing is written to an upload that completed or expired meanwhile. Unfinished
uploads expire ``settings.DATASET_UPLOAD_TTL`` seconds after they began; the periodic
``marketplace.expire_dataset_uploads`` task deletes their bytes and rows.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import IO
from uuid import UUID

from django.conf import settings
from django.core.files import File
from django.core.files.storage import default_storage
from django.db import transaction
from django.utils import timezone
from rest_framework import status
from rest_framework.exceptions import APIException, NotFound, ValidationError

from config.api.uploads import OutOfOrder, parse_content_range
from marketplace import services
from marketplace.datasets import SNIFF_BYTES, check_size, clean_name, sniff_format
from marketplace.models import Dataset, DatasetUpload, User

UPLOADS_DIR = "dataset-uploads"
# Unfinished uploads one user may hold at a time: each may grow to DATASET_MAX_BYTES of disk.
MAX_OPEN_UPLOADS = 10
_COPY_CHUNK = 1024 * 1024


class PartTooLarge(APIException):
    """413: a part over ``DATASET_UPLOAD_PART_BYTES``; the body names the header."""

    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE


class LengthRequired(APIException):
    """411: a part must say its length, so it can be refused before it is written."""

    status_code = status.HTTP_411_LENGTH_REQUIRED


class AlreadyComplete(OutOfOrder):
    """409 for a part other than the last one sent to an upload that is complete."""

    def __str__(self) -> str:
        return "This upload is complete; it takes no more parts."


@dataclass(frozen=True)
class PartReceived:
    """What a part left behind: how much is in, and the Dataset once it is complete."""

    received: int
    size_bytes: int
    dataset: Dataset | None = None


def begin_dataset_upload(owner: User, size_bytes: int, name: str = "", filename: str = "") -> DatasetUpload:
    """Open an upload in parts of a file of ``size_bytes`` bytes, refused up front (naming
    ``size_bytes``) when a single upload of that size would be. Locks the owner's user row
    so that two concurrent requests cannot both pass the cap on unfinished uploads."""
    check_size(size_bytes, "size_bytes")
    now = timezone.now()
    with transaction.atomic():
        User.objects.select_for_update().filter(pk=owner.pk).first()
        unfinished = DatasetUpload.objects.owned_by(owner).filter(dataset__isnull=True, expires_at__gt=now).count()
        if unfinished >= MAX_OPEN_UPLOADS:
            raise ValidationError(
                {"non_field_errors": [f"At most {MAX_OPEN_UPLOADS} unfinished uploads; finish or delete one first."]}
            )
        return DatasetUpload.objects.create(
            owner=owner,
            name=(name.strip() or clean_name(filename))[:200],
            size_bytes=size_bytes,
            created_at=now,
            expires_at=now + timedelta(seconds=settings.DATASET_UPLOAD_TTL),
        )


def received_bytes(upload: DatasetUpload) -> int:
    """How many bytes of the upload are in: the length of its part file. Read without the
    lock, so the file may be moved (completed) or deleted meanwhile: that reads as 0."""
    if upload.dataset_id is not None:
        return upload.size_bytes
    try:
        return _part_path(upload.pk).stat().st_size
    except FileNotFoundError:
        return 0


def receive_part(
    owner: User, upload_id: UUID, body: IO[bytes] | None, content_range: str | None, content_length: str | None
) -> PartReceived:
    """Append one part; on the last, check the whole file and create the Dataset.

    Raises ValidationError naming ``Content-Range`` or ``Content-Length`` for a part that
    does not fit the upload (nothing is written), PartTooLarge (413) for one over the part
    limit, OutOfOrder (409 with ``received``) for one that does not continue what is in,
    NotFound for an upload that is not the owner's or expired, and the single upload's
    ValidationError naming ``file`` when the file is refused (its bytes and upload are
    deleted). The last part sent again after completion is answered as complete.
    """
    if content_range is None:
        raise ValidationError({"Content-Range": ["Send each part with 'Content-Range: bytes START-END/TOTAL'."]})
    parsed = parse_content_range(content_range)
    assert parsed is not None
    start, end, total = parsed
    length = end - start + 1
    limit = settings.DATASET_UPLOAD_PART_BYTES
    if length > limit:
        raise PartTooLarge({"Content-Range": [f"A part holds at most {limit} bytes; this range names {length}."]})
    declared = _declared_length(content_length)
    if declared > limit:
        raise PartTooLarge({"Content-Length": [f"A part holds at most {limit} bytes; this one has {declared}."]})
    if declared != length:
        raise ValidationError({"Content-Range": [f"The part holds {declared} bytes; the range names {length}."]})

    with _exclusive(upload_id):
        # Re-read under the lock: completion or expiry may have got there first.
        upload = _live(owner, upload_id)
        if total != upload.size_bytes:
            raise ValidationError(
                {"Content-Range": [f"TOTAL is {total}; this upload was declared as {upload.size_bytes} bytes."]}
            )
        if upload.dataset is not None:
            if end + 1 == total:
                return PartReceived(total, total, upload.dataset)
            raise AlreadyComplete(total)
        if end + 1 == total and received_bytes(upload) == total:
            # Every byte is in but no dataset was made: completing failed on the server's
            # side (the database, the disk), and the client sends the last part again to
            # retry. The bytes are kept for this (``_complete``); check them again.
            return PartReceived(total, total, _complete(upload))
        _append(upload.pk, body, start, length)
        if end + 1 < total:
            if start < min(SNIFF_BYTES, total) <= end + 1:
                _sniff_early(upload)
            return PartReceived(end + 1, total)
        return PartReceived(total, total, _complete(upload))


def abort_dataset_upload(owner: User, upload_id: UUID) -> None:
    """Delete an upload and its bytes (the Dataset of a completed one stays)."""
    with _exclusive(upload_id):
        upload = _live(owner, upload_id)
        _discard(upload.pk)


def expire_dataset_uploads(now: datetime | None = None) -> int:
    """Delete uploads past their expiry, with their bytes, and part files nobody owns
    (a process killed between deleting a row and its file). Returns the uploads deleted.

    Each under its lock, so an upload is never deleted in the middle of a part."""
    now = now or timezone.now()
    expired = list(DatasetUpload.objects.filter(expires_at__lte=now).values_list("pk", flat=True)[:1000])
    for upload_id in expired:
        with _exclusive(upload_id):
            _discard(upload_id)
    folder = _local(UPLOADS_DIR)
    if folder.is_dir():
        cutoff = time.time() - settings.DATASET_UPLOAD_TTL
        # Part files, and lock files a request re-created for an upload deleted while it
        # waited (it then answered 404), that no row owns any more.
        for leftover in [*folder.glob("*.part"), *folder.glob("*.lock"), *folder.glob("*.keep")]:
            try:
                owned = DatasetUpload.objects.filter(pk=UUID(leftover.stem)).exists()
                stale = leftover.stat().st_mtime < cutoff
            except (OSError, ValueError):
                continue
            if stale and not owned:
                leftover.unlink(missing_ok=True)
    return len(expired)


# --- Bytes on disk ----------------------------------------------------------------------


class _PartFile(File):
    """The finished part file. ``temporary_file_path`` makes FileSystemStorage move it
    into the datasets folder (a rename) instead of copying up to 512 MiB."""

    def temporary_file_path(self) -> str:
        return str(self.name)


def _declared_length(header: str | None) -> int:
    if header is None or not header.strip():
        raise LengthRequired({"Content-Length": ["Send the part's length."]})
    try:
        return int(header)
    except ValueError:
        raise ValidationError({"Content-Length": ["Expected a number of bytes."]}) from None


def _live(owner: User, upload_id: UUID) -> DatasetUpload:
    upload = (
        DatasetUpload.objects.owned_by(owner)
        .select_related("dataset")
        .filter(pk=upload_id, expires_at__gt=timezone.now())
        .first()
    )
    if upload is None:
        raise NotFound("No such upload (it may have expired).")
    return upload


def _append(upload_id: UUID, body: IO[bytes] | None, start: int, length: int) -> None:
    """Write ``length`` bytes of ``body`` at ``start`` (call under the lock). A body of
    another length is refused and what was there before stays as it was."""
    part = _part_path(upload_id)
    received = part.stat().st_size if part.exists() else 0
    if start not in (0, received):
        raise OutOfOrder(received)
    part.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with part.open("r+b" if start else "wb") as out:
        out.seek(start)
        out.truncate()
        while body is not None and written <= length:
            chunk = body.read(min(_COPY_CHUNK, length + 1 - written))
            if not chunk:
                break
            out.write(chunk)
            written += len(chunk)
        if written != length:
            out.truncate(start)
    if written != length:
        raise ValidationError({"Content-Range": [f"The part holds {written} bytes; the range names {length}."]})


def _sniff_early(upload: DatasetUpload) -> None:
    """Refuse a file of an unsupported type once its head is in, with the words the
    complete file would get; its bytes and upload go."""
    with _part_path(upload.pk).open("rb") as part:
        head = part.read(SNIFF_BYTES)
    try:
        sniff_format(head, upload.size_bytes)
    except ValidationError:
        _discard(upload.pk)
        raise


def _complete(upload: DatasetUpload) -> Dataset:
    """Turn the complete part file into a Dataset (call under the lock), or delete it
    and the upload when the file is refused.

    ``store_dataset`` moves the file into the datasets folder and deletes it there when
    the insert fails. A hard link (``.keep``, no copy) holds the bytes meanwhile: when
    the failure is not the file's (the database, the disk), they go back to the part
    file and the row and lock stay, so sending the last part again retries, and nothing
    the client sent is lost.
    """

    def link(dataset: Dataset) -> None:
        DatasetUpload.objects.filter(pk=upload.pk).update(dataset=dataset)

    part, keep = _part_path(upload.pk), _keep_path(upload.pk)
    keep.unlink(missing_ok=True)
    os.link(part, keep)
    try:
        with _PartFile(part.open("rb")) as content:
            dataset = services.store_dataset(upload.owner, content, upload.size_bytes, upload.name, then=link)
    except ValidationError:
        _discard(upload.pk)
        raise
    except BaseException:
        if part.exists():
            keep.unlink(missing_ok=True)
        else:
            os.replace(keep, part)
        raise
    keep.unlink(missing_ok=True)
    _lock_path(upload.pk).unlink(missing_ok=True)  # the row is final: whoever waited finds it complete
    return dataset


def _discard(upload_id: UUID) -> None:
    """Delete an upload's row, bytes and lock file (call under its lock)."""
    DatasetUpload.objects.filter(pk=upload_id).delete()
    _part_path(upload_id).unlink(missing_ok=True)
    _keep_path(upload_id).unlink(missing_ok=True)
    _lock_path(upload_id).unlink(missing_ok=True)


@contextmanager
def _exclusive(upload_id: UUID) -> Iterator[None]:
    """Hold the upload's lock (an flock beside its part file) for the block. Whoever
    deletes the lock file holds it, and every holder re-reads the row, so a request that
    waited on a deleted one finds the upload completed or gone."""
    lock = _lock_path(upload_id)
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _part_path(upload_id: UUID) -> Path:
    return _local(f"{UPLOADS_DIR}/{upload_id}.part")


def _lock_path(upload_id: UUID) -> Path:
    return _local(f"{UPLOADS_DIR}/{upload_id}.lock")


def _keep_path(upload_id: UUID) -> Path:
    return _local(f"{UPLOADS_DIR}/{upload_id}.keep")


def _local(name: str) -> Path:
    return Path(default_storage.path(name))
