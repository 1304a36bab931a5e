"""Retention of workers' uploads: a rejected result's files go after the retention
period; an accepted result's, and a recently rejected one's, stay."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.files.storage import default_storage
from django.utils import timezone

from ledger.units import UNITS_PER_CREDIT
from tests.factories import make_worker, post_task
from workers.assignments import scheduler, uploads
from workers.models import Assignment
from workers.tasks import purge_rejected_artifacts

pytestmark = pytest.mark.django_db


def settled(owner: Any, requester: Any, state: str, days_ago: float) -> tuple[Assignment, Path]:
    """An assignment settled ``days_ago`` with a product uploaded to its folder."""
    make_worker(owner)
    task = post_task(requester, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    (assignment,) = scheduler.schedule(task.pk)
    folder = Path(default_storage.path(uploads.artifact_dir(assignment.pk)))
    folder.mkdir(parents=True)
    (folder / "product.safetensors").write_bytes(b"\0" * 1024)
    when = timezone.now() - timedelta(days=days_ago)
    Assignment.objects.filter(pk=assignment.pk).update(state=state, settled_at=when)
    return assignment, folder


def test_rejected_uploads_go_after_the_retention_period_and_nothing_else(alice: Any, bob: Any) -> None:
    days = settings.REJECTED_ARTIFACT_RETENTION_DAYS
    old_rejected, old_folder = settled(alice, bob, Assignment.State.REJECTED, days + 1)
    _, recent_folder = settled(alice, bob, Assignment.State.REJECTED, days - 1)
    _, accepted_folder = settled(alice, bob, Assignment.State.ACCEPTED, days + 30)

    assert purge_rejected_artifacts() == 1
    assert not old_folder.exists()
    assert (recent_folder / "product.safetensors").exists()
    assert (accepted_folder / "product.safetensors").exists()
    old_rejected.refresh_from_db()
    assert old_rejected.artifacts_deleted_at is not None
    assert old_rejected.state == Assignment.State.REJECTED  # the record and its reason stay
    assert purge_rejected_artifacts() == 0  # each is deleted once

    # Two days later the recent one is past its period too.
    from workers.assignments.retention import purge_rejected_artifacts as purge

    assert purge(now=timezone.now() + timedelta(days=2)) == 1
    assert not recent_folder.exists()
    assert (accepted_folder / "product.safetensors").exists()


def test_the_purge_runs_hourly_on_the_control_queue() -> None:
    from config.celery import app

    entry = settings.CELERY_BEAT_SCHEDULE["workers-purge-rejected-artifacts"]
    assert entry["task"] == "workers.purge_rejected_artifacts"
    assert entry["schedule"] == 3600.0
    assert app.amqp.router.route({}, entry["task"])["queue"].name == "control"


def test_a_backlog_goes_a_batch_a_run(alice: Any, bob: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from workers.assignments import retention

    monkeypatch.setattr(retention, "BATCH", 1)
    days = settings.REJECTED_ARTIFACT_RETENTION_DAYS
    _, older = settled(alice, bob, Assignment.State.REJECTED, days + 5)
    _, newer = settled(alice, bob, Assignment.State.REJECTED, days + 2)
    assert purge_rejected_artifacts() == 1
    assert not older.exists()  # oldest first
    assert newer.exists()
    assert purge_rejected_artifacts() == 1
    assert not newer.exists()
    assert purge_rejected_artifacts() == 0
