"""Held-out data the platform keeps: split once per task, before it is scheduled.

A kind with a ``prepare`` hook (``marketplace.kinds.Kind.prepare``) verifies results on
data no worker ever received. ``ensure_prepared`` runs the hook on the trusted platform
side, the first time the task is scheduled, and stores its two parts in default storage,
each a file or a folder of files (``asl_training``'s shards):

- the worker-facing part, which the assignment's dataset endpoint serves instead of the
  upload (absent when the worker generates its data itself, as synthetic cube data); a
  folder is served as a manifest of its files (name, size, sha256) and each file by itself;
- the held-out part, which only the kind's verifier reads.

The hook draws the held-out rows or participants with ``heldout_seed``: the platform's
``HELDOUT_SECRET`` keyed on the dataset's content, so every task on one dataset holds out
the same ones (repeated tasks show a worker nothing more) and nothing a worker is sent
lets it compute them.

A folder part may hold virtual files (``asl_training``'s shards, ``training.virtualzip``):
a small recipe per file, stored as ``<name>.recipe``, that names its bytes in the task's
upload, so a task's prepared share costs next to no disk whatever the dataset's size and
the dataset's bytes are stored once, as uploaded. The manifest lists a virtual file under
its own name with the size and sha256 of the bytes it serves (digested at preparation);
``open_file`` assembles it from the upload, resolved from the task's dataset when
it is read (a recipe holds no path), and ``readable`` gives the training layer such a folder
with the upload linked in. A task's dataset cannot be deleted while the task exists
(``Task.dataset`` protects it).

Each preparation writes into its own folder ``prepared/<task>/<run>/`` (a folder part under
``<run>/worker/`` and ``<run>/heldout/``); the manifest ``prepared/<task>/manifest.json``
names the winning run's files, with each folder's list of files. Storage creates it exclusively,
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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, TypedDict, cast
from uuid import UUID

from django.conf import settings
from django.core.files import File
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.db import transaction
from django.db.models.fields.files import FieldFile

from marketplace.kinds import KINDS
from marketplace.lifecycle import fail_locked, lock_task
from marketplace.models import Task, TaskStatus
from training.virtualzip import RECIPE_SUFFIX, Recipe, VirtualZip, VirtualZipError, attach, has_recipes, virtual_name

log = logging.getLogger(__name__)


class StoredFile(TypedDict):
    """One file of a prepared folder: its name in the folder, size and sha256 (hex)."""

    name: str
    size_bytes: int
    sha256: str


@dataclass(frozen=True)
class Prepared:
    """Storage names of one task's prepared parts, and what the worker is told about its part.

    ``worker`` and ``heldout`` each name a file, or a folder when its list of files
    (``worker_files``, ``heldout_files``) is not empty; ``worker_sha256`` and
    ``worker_size`` describe a worker-facing file (for a folder: its files' total size)."""

    worker: str | None
    worker_sha256: str
    worker_size: int
    heldout: str
    worker_files: list[StoredFile] = field(default_factory=list)
    heldout_files: list[StoredFile] = field(default_factory=list)

    def heldout_path(self) -> Path:
        """The held-out file or folder on disk."""
        return Path(default_storage.path(self.heldout))

    def worker_file(self, name: str) -> StoredFile | None:
        """The worker-facing folder's file called ``name``, or None (also for a single file)."""
        return next((f for f in self.worker_files if f["name"] == name), None)


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
    with tempfile.TemporaryDirectory(prefix=".preparing-", dir=_scratch()) as tmp:
        source = None
        if task.dataset is not None:
            source = Path(tmp) / f"upload.{task.dataset.format}"
            _link(task.dataset.file, source)
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


def _scratch() -> Path | None:
    """Where a preparation writes before its files are stored: beside them in storage, so
    storing them is a rename and a dataset of tens of GiB needs no room in /tmp (None, the
    system's temporary folder, where the storage has no local path)."""
    try:
        folder = Path(default_storage.path("prepared"))
    except NotImplementedError:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _link(stored: FieldFile, target: Path) -> None:
    """``target`` names the stored upload (a link: a dataset of tens of GiB is not copied
    to be read once), or holds a copy where the storage has no local path."""
    try:
        target.symlink_to(stored.path)
    except NotImplementedError:
        with stored.open("rb") as upload, target.open("wb") as out:
            shutil.copyfileobj(upload, out, 1 << 20)


class _Prepared(File):
    """A file the hook wrote: storage moves it into place (a rename on one filesystem)
    instead of copying it, as the shares of a large dataset are tens of GiB."""

    def temporary_file_path(self) -> str:
        return str(self.name)


def _store(task: Task, worker: Path | None, heldout: Path) -> None:
    """Move the hook's parts under a fresh ``prepared/<task>/<run>/`` and then save the
    manifest; a concurrent preparation that saved its manifest first wins, and ours is deleted."""
    run = f"prepared/{task.pk}/{uuid.uuid4().hex}/"
    names: list[str] = []

    def listing(path: Path) -> list[StoredFile]:
        """The folder's files as a node is served them: a recipe as its virtual file."""
        if not path.is_dir():
            return []
        listed = []
        for f in sorted(p for p in path.iterdir() if p.is_file()):
            if (served := virtual_name(f)) is not None:
                recipe = Recipe.from_json(f.read_bytes())
                listed.append(StoredFile(name=served, size_bytes=recipe.size, sha256=recipe.sha256))
            else:
                listed.append(StoredFile(name=f.name, size_bytes=f.stat().st_size, sha256=_sha256(f)))
        return listed

    def put(path: Path, name: str) -> str:
        with path.open("rb") as handle:
            saved = default_storage.save(name, _Prepared(handle, name=str(path)))
        names.append(saved)
        if saved != name:  # a fresh run folder holds nothing yet; a renamed file breaks a folder
            raise RuntimeError(f"storage saved {name} as {saved}")
        return saved

    def part(path: Path, listed: list[StoredFile], folder: str) -> str:
        if not listed:
            return put(path, run + path.name)
        for f in sorted(p for p in path.iterdir() if p.is_file()):
            put(f, f"{run}{folder}/{f.name}")
        return f"{run}{folder}"

    worker_files = listing(worker) if worker is not None else []
    heldout_files = listing(heldout)
    digest, size = "", 0
    if worker is not None and not worker_files:
        digest, size = _sha256(worker), worker.stat().st_size
    size = size or sum(f["size_bytes"] for f in worker_files)
    try:
        worker_name = part(worker, worker_files, "worker") if worker is not None else None
        heldout_name = part(heldout, heldout_files, "heldout")
    except BaseException:
        for saved in names:
            default_storage.delete(saved)
        raise
    manifest = Prepared(
        worker=worker_name,
        worker_sha256=digest,
        worker_size=size,
        heldout=heldout_name,
        worker_files=worker_files,
        heldout_files=heldout_files,
    )
    wanted = manifest_name(task.pk)
    saved = default_storage.save(wanted, ContentFile(json.dumps(asdict(manifest)).encode()))
    if saved != wanted:  # a concurrent preparation won; its files are the task's
        for name in [*names, saved]:
            default_storage.delete(name)


def open_file(task: Task, folder: str, name: str) -> IO[bytes]:
    """The file ``name`` of the task's prepared folder ``folder`` (as its listing names it),
    opened for reading: a virtual file assembled from the task's upload
    (``training.virtualzip``), which its dataset names here, or a stored file. A recipe
    that does not fit the upload raises VirtualZipError: nothing outside its members is
    ever read."""
    stored = f"{folder}/{name}"
    if not default_storage.exists(stored + RECIPE_SUFFIX):
        return default_storage.open(stored, "rb")
    if task.dataset is None:
        raise VirtualZipError(f"{name} is virtual and task {task.pk} has no upload")
    with default_storage.open(stored + RECIPE_SUFFIX, "rb") as handle:
        recipe = Recipe.from_json(handle.read())
    upload = task.dataset.file
    return cast(IO[bytes], VirtualZip(recipe, upload.storage.open(str(upload.name), "rb"), name))


@contextmanager
def readable(task: Task, stored: str) -> Iterator[Path]:
    """The prepared file or folder ``stored`` as the training layer reads it: itself, or for
    a folder of virtual shards a temporary folder that links in the task's upload, named
    here (``training.virtualzip.attach``)."""
    path = Path(default_storage.path(stored))
    if task.dataset is None or not has_recipes(path):
        yield path
        return
    with attach(path, Path(task.dataset.file.path)) as view:
        yield view


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
