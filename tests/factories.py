"""Typed factories: users (factory_boy), and tasks, datasets, workers and assignments built
through the services the API and the scheduler use."""

from __future__ import annotations

import io
import secrets
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import factory
from django.utils import timezone

from ledger.units import UNITS_PER_CREDIT
from marketplace import services
from marketplace.models import Task, User
from protocol import keys
from workers.assignments import scheduler
from workers.identity import services as identity
from workers.models import Assignment, Worker

if TYPE_CHECKING:
    import numpy as np

PASSWORD = "correct-horse-battery-staple"


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = User
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.com")
    password = factory.django.Password(PASSWORD)


def post_task(owner: Any, kind: str = "synthetic", spec: dict[str, Any] | None = None, **kwargs: Any) -> Any:
    """Post a task through the real service, as the API would."""
    kwargs.setdefault("budget", 5 * UNITS_PER_CREDIT)
    return services.post_task(owner, services.TaskRequest(kind=kind, spec=spec or {}, **kwargs))


# A 3³ lattice on 32-wide embeddings: a few seconds of cube_training on one shared core.
# Dim 192 (the smallest the platform offers), one block, short sequences: seconds on one core.
TINY_ASL: dict[str, Any] = {
    "dim": 192,
    "blocks": 1,
    "max_len": 32,
    "epochs": 6,
    "batch_size": 8,
    "grad_accumulation": 1,
    "learning_rate": 3e-3,
    "validation_fraction": 0.25,
    "seed": 0,
}
TINY_CUBE: dict[str, Any] = {
    "teacher_dim": 32,
    "lattice_edge": 3,
    "state_size": 8,
    "steps": 3,
    "epochs": 10,
    "batch_size": 16,
    "warmup_steps": 5,
    "learning_rate": 1e-2,
    "synthetic_samples": 0,
    "seed": 1,
}


def array_npy(array: np.ndarray) -> bytes:
    """``array`` as a real .npy file, built in memory."""
    import numpy as np

    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def npy_bytes(rows: int = 4, cols: int = 768) -> bytes:
    """A real .npy file (float32 zeros), built in memory: by default, as many rows as a
    cube_training upload needs (some are held out) of the default spec's teacher_dim."""
    import numpy as np

    return array_npy(np.zeros((rows, cols), dtype=np.float32))


def zip_bytes(files: dict[str, bytes] | None = None) -> bytes:
    """A real ZIP archive, built in memory (an ISLR-style layout by default)."""
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as archive:
        for name, data in (files or {"train.csv": b"path,participant_id,sequence_id,sign\n"}).items():
            archive.writestr(name, data)
    return buf.getvalue()


def islr_zip_bytes(participants: int = 3) -> bytes:
    """A small, real ISLR training archive (synthetic landmark sequences, as a zip)."""
    import tempfile
    from pathlib import Path

    from training.asl.synthetic import generate

    with tempfile.TemporaryDirectory() as root:
        archive = generate(
            Path(root) / "islr.zip",
            n_signs=3,
            n_participants=participants,
            per_participant=1,
            max_frames=16,
            as_zip=True,
        )
        return archive.read_bytes()


def upload(content: bytes, filename: str = "data.bin", content_type: str = "application/octet-stream") -> Any:
    """An in-memory uploaded file, as Django hands it to a view."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    return SimpleUploadedFile(filename, content, content_type=content_type)


def make_dataset(owner: Any, content: bytes | None = None, filename: str = "data.npy", name: str = "") -> Any:
    """Upload a dataset through the real service (an .npy array by default)."""
    return services.upload_dataset(owner, upload(npy_bytes() if content is None else content, filename), name)


# A small CPU node that takes synthetic work: what most scheduler tests register.
CAPS: dict[str, Any] = {
    "cpu_cores": 2,
    "ram_bytes": 8 * 2**30,
    "gpu_memory_bytes": 0,
    "kinds": ["synthetic"],
    "features": ["poc:aes256ctr", "poc:shake128", "dataset:shards", "training:replay/2"],
    "agent_version": "test",
}


class MadeWorker(NamedTuple):
    """A worker row with the raw API token that authenticates it and its key pair."""

    worker: Worker
    token: str
    key: keys.KeyPair


def make_worker(
    owner: User,
    *,
    name: str = "",
    online: bool = True,
    reputation: int = 50,
    caps: Mapping[str, Any] | None = None,
    **fields: Any,
) -> MadeWorker:
    """A worker with a real key and API token, online (a fresh heartbeat) unless told not.

    Created as a row rather than through registration (test_registration covers that);
    ``fields`` set any other column (``state``, ``jobs_done``, ``earnings`` …).
    """
    key = keys.generate()
    raw = identity.WORKER_TOKEN_PREFIX + secrets.token_urlsafe(32)
    worker = Worker.objects.create(
        owner=owner,
        name=name or f"node-{key.address[4:10]}",
        address=key.address,
        public_key=key.public_key.hex(),
        token_hash=identity.hash_secret(raw),
        capabilities=dict(caps or CAPS),
        reputation=reputation,
        last_heartbeat_at=timezone.now() if online else None,
        **fields,
    )
    return MadeWorker(worker, raw, key)


def assign(task: Task) -> Assignment:
    """The one assignment the scheduler hands out for ``task`` now, as in production."""
    (assignment,) = scheduler.schedule(task.pk)
    return assignment
