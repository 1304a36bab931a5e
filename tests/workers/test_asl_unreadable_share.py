"""A sequence of the worker's share that the platform cannot read while it re-executes an
honest asl_training run's segments (``training.asl.dataset.SequenceUnreadable``: a storage
error on the upload the share's virtual shards are read from) is the platform's fault: the
verification is asked for again later and, after VERIFY_GIVE_UP_AFTER, given up without
penalty. It is never a rejection that costs the worker reputation."""

from __future__ import annotations

import zipfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.factories import CAPS, TINY_ASL, make_dataset, post_task
from tests.workers.proving import RestNode, in_process_agent
from training.asl import run as asl_run
from training.asl.parquet import DatasetError
from training.asl.source import Source
from training.asl.synthetic import generate
from workers import verification
from workers.assignments import scheduler
from workers.models import Assignment, Worker
from workers.tasks import verify_assignment

pytestmark = [pytest.mark.slow, pytest.mark.django_db, pytest.mark.usefixtures("one_thread")]

ASL_CAPS = {**CAPS, "kinds": ["asl_training", "asl_inference"]}


@pytest.mark.parametrize("unreadable", ["sequences", "index"])
def test_a_share_the_platform_cannot_read_while_replaying_is_not_held_against_the_worker(
    alice: Any, bob: Any, tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch, unreadable: str
) -> None:
    # The sequences a replayed batch decodes, or the share's index, which the run's plan
    # reads before any segment is re-executed.
    settings.SEGMENT_REEXECUTION = "platform"
    archive = generate(
        tmp_path / "signs.zip", n_signs=5, n_participants=5, per_participant=2, max_frames=20, as_zip=True
    )
    upload = make_dataset(bob, archive.read_bytes(), "signs.zip")
    task = post_task(bob, "asl_training", dict(TINY_ASL), dataset=upload.pk, budget=10 * 10**9, max_attempts=1)
    worker = RestNode(alice, "asl-node", ASL_CAPS)
    (assignment,) = scheduler.schedule(task.pk)
    with in_process_agent(worker) as agent:
        assert agent.run_assignment(str(assignment.pk)) == "submitted"
    reputation = Worker.objects.get(pk=worker.worker.pk).reputation

    # From now on the upload's sequence files, or the share's index, cannot be read: a
    # storage error.
    real = Source._read_member

    def failing(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes:
        if info.filename.endswith(".parquet"):
            raise DatasetError(info.filename, "cannot be read (Input/output error)")
        return real(archive, info)

    def no_index(*args: Any, **kwargs: Any) -> Any:
        raise DatasetError("train.csv", "cannot be read (Input/output error)")

    if unreadable == "sequences":
        monkeypatch.setattr(Source, "_read_member", staticmethod(failing))
    else:
        monkeypatch.setattr(asl_run, "read_dataset_index", no_index)

    with pytest.raises(verification.PlatformFault, match="cannot be"):
        verify_assignment(str(assignment.pk))  # early on: asked for again later
    assignment.refresh_from_db()
    assert assignment.state == Assignment.State.SUBMITTED

    assert assignment.submitted_at is not None
    Assignment.objects.filter(pk=assignment.pk).update(
        submitted_at=assignment.submitted_at - timedelta(seconds=settings.VERIFY_GIVE_UP_AFTER + 1)
    )
    assert verify_assignment(str(assignment.pk)) == "given-up"
    assignment.refresh_from_db()
    assert assignment.state == Assignment.State.EXPIRED
    assert "could not verify" in assignment.reason
    assert Worker.objects.get(pk=worker.worker.pk).reputation == reputation
