"""Held-out data the platform keeps: split once per task, before it is scheduled.

A kind with a ``prepare`` hook (``marketplace.kinds.Kind.prepare``) verifies results on
data no worker ever received. ``ensure_prepared`` runs the hook on the trusted platform
side, the first time the task is scheduled, and stores two files in default storage:

- the worker-facing file, which the assignment's dataset endpoint serves instead of the
  upload (absent when the worker generates its data itself, as synthetic cube data);
- the held-out file, which only the kind's verifier reads.

The hook draws the held-out rows or participants with ``heldout_seed``: the platform's
``HELDOUT_SECRET`` keyed on the dataset's content, so every task on one dataset holds out
the same ones (repeated tasks show a worker nothing more) and nothing a worker is sent
lets it compute them.

Each preparation writes into its own folder ``prepared/<task>/<run>/``; the manifest
``prepared/<task>/manifest.json`` names the winning run. Storage creates it exclusively,
so two concurrent preparations cannot mix their files: the loser deletes its own.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import shutil
import tempfile
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

from django.conf import settings
from django.core.files import File
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.db import transaction

from marketplace.kinds import KINDS
from marketplace.lifecycle import fail_locked, lock_task
from marketplace.models import Task, TaskStatus

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prepared:
    """Storage names of one task's prepared files, and what the worker is told about its file."""

    worker: str | None
    worker_sha256: str
    worker_size: int
    heldout: str

    def heldout_path(self) -> Path:
        return Path(default_storage.path(self.heldout))


def manifest_name(task_id: UUID | str) -> str:
    return f"prepared/{task_id}/manifest.json"


def prepared(task: Task) -> Prepared | None:
    """The task's prepared files, or None while there are none (or they are being written)."""
    name = manifest_name(task.pk)
    if not default_storage.exists(name):
        return None
    try:
        with default_storage.open(name, "rb") as handle:
            return Prepared(**json.loads(handle.read()))
    except (ValueError, TypeError):  # another preparation is writing it right now
        return None


def needs_preparation(task: Task) -> bool:
    """Whether the task's kind keeps a held-out split."""
    kind = KINDS.get(task.kind)
    return kind is not None and kind.prepare is not None


def dataset_seed(sha256: str) -> bytes:
    """The secret seed of every held-out draw from the dataset whose content has this sha256 (hex)."""
    return _keyed(f"heldout:{sha256}")


def heldout_seed(task: Task) -> bytes:
    """The secret seed the task's held-out split is drawn with: its dataset's
    (``dataset_seed``); without a dataset (synthetic data the worker generates), keyed on
    the task's kind and spec, so the held-out samples come from a stream no spec reaches."""
    if task.dataset is not None:
        return dataset_seed(task.dataset.sha256)
    spec = json.dumps(task.spec, sort_keys=True, separators=(",", ":"))
    return _keyed(f"heldout-synthetic:{task.kind}:{spec}")


def _keyed(label: str) -> bytes:
    return hmac.new(settings.HELDOUT_SECRET, label.encode(), hashlib.sha256).digest()


def ensure_prepared(task_id: UUID | str) -> bool:
    """Prepare the task's split unless done; False when it must not be scheduled now.

    Slow file work happens outside any transaction. When the kind's hook finds the data
    unusable (a ValueError naming the file), the open task fails with that reason and its
    escrow is refunded; nothing is stored.
    """
    task = Task.objects.select_related("dataset").filter(pk=task_id).first()
    if task is None or task.status != TaskStatus.OPEN or not needs_preparation(task):
        return True
    kind = KINDS[task.kind]
    if not kind.available or prepared(task) is not None:
        return True
    hook = kind.prepare
    assert hook is not None  # needs_preparation
    with tempfile.TemporaryDirectory(prefix="proofwork-prepare-") as tmp:
        source = None
        if task.dataset is not None:
            source = Path(tmp) / f"upload.{task.dataset.format}"
            with task.dataset.file.open("rb") as upload, source.open("wb") as out:
                shutil.copyfileobj(upload, out, 1 << 20)
        try:
            worker, heldout = hook(task.spec, source, Path(tmp) / "out", heldout_seed(task))
        except ValueError as exc:
            reason = str(exc)
            if source is not None and task.dataset is not None:  # named as the requester knows it
                reason = reason.replace(source.name, task.dataset.name)
            _fail_unusable(task.pk, reason)
            return False
        _store(task, worker, heldout)
    return True


def _store(task: Task, worker: Path | None, heldout: Path) -> None:
    run = f"prepared/{task.pk}/{uuid.uuid4().hex}/"
    names: list[str] = []

    def put(path: Path) -> str:
        with path.open("rb") as handle:
            names.append(default_storage.save(run + path.name, File(handle)))
        return names[-1]

    digest, size = "", 0
    if worker is not None:
        digest, size = _sha256(worker), worker.stat().st_size
    manifest = Prepared(
        worker=put(worker) if worker is not None else None,
        worker_sha256=digest,
        worker_size=size,
        heldout=put(heldout),
    )
    wanted = manifest_name(task.pk)
    saved = default_storage.save(wanted, ContentFile(json.dumps(asdict(manifest)).encode()))
    if saved != wanted:  # a concurrent preparation won; its files are the task's
        for name in [*names, saved]:
            default_storage.delete(name)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fail_unusable(task_id: Any, problem: str) -> None:
    """Fail an open task whose data cannot be used, refunding its escrow."""
    message = f"The dataset cannot be used: {problem}"
    with transaction.atomic():
        task = lock_task(task_id)
        if task is None or task.status != TaskStatus.OPEN:
            return
        fail_locked(task, message[:300], reason=message[:300])
    log.info("task %s failed in preparation: %s", task_id, problem)
