"""What a requester gets for their money: the verified result's files (REST and the task
page), and the task's trail on the ledger, on a real synthetic job run by the agent's code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from marketplace.models import Task, TaskStatus
from tests.workers.test_jobs import Provider
from workers.assignments import scheduler
from workers.models import Assignment
from workers.tasks import verify_assignment

pytestmark = pytest.mark.django_db


@pytest.fixture
def alpha(alice: Any) -> Provider:
    return Provider(alice, "alpha")


@pytest.fixture
def submitted(alpha: Provider, bob: Any, tmp_path: Path) -> tuple[Task, Assignment, bytes]:
    """Bob's synthetic task, computed and submitted by alice's worker, not yet verified."""
    from ledger.units import UNITS_PER_CREDIT
    from tests.factories import post_task

    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    (assignment,) = scheduler.schedule(task.pk)
    body = alpha.run_job(assignment, tmp_path)
    assert alpha.submit(assignment, body).status_code == 202
    product = next(tmp_path.rglob("product.safetensors")).read_bytes()
    return task, assignment, product


def web(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_owner_downloads_the_verified_result(
    submitted: tuple[Task, Assignment, bytes], bob: Any, bob_client: APIClient
) -> None:
    task, assignment, product = submitted
    url = f"/api/v1/tasks/{task.pk}/results/product.safetensors/"
    # Before verification there is nothing to hand out: 409 naming the status.
    early = bob_client.get(url)
    assert early.status_code == 409
    assert "verifying" in early.json()["status"][0]
    assert bob_client.get(f"/api/v1/tasks/{task.pk}/").json()["result_files"] == []

    assert verify_assignment(str(assignment.pk)) == "accepted"
    detail = bob_client.get(f"/api/v1/tasks/{task.pk}/").json()
    assert detail["status"] == TaskStatus.COMPLETED
    assert detail["result_files"] == ["product.safetensors"]
    response = bob_client.get(url)
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == product  # type: ignore[attr-defined]
    assert 'filename="product.safetensors"' in response["Content-Disposition"]

    # The task page links the same file and serves it.
    page = web(bob).get(f"/tasks/{task.pk}/")
    link = f"/tasks/{task.pk}/results/product.safetensors"
    assert link in page.content.decode()
    download = web(bob).get(link)
    assert download.status_code == 200
    assert b"".join(download.streaming_content) == product  # type: ignore[attr-defined]


def test_only_the_owner_and_only_declared_files(
    submitted: tuple[Task, Assignment, bytes], alice: Any, alice_client: APIClient, bob_client: APIClient
) -> None:
    task, assignment, _ = submitted
    assert verify_assignment(str(assignment.pk)) == "accepted"
    # Alice runs the worker that computed it, but the result is bob's.
    assert alice_client.get(f"/api/v1/tasks/{task.pk}/results/product.safetensors/").status_code == 404
    assert web(alice).get(f"/tasks/{task.pk}/results/product.safetensors").status_code == 404
    assert APIClient().get(f"/api/v1/tasks/{task.pk}/results/product.safetensors/").status_code in (401, 403)
    # Nothing but the kind's declared artifacts, whatever the name.
    missing = bob_client.get(f"/api/v1/tasks/{task.pk}/results/model.safetensors/")
    assert missing.status_code == 404
    assert "model.safetensors" in missing.json()["detail"]
    assert bob_client.get(f"/api/v1/tasks/{task.pk}/results/..%2Fsecret/").status_code == 404


def test_the_task_page_shows_its_ledger_trail(submitted: tuple[Task, Assignment, bytes], bob: Any) -> None:
    task, assignment, _ = submitted
    assert verify_assignment(str(assignment.pk)) == "accepted"
    body = web(bob).get(f"/tasks/{task.pk}/").content.decode()
    section = body[body.index('id="task-ledger"') :]
    for label in ("Escrow lock", "Submit result", "Escrow release", "Fee"):
        assert label in section, label


def test_under_asgi_a_result_streams_chunk_by_chunk(
    submitted: tuple[Task, Assignment, bytes], bob: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Django's AsyncClient builds the ASGI request daphne would. A plain FileResponse is
    read into memory whole before its first byte is sent there; this one is not."""
    from asgiref.sync import async_to_sync
    from django.test import AsyncClient

    from config import downloads

    task, assignment, product = submitted
    assert verify_assignment(str(assignment.pk)) == "accepted"
    monkeypatch.setattr(downloads, "CHUNK_BYTES", 4096)
    client = AsyncClient()
    client.force_login(bob)

    async def fetch(url: str) -> tuple[Any, list[bytes]]:
        response = await client.get(url)
        return response, [chunk async for chunk in response.streaming_content]  # type: ignore[attr-defined]

    for url in (
        f"/api/v1/tasks/{task.pk}/results/product.safetensors/",
        f"/tasks/{task.pk}/results/product.safetensors",
    ):
        response, chunks = async_to_sync(fetch)(url)
        assert response.status_code == 200
        assert response.is_async  # an async body: no list of every chunk first
        assert len(chunks) == -(-len(product) // 4096)
        assert b"".join(chunks) == product
        assert response["Content-Length"] == str(len(product))
        assert response["Content-Disposition"] == 'attachment; filename="product.safetensors"'


def test_a_database_error_while_settling_is_retried_not_lost_or_rejected(
    submitted: tuple[Task, Assignment, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The platform's database failing (locked, restarting) is not the worker's fault: the
    verification runs again instead of leaving the result "submitted" or rejecting it."""
    from django.db import OperationalError

    from workers import verification
    from workers.assignments import settlement

    task, assignment, _ = submitted
    real_accept, real_verify = settlement.accept, verification.verify
    failures = {"verify": 1, "accept": 1}

    def flaky(name: str, real: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            if failures[name]:
                failures[name] -= 1
                raise OperationalError("database is locked")
            return real(*args, **kwargs)

        return call

    monkeypatch.setattr(verification, "verify", flaky("verify", real_verify))
    monkeypatch.setattr(settlement, "accept", flaky("accept", real_accept))
    result = verify_assignment.apply(args=(str(assignment.pk),))
    assert result.get() == "accepted"
    assert failures == {"verify": 0, "accept": 0}
    assert Assignment.objects.get(pk=assignment.pk).state == Assignment.State.ACCEPTED
    assert Task.objects.get(pk=task.pk).status == TaskStatus.COMPLETED


def test_a_stalled_verification_is_asked_for_again(
    submitted: tuple[Task, Assignment, bytes], monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    """A verification message lost on the way (broker restart, retries used up) must not
    leave the result unsettled for ever: the periodic pass sends it again, once a period."""
    from datetime import timedelta

    from workers.assignments import jobs

    _, assignment, _ = submitted
    sent: list[str] = []
    monkeypatch.setattr(jobs, "_enqueue_verification", lambda pk: sent.append(str(pk)))
    asked = Assignment.objects.get(pk=assignment.pk).verify_sent_at
    assert asked is not None
    period = timedelta(seconds=settings.VERIFY_RESEND_AFTER)

    assert jobs.resend_stalled_verifications(now=asked + period / 2) == 0
    assert jobs.resend_stalled_verifications(now=asked + period + timedelta(seconds=1)) == 1
    assert sent == [str(assignment.pk)]
    assert jobs.resend_stalled_verifications(now=asked + period + timedelta(seconds=2)) == 0  # once a period

    assert verify_assignment(str(assignment.pk)) == "accepted"
    assert jobs.resend_stalled_verifications(now=asked + 10 * period) == 0  # settled: nothing to ask
    assert sent == [str(assignment.pk)]


@pytest.mark.django_db(transaction=True)  # the run's lease is renewed on its own thread and connection
def test_a_verification_still_running_is_not_asked_for_again(
    submitted: tuple[Task, Assignment, bytes], monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    """A verification slower than the resend period must not be sent again while it runs:
    each resend started another run beside it, each counted, until the count rejected a
    result whose first run was still working. Once the run ends, the lease stops."""
    import threading
    import time

    from django.db import connections

    from workers import verification
    from workers.assignments import jobs

    _, assignment, _ = submitted
    settings.VERIFY_RESEND_AFTER = 1  # renewed every third of a second
    sent: list[str] = []
    monkeypatch.setattr(jobs, "_enqueue_verification", lambda pk: sent.append(str(pk)))
    real_verify = verification.verify
    halfway, finish = threading.Event(), threading.Event()

    def slow(assignment: Assignment) -> verification.Verdict:
        time.sleep(2.5)  # over two resend periods
        halfway.set()
        finish.wait(10)
        return real_verify(assignment)

    monkeypatch.setattr(verification, "verify", slow)
    outcome: list[str] = []

    def verify_in_a_thread() -> None:
        try:
            outcome.append(verify_assignment(str(assignment.pk)))
        finally:
            connections.close_all()  # back to the pool (PostgreSQL): later tests need them

    run = threading.Thread(target=verify_in_a_thread)
    run.start()
    try:
        assert halfway.wait(10)
        assert jobs.resend_stalled_verifications() == 0
        assert sent == []
    finally:
        finish.set()
        run.join(30)
    assert outcome == ["accepted"]
    row = Assignment.objects.get(pk=assignment.pk)
    assert row.verify_attempts == 1
    # Settled: the lease ended with the run, and nothing is asked for again.
    time.sleep(1.2)
    assert jobs.resend_stalled_verifications() == 0
    assert sent == []
