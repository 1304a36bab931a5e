"""What a worker's artifact may cost the platform's verifier: memory bounded by what the
task needs, however large the upload, and a bounded number of runs when the verifier dies."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
from django.conf import settings

from ledger import services as ledger
from ledger.units import UNITS_PER_CREDIT
from marketplace.models import TaskStatus
from tests.factories import assign, post_task
from tests.workers import test_asl_kinds, test_cube_kinds, test_jobs
from tests.workers.test_asl_kinds import AslProvider
from tests.workers.test_cube_kinds import Provider, completed_training, inference_task, submitted
from training.cube.data import synthetic_embeddings
from workers import verification
from workers.assignments import jobs, scheduler
from workers.models import Assignment, Worker
from workers.tasks import verify_assignment
from workers.verification.asl import verify_asl_inference
from workers.verification.cube import verify_cube_inference

pytestmark = pytest.mark.django_db

# The trained models and their datasets, module fixtures of the kinds' own tests.
alpha = test_asl_kinds.alpha
dataset = test_asl_kinds.dataset
trained = test_asl_kinds.trained
cube_trained = test_cube_kinds.trained

T = TypeVar("T")
PEAK_LIMIT = 4 * 1024 * 1024  # bytes of Python and numpy memory a refused verification may take


def peak_of(call: Callable[[], T]) -> tuple[T, int]:
    """The call's result and the most memory it held at once (tracemalloc sees numpy too)."""
    tracemalloc.start()
    try:
        result = call()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# --- predictions.csv is streamed ---------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ("\n" * 200_000, "more rows than the 5 input sequences"),  # blank lines: rows all the same
        ("x" * 4_000_000, "row 2 is longer than"),  # one line with no end
        ('"' + "a\n" * 1_000_000 + '"\n', "row 2 is longer than"),  # one quoted field over many lines
    ],
    ids=["blank-lines", "endless-line", "endless-quoted-field"],
)
def test_an_oversized_predictions_file_is_refused_without_being_read_whole(
    bob: Any, alpha: AslProvider, dataset: Path, trained: Path, tmp_path: Path, body: str, words: str
) -> None:
    assignment = test_asl_kinds.inference_assignment(bob, alpha, dataset, trained, tmp_path, verify_samples=5)
    header = (tmp_path / "honest" / "predictions.csv").read_text().splitlines()[0]
    path = tmp_path / "predictions.csv"
    path.write_text(header + "\n" + body)

    verdict, peak = peak_of(lambda: verify_asl_inference(submitted(assignment, path, {}), {"predictions.csv": path}))
    assert peak < PEAK_LIMIT, f"the verifier held {peak} bytes for a {path.stat().st_size}-byte file"
    assert not verdict.ok
    assert words in verdict.reason


# --- outputs.npy is mapped, its shape checked first ----------------------------------------


def test_outputs_of_the_wrong_shape_are_refused_from_the_header(
    bob: Any, alice: Any, cube_trained: Path, tmp_path: Path
) -> None:
    source = completed_training(bob, Provider(alice, "alpha", reputation=90), cube_trained)
    rows = synthetic_embeddings(12, 32, seed=7, stream=3)[0]
    assignment = assign(inference_task(bob, source, rows, samples=12))
    path = tmp_path / "outputs.npy"
    # 200,000 rows where the task has 12: 25.6 MB on disk (sparse), never read.
    big = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(200_000, 32))
    del big

    verdict, peak = peak_of(lambda: verify_cube_inference(submitted(assignment, path, {}), {"outputs.npy": path}))
    assert peak < PEAK_LIMIT, f"the verifier held {peak} bytes"
    assert not verdict.ok
    assert verdict.reason == "outputs.npy has shape [200000, 32], expected [12, 32]."


# --- A verification that keeps dying ends -------------------------------------------------


class Killed(BaseException):
    """Stands for the verifier's process being killed (out of memory): nothing after the
    verifier runs in that process, not even an ``except Exception``."""


def test_a_result_that_keeps_killing_the_verifier_is_rejected_and_the_task_refunded(
    alice: Any, bob: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert settings.VERIFY_MAX_ATTEMPTS == 3
    before = ledger.balance(bob)
    provider = test_jobs.Provider(alice, "alpha")
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT, max_attempts=1)
    assignment = assign(task)
    assert provider.submit(assignment, provider.run_job(assignment, tmp_path)).status_code == 202
    reputation = Worker.objects.get(pk=provider.worker.pk).reputation

    runs: list[str] = []

    def verifier(_: Any) -> Any:
        # Two runs on the platform's own broken data, then three killed on the result.
        runs.append("fault" if len(runs) < 2 else "killed")
        if runs[-1] == "fault":
            raise verification.PlatformFault("the source model is missing")
        raise Killed

    monkeypatch.setattr(verification, "verify", verifier)
    for _ in range(2):  # a platform fault is asked again later and does not count
        with pytest.raises(verification.PlatformFault):
            verify_assignment(str(assignment.pk))
    for _ in range(3):  # the message comes back after each kill (late acks)
        with pytest.raises(Killed):
            verify_assignment(str(assignment.pk))
    assert Assignment.objects.get(pk=assignment.pk).state == Assignment.State.SUBMITTED

    # The periodic pass asks for it again, as every VERIFY_RESEND_AFTER: the platform
    # worker takes the message and settles the result without running the verifier.
    monkeypatch.setattr(jobs, "_enqueue_verification", lambda pk: verify_assignment(str(pk)))
    later = (Assignment.objects.get(pk=assignment.pk).verify_sent_at or assignment.created_at) + timedelta(
        seconds=settings.VERIFY_RESEND_AFTER + 1
    )
    assert jobs.resend_stalled_verifications(now=later) == 1
    assert runs == ["fault", "fault", "killed", "killed", "killed"]
    assignment.refresh_from_db()
    assert assignment.state == Assignment.State.REJECTED
    assert assignment.reason.startswith("verification did not finish")
    assert Worker.objects.get(pk=provider.worker.pk).reputation < reputation

    # Nothing is sent again, and the task is not stuck: its one attempt used, it fails
    # and the requester has the escrow back.
    assert jobs.resend_stalled_verifications(now=later + timedelta(days=1)) == 0
    assert verify_assignment(str(assignment.pk)) == "skipped"
    assert scheduler.schedule(task.pk) == []
    task.refresh_from_db()
    assert task.status == TaskStatus.FAILED
    assert ledger.balance(bob) == before


def test_a_run_retried_on_a_locked_database_counts_once_and_the_result_is_still_paid(
    alice: Any, bob: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.db import OperationalError

    from workers import tasks

    provider = test_jobs.Provider(alice, "alpha")
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    assignment = assign(task)
    assert provider.submit(assignment, provider.run_job(assignment, tmp_path)).status_code == 202
    honest = verification.verify

    tries: list[int] = []

    def locked(_: Any) -> Any:
        tries.append(1)
        raise OperationalError("database is locked")

    def also_locked(_: Any) -> None:  # the run's own bookkeeping meets the same lock
        raise OperationalError("database is locked")

    # A busy SQLite: the run and each of its automatic retries (eager here: Celery runs
    # them at once) meet a locked database, and the run cannot even uncount itself.
    monkeypatch.setattr(verification, "verify", locked)
    monkeypatch.setattr(tasks, "_uncount", also_locked)
    result = verify_assignment.apply(args=(str(assignment.pk),))
    assert isinstance(result.result, OperationalError)
    assert len(tries) == 9  # the run and its 8 retries
    assignment.refresh_from_db()
    assert assignment.state == Assignment.State.SUBMITTED
    assert assignment.verify_attempts == 1  # one run, not one per try

    # Later, asked again with the database free: the honest result is verified and paid.
    monkeypatch.setattr(verification, "verify", honest)
    assert verify_assignment(str(assignment.pk)) == "accepted"
