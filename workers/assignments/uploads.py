"""Artifact bytes on disk: one request for a small file, ordered parts for a large one.

A node PUTs each artifact to ``/api/v1/assignments/<id>/artifacts/<name>/``. Daphne holds
a request's whole body in memory before the application sees any of it, so a 1.6 GB
product in one request costs the web process 1.6 GB; the agent sends anything larger than
a part (``workers.agent.transfer.UPLOAD_PART``) as parts instead, each with

    Content-Range: bytes START-END/TOTAL

Parts go in order: START must be what has been received so far, and a part that does not
follow is refused with 409 naming ``received``, so a node whose response got lost simply
continues from there; START 0 begins again. The bytes collect in ``<name>.part`` and
appear under the artifact's name only when the last one arrived, so a reader never sees
half a file. Appending needs a storage with local paths (the default FileSystemStorage).

Every write to one assignment's artifacts (a part, a whole file, the submission that
closes them, the deletion of an expired assignment's) holds that assignment's file lock
(``exclusive``), and an upload re-reads the assignment's state under it: a retried request
that overlaps its original cannot interleave with it, and nothing is written after the
assignment was submitted or expired.

An artifact's file is never written in place: a whole upload replaces it (delete, then
save) and parts appear by ``os.replace``. The synthetic kind's verifier relies on that: it
maps ``product.safetensors`` into memory rather than copying it
(``training.poc.commit.iter_products``), and a mapped file changed or truncated under it
would be read inconsistently or fault.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from django.core.files.storage import default_storage
from django.core.files.uploadedfile import UploadedFile
from rest_framework.exceptions import ValidationError

from config.api.uploads import OutOfOrder

PART_SUFFIX = ".part"


def check_size(total: int, limit: int) -> None:
    """400 naming ``file`` when an artifact of ``total`` bytes is over ``limit``."""
    if total > limit:
        raise ValidationError({"file": [f"The artifact is larger than {limit} bytes."]})


def save_whole(path: str, upload: UploadedFile) -> None:
    """Store a complete artifact at ``path``, replacing any earlier one or unfinished parts."""
    _local(path + PART_SUFFIX).unlink(missing_ok=True)
    if default_storage.exists(path):
        default_storage.delete(path)
    default_storage.save(path, upload)


def save_part(path: str, upload: UploadedFile, start: int, end: int, total: int) -> dict[str, Any]:
    """Append one part; ``complete`` once byte TOTAL−1 is in and the artifact is in place.

    The last part sent again after its answer was lost finds the artifact complete and
    is answered as before, instead of with a 409 that would restart the whole upload.
    """
    if upload.size != end - start + 1:
        raise ValidationError(
            {"Content-Range": [f"The part holds {upload.size} bytes; the range names {end - start + 1}."]}
        )
    partial = _local(path + PART_SUFFIX)
    final = _local(path)
    done = end + 1 == total and start > 0 and not partial.exists() and final.exists()
    if done and final.stat().st_size == total:
        return {"received": total, "size_bytes": total, "complete": True}
    received = partial.stat().st_size if partial.exists() else 0
    if start not in (0, received):
        raise OutOfOrder(received)
    partial.parent.mkdir(parents=True, exist_ok=True)
    with partial.open("r+b" if start else "wb") as out:
        out.seek(start)
        out.truncate()
        for chunk in upload.chunks():
            out.write(chunk)
    if end + 1 < total:
        return {"received": end + 1, "size_bytes": total, "complete": False}
    os.replace(partial, final)
    return {"received": total, "size_bytes": total, "complete": True}


def artifact_dir(assignment_id: Any) -> str:
    """The storage folder holding one assignment's artifacts."""
    return f"artifacts/{assignment_id}"


@contextmanager
def exclusive(assignment_id: Any) -> Iterator[None]:
    """Hold the assignment's artifact lock (an flock beside its folder) for the block."""
    lock = _local(f"{artifact_dir(assignment_id)}.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def close(assignment_id: Any) -> None:
    """Delete unfinished parts and the lock file (call under ``exclusive``, once the
    assignment left ``running``: a request still waiting for the lock then finds it closed)."""
    folder = _local(artifact_dir(assignment_id))
    if folder.is_dir():
        for leftover in folder.glob(f"*{PART_SUFFIX}"):
            leftover.unlink(missing_ok=True)
    _local(f"{artifact_dir(assignment_id)}.lock").unlink(missing_ok=True)


def discard(assignment_id: Any) -> None:
    """Delete an assignment's artifacts and unfinished parts: it expired (nothing it
    uploaded will ever be verified or handed out) or its rejected result is past retention
    (``workers.assignments.retention``); accepted results stay. Waits for an upload in flight first."""
    with exclusive(assignment_id):
        shutil.rmtree(_local(artifact_dir(assignment_id)), ignore_errors=True)
        _local(f"{artifact_dir(assignment_id)}.lock").unlink(missing_ok=True)


def _local(name: str) -> Path:
    return Path(default_storage.path(name))
