"""Artifact uploads in ordered parts over the REST API (``workers/assignments/uploads.py``): the bytes
arrive whole, nothing appears before the last part, a part out of order is refused with
where to continue, and bad ranges are named; then the agent's own upload in parts against
the live server."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from django.core.files.storage import default_storage
from rest_framework.test import APIClient

from ledger.units import UNITS_PER_CREDIT
from marketplace.models import Task
from tests.factories import assign, post_task
from tests.workers.test_jobs import Provider
from workers.agent import transfer
from workers.agent.identity import Credentials
from workers.agent.jobs import Node
from workers.assignments import jobs, scheduler
from workers.models import Assignment

pytestmark = pytest.mark.django_db
CONTENT = os.urandom(10_000)


@pytest.fixture
def alpha(alice: Any) -> Provider:
    return Provider(alice, "alpha")


@pytest.fixture
def running(alpha: Provider, bob: Any) -> Assignment:
    task: Task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    assignment = assign(task)
    assert alpha.client.post(alpha.url(assignment, "start/")).status_code == 200
    return assignment


def put(client: APIClient, url: str, data: bytes, content_range: str | None) -> Any:
    extra: dict[str, Any] = {"HTTP_CONTENT_RANGE": content_range} if content_range else {}
    return client.put(
        url,
        data=data,
        content_type="application/octet-stream",
        HTTP_CONTENT_DISPOSITION='attachment; filename="product.safetensors"',
        **extra,
    )


def stored(assignment: Assignment) -> bytes | None:
    path = jobs.artifact_path(assignment, "product.safetensors")
    if not default_storage.exists(path):
        return None
    with default_storage.open(path, "rb") as handle:
        return bytes(handle.read())


def test_parts_in_order_make_the_artifact_only_at_the_end(alpha: Provider, running: Assignment) -> None:
    url = alpha.url(running, "artifacts/product.safetensors/")
    total = len(CONTENT)
    first = put(alpha.client, url, CONTENT[:4000], f"bytes 0-3999/{total}")
    assert first.status_code == 202, first.json()
    assert first.json() == {"name": "product.safetensors", "received": 4000, "size_bytes": total, "complete": False}
    assert stored(running) is None  # half a file is never visible under the artifact's name

    # A part that does not follow is refused, saying where to continue; nothing changes.
    skipped = put(alpha.client, url, CONTENT[8000:], f"bytes 8000-9999/{total}")
    assert skipped.status_code == 409
    assert skipped.json() == {"Content-Range": ["Expected the part that starts at byte 4000."], "received": 4000}

    assert put(alpha.client, url, CONTENT[4000:8000], f"bytes 4000-7999/{total}").status_code == 202
    last = put(alpha.client, url, CONTENT[8000:], f"bytes 8000-9999/{total}")
    assert last.status_code == 201, last.json()
    assert last.json()["complete"] is True
    assert stored(running) == CONTENT


def test_start_zero_begins_again_and_a_whole_put_still_works(alpha: Provider, running: Assignment) -> None:
    url = alpha.url(running, "artifacts/product.safetensors/")
    total = len(CONTENT)
    assert put(alpha.client, url, b"\0" * 4000, f"bytes 0-3999/{total}").status_code == 202
    assert put(alpha.client, url, CONTENT[:6000], f"bytes 0-5999/{total}").status_code == 202
    assert put(alpha.client, url, CONTENT[6000:], f"bytes 6000-9999/{total}").status_code == 201
    assert stored(running) == CONTENT

    whole = put(alpha.client, url, CONTENT[::-1], None)
    assert whole.status_code == 201
    assert stored(running) == CONTENT[::-1]


@pytest.mark.parametrize(
    ("content_range", "size", "field", "words"),
    [
        ("bytes=0-9/10", 10, "Content-Range", "bytes START-END/TOTAL"),
        ("bytes 5-4/10", 10, "Content-Range", "START ≤ END < TOTAL"),
        ("bytes 0-10/10", 11, "Content-Range", "START ≤ END < TOTAL"),
        ("bytes 0-9/100", 4, "Content-Range", "holds 4 bytes"),
        ("bytes 0-9/999999999999", 10, "file", "larger than"),
    ],
)
def test_bad_ranges_are_named(
    alpha: Provider, running: Assignment, content_range: str, size: int, field: str, words: str
) -> None:
    response = put(alpha.client, alpha.url(running, "artifacts/product.safetensors/"), b"x" * size, content_range)
    assert response.status_code == 400
    assert words in response.json()[field][0]
    assert stored(running) is None


def test_the_agent_uploads_a_large_artifact_in_parts(
    alpha: Provider, running: Assignment, live_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transfer, "UPLOAD_PART", 3000)  # 10,000 bytes: four parts, the last short
    monkeypatch.setattr(transfer, "UPLOAD_CHUNK", 1024)
    artifact = tmp_path / "product.safetensors"
    artifact.write_bytes(CONTENT)
    creds = Credentials(
        server=live_server.url, worker_id=str(alpha.worker.pk), address=alpha.key.address, token=alpha.token
    )
    node = Node(alpha.key, creds, live_server.url)
    try:
        response = node.upload(
            f"/api/v1/assignments/{running.pk}/artifacts/product.safetensors/", artifact.name, artifact
        )
    finally:
        node.http.close()
    assert response.status_code == 201, response.text
    assert response.json() == {
        "name": "product.safetensors",
        "received": 10_000,
        "size_bytes": 10_000,
        "complete": True,
    }
    assert stored(running) == CONTENT


def test_an_expired_assignment_loses_what_it_uploaded(
    alpha: Provider, running: Assignment, django_capture_on_commit_callbacks: Any
) -> None:
    """Nothing an expired assignment uploaded will be verified or handed out: its artifacts
    and unfinished parts are deleted, whether the node gave up or went silent."""
    from datetime import timedelta

    from django.utils import timezone

    url = alpha.url(running, "artifacts/product.safetensors/")
    assert put(alpha.client, url, CONTENT[:4000], f"bytes 0-3999/{len(CONTENT)}").status_code == 202
    folder = Path(default_storage.path(f"artifacts/{running.pk}"))
    assert any(folder.iterdir())
    with django_capture_on_commit_callbacks(execute=True):
        response = alpha.client.post(alpha.url(running, "fail/"), {"reason": "out of memory"}, format="json")
    assert response.status_code == 200
    assert not folder.exists()

    # The task went back to open; another node takes it, uploads whole, then goes silent.
    beta = Provider(alpha.worker.owner, "beta")
    (second,) = scheduler.schedule(running.task_id)
    assert second.worker == beta.worker
    assert beta.client.post(beta.url(second, "start/")).status_code == 200
    assert put(beta.client, beta.url(second, "artifacts/product.safetensors/"), CONTENT, None).status_code == 201
    assert stored(second) == CONTENT
    type(beta.worker).objects.filter(pk=beta.worker.pk).update(last_heartbeat_at=timezone.now() - timedelta(hours=1))
    with django_capture_on_commit_callbacks(execute=True):
        assert scheduler.expire_overdue() == 1
    assert stored(second) is None
    assert not Path(default_storage.path(f"artifacts/{second.pk}")).exists()


def test_the_last_part_sent_again_after_a_lost_answer_is_not_a_restart(alpha: Provider, running: Assignment) -> None:
    url = alpha.url(running, "artifacts/product.safetensors/")
    total = len(CONTENT)
    assert put(alpha.client, url, CONTENT[:6000], f"bytes 0-5999/{total}").status_code == 202
    assert put(alpha.client, url, CONTENT[6000:], f"bytes 6000-9999/{total}").status_code == 201
    again = put(alpha.client, url, CONTENT[6000:], f"bytes 6000-9999/{total}")
    assert again.status_code == 201
    assert again.json()["complete"] is True
    assert stored(running) == CONTENT


def test_submitting_closes_the_artifacts(alpha: Provider, bob: Any, tmp_path: Path) -> None:
    """Unfinished parts go with the submission, and nothing is written after it."""
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    assignment = assign(task)
    body = alpha.run_job(assignment, tmp_path)
    url = alpha.url(assignment, "artifacts/product.safetensors/")
    product = stored(assignment)
    assert product is not None
    assert put(alpha.client, url, b"x" * 100, "bytes 0-99/1000").status_code == 202  # a stray part sequence
    assert alpha.submit(assignment, body).status_code == 202
    folder = Path(default_storage.path(f"artifacts/{assignment.pk}"))
    assert sorted(p.name for p in folder.iterdir()) == ["product.safetensors"]
    late = put(alpha.client, url, b"y" * 100, None)
    assert late.status_code == 409
    assert late.json() == {
        "state": ["This assignment is submitted; artifacts are closed."],
        "assignment_state": "submitted",
    }
    assert stored(assignment) == product
