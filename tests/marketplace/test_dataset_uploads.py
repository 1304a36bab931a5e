"""Datasets uploaded in ordered parts (``/api/v1/dataset-uploads/``): the protocol of the
workers' artifact parts, ending in the same checks and Dataset a single upload gets."""

from __future__ import annotations

import hashlib
import io
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from django.conf import settings
from django.utils import timezone
from rest_framework.test import APIClient

from marketplace import dataset_uploads
from marketplace.datasets import embeddings_shape
from marketplace.models import Dataset, DatasetUpload
from marketplace.tasks import expire_dataset_uploads
from tests.factories import upload

pytestmark = pytest.mark.django_db

UPLOADS = "/api/v1/dataset-uploads/"
PART = 64 * 1024


@pytest.fixture(autouse=True)
def _small_parts(settings: Any) -> None:
    settings.DATASET_UPLOAD_PART_BYTES = PART


def embeddings(rows: int = 300, cols: int = 128, seed: int = 0) -> bytes:
    """A real .npy of float32 rows, about 150 KiB: three parts of 64 KiB."""
    buf = io.BytesIO()
    np.save(buf, np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32))
    return buf.getvalue()


def begin(client: APIClient, content: bytes, **extra: Any) -> str:
    response = client.post(UPLOADS, {"size_bytes": len(content), "filename": "rows.npy", **extra}, format="json")
    assert response.status_code == 201, response.json()
    return str(response.json()["id"])


def put(client: APIClient, upload_id: str, data: bytes, start: int, total: int, content_range: str = "") -> Any:
    header = content_range or f"bytes {start}-{start + len(data) - 1}/{total}"
    return client.put(
        f"{UPLOADS}{upload_id}/", data=data, content_type="application/octet-stream", HTTP_CONTENT_RANGE=header
    )


def send_all(client: APIClient, upload_id: str, content: bytes) -> Any:
    response = None
    for start in range(0, len(content), PART):
        response = put(client, upload_id, content[start : start + PART], start, len(content))
    return response


def received(client: APIClient, upload_id: str) -> int:
    return int(client.get(f"{UPLOADS}{upload_id}/").json()["received"])


def stored_files(folder: str = "") -> list[Path]:
    root = Path(settings.MEDIA_ROOT) / folder
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


def test_parts_in_order_make_the_same_dataset_as_the_file(alice: Any, alice_client: APIClient) -> None:
    content = embeddings()
    created = alice_client.post(UPLOADS, {"size_bytes": len(content), "name": " rows "}, format="json")
    assert created.status_code == 201
    assert created.json()["received"] == 0
    assert created.json()["part_bytes"] == PART
    assert created.json()["dataset"] is None
    upload_id = created.json()["id"]

    answers = [put(alice_client, upload_id, content[s : s + PART], s, len(content)) for s in (0, PART)]
    assert [a.status_code for a in answers] == [202, 202]
    assert answers[1].json() == {"received": 2 * PART, "size_bytes": len(content), "complete": False}
    # Not a dataset yet: no row, nothing in the datasets folder.
    assert not Dataset.objects.exists()
    assert stored_files("datasets") == []
    assert received(alice_client, upload_id) == 2 * PART

    last = put(alice_client, upload_id, content[2 * PART :], 2 * PART, len(content))
    assert last.status_code == 201, last.json()
    body = last.json()
    assert (body["name"], body["format"], body["size_bytes"]) == ("rows", "npy", len(content))
    assert body["sha256"] == hashlib.sha256(content).hexdigest()
    dataset = Dataset.objects.get(pk=body["id"], owner=alice)
    assert Path(dataset.file.path).read_bytes() == content
    with dataset.file.open("rb") as handle:
        assert embeddings_shape(handle, "npy") == ([300, 128], "float")
    # The bytes moved into the datasets folder; nothing is left beside them.
    assert stored_files() == [Path(dataset.file.path)]
    state = alice_client.get(f"{UPLOADS}{upload_id}/").json()
    assert (state["received"], state["dataset"]) == (len(content), body["id"])
    assert alice_client.get(f"/api/v1/datasets/{body['id']}/").json()["sha256"] == body["sha256"]


def test_parts_sent_with_an_api_token(alice: Any, alice_token_client: APIClient) -> None:
    content = embeddings(seed=3)
    response = send_all(alice_token_client, begin(alice_token_client, content), content)
    assert response.status_code == 201
    assert Dataset.objects.get().owner == alice


def test_a_part_that_does_not_follow_is_409_with_received(alice_client: APIClient) -> None:
    content = embeddings()
    upload_id = begin(alice_client, content)
    assert put(alice_client, upload_id, content[:PART], 0, len(content)).status_code == 202
    for start in (2 * PART, PART // 2):  # a gap, an overlap
        refused = put(alice_client, upload_id, content[start : start + 100], start, len(content))
        assert refused.status_code == 409
        assert refused.json() == {"Content-Range": [f"Expected the part that starts at byte {PART}."], "received": PART}
    assert received(alice_client, upload_id) == PART
    # The client continues from `received`.
    rest = [put(alice_client, upload_id, content[s : s + PART], s, len(content)) for s in (PART, 2 * PART)]
    assert rest[-1].status_code == 201
    assert Path(Dataset.objects.get().file.path).read_bytes() == content


def test_start_0_begins_again(alice_client: APIClient) -> None:
    first, second = embeddings(seed=1), embeddings(seed=2)
    assert len(first) == len(second)
    upload_id = begin(alice_client, first)
    put(alice_client, upload_id, first[:PART], 0, len(first))
    put(alice_client, upload_id, first[PART : 2 * PART], PART, len(first))
    again = put(alice_client, upload_id, second[:PART], 0, len(second))
    assert again.json()["received"] == PART
    done = [put(alice_client, upload_id, second[s : s + PART], s, len(second)) for s in (PART, 2 * PART)]
    assert done[-1].status_code == 201
    assert done[-1].json()["sha256"] == hashlib.sha256(second).hexdigest()


def test_the_last_part_sent_again_is_answered_as_complete(alice_client: APIClient) -> None:
    content = embeddings()
    upload_id = begin(alice_client, content)
    first = send_all(alice_client, upload_id, content)
    again = put(alice_client, upload_id, content[2 * PART :], 2 * PART, len(content))
    assert again.status_code == 201
    assert again.json()["id"] == first.json()["id"]
    assert Dataset.objects.count() == 1
    late = put(alice_client, upload_id, content[:PART], 0, len(content))
    assert late.status_code == 409
    assert late.json() == {
        "Content-Range": ["This upload is complete; it takes no more parts."],
        "received": len(content),
    }
    assert Dataset.objects.count() == 1


@pytest.mark.parametrize(
    ("header", "data", "words"),
    [
        (None, b"x" * 10, "Send each part with 'Content-Range: bytes START-END/TOTAL'."),
        ("items 0-9/1000", b"x" * 10, "Expected 'bytes START-END/TOTAL'."),
        ("bytes 9-0/1000", b"x" * 10, "Needs START ≤ END < TOTAL."),
        ("bytes 0-9/999", b"x" * 10, "TOTAL is 999; this upload was declared as 1000 bytes."),
        ("bytes 0-19/1000", b"x" * 10, "The part holds 10 bytes; the range names 20."),
    ],
)
def test_a_bad_content_range_is_400_naming_the_header(
    alice_client: APIClient, header: str | None, data: bytes, words: str
) -> None:
    upload_id = begin(alice_client, b"a,b\n" * 250)
    extra: dict[str, Any] = {} if header is None else {"HTTP_CONTENT_RANGE": header}
    response = alice_client.put(f"{UPLOADS}{upload_id}/", data=data, content_type="application/octet-stream", **extra)
    assert response.status_code == 400
    assert response.json() == {"Content-Range": [words]}
    assert received(alice_client, upload_id) == 0


def test_a_part_over_the_part_limit_is_413_naming_the_header(alice_client: APIClient) -> None:
    content = embeddings()
    upload_id = begin(alice_client, content)
    response = put(alice_client, upload_id, content[: PART + 1], 0, len(content))
    assert response.status_code == 413
    assert response.json() == {"Content-Range": [f"A part holds at most {PART} bytes; this range names {PART + 1}."]}
    assert received(alice_client, upload_id) == 0


def test_a_part_without_its_length_is_411(alice: Any) -> None:
    upload_id = DatasetUpload.objects.create(
        owner=alice, name="x", size_bytes=10, expires_at=timezone.now() + timedelta(hours=1)
    ).pk
    with pytest.raises(dataset_uploads.LengthRequired) as refused:
        dataset_uploads.receive_part(alice, upload_id, io.BytesIO(b"0123456789"), "bytes 0-9/10", None)
    assert refused.value.detail == {"Content-Length": ["Send the part's length."]}


@pytest.mark.parametrize(
    ("size", "words"),
    [(1001, "The file is 1001 bytes; the limit is 1000 bytes."), (0, "The file is empty."), ("big", "A valid integer")],
)
def test_a_size_the_dataset_limit_refuses_is_refused_at_creation(
    alice_client: APIClient, settings: Any, size: Any, words: str
) -> None:
    settings.DATASET_MAX_BYTES = 1000
    response = alice_client.post(UPLOADS, {"size_bytes": size, "filename": "x.npy"}, format="json")
    assert response.status_code == 400
    assert words in response.json()["size_bytes"][0]
    assert not DatasetUpload.objects.exists()


def test_unfinished_uploads_per_user_are_capped(alice_client: APIClient, bob_client: APIClient) -> None:
    for _ in range(dataset_uploads.MAX_OPEN_UPLOADS):
        begin(alice_client, b"x" * 10)
    refused = alice_client.post(UPLOADS, {"size_bytes": 10}, format="json")
    assert refused.status_code == 400
    assert refused.json() == {"non_field_errors": ["At most 10 unfinished uploads; finish or delete one first."]}
    begin(bob_client, b"x" * 10)  # another user's count is their own


def test_another_users_upload_is_404_and_anonymous_is_401(
    alice_client: APIClient, bob_client: APIClient, anon_client: APIClient
) -> None:
    content = embeddings()
    upload_id = begin(alice_client, content)
    put(alice_client, upload_id, content[:PART], 0, len(content))
    assert bob_client.get(f"{UPLOADS}{upload_id}/").status_code == 404
    assert put(bob_client, upload_id, content[PART : 2 * PART], PART, len(content)).status_code == 404
    assert bob_client.delete(f"{UPLOADS}{upload_id}/").status_code == 404
    assert put(anon_client, upload_id, content[PART : 2 * PART], PART, len(content)).status_code == 401
    assert anon_client.post(UPLOADS, {"size_bytes": 10}, format="json").status_code == 401
    assert received(alice_client, upload_id) == PART


def test_a_file_that_is_not_a_dataset_is_refused_after_its_first_part(alice_client: APIClient) -> None:
    garbage = bytes(range(256)) * 1024  # 256 KiB of binary with NUL bytes: no supported format
    single = alice_client.post("/api/v1/datasets/", {"file": upload(garbage)}, format="multipart")
    assert single.status_code == 400
    upload_id = begin(alice_client, garbage)
    refused = put(alice_client, upload_id, garbage[:PART], 0, len(garbage))
    # The same field and words as a single upload, long before the rest is sent.
    assert refused.status_code == 400
    assert refused.json() == single.json()
    assert "Unsupported file type" in refused.json()["file"][0]
    assert not Dataset.objects.exists()
    assert stored_files() == []
    assert alice_client.get(f"{UPLOADS}{upload_id}/").status_code == 404


def test_a_file_refused_when_complete_leaves_nothing_behind(alice_client: APIClient, settings: Any) -> None:
    settings.DATASET_UPLOAD_PART_BYTES = part = 4096
    broken = b'{"rows": [' + b"1, " * 10_000  # 30 KB of JSON that does not parse: whether it does needs all of it
    upload_id = begin(alice_client, broken)
    answers = [put(alice_client, upload_id, broken[s : s + part], s, len(broken)) for s in range(0, len(broken), part)]
    assert len(answers) == 8
    assert [a.status_code for a in answers[:-1]] == [202] * (len(answers) - 1)
    # Decided on the whole file, as a single upload decides it.
    assert answers[-1].status_code == 400
    single = alice_client.post("/api/v1/datasets/", {"file": upload(broken)}, format="multipart")
    assert answers[-1].json() == single.json()
    assert not Dataset.objects.exists()
    assert stored_files() == []
    assert not DatasetUpload.objects.exists()


def test_abandoning_an_upload_deletes_its_bytes(alice_client: APIClient) -> None:
    content = embeddings()
    upload_id = begin(alice_client, content)
    put(alice_client, upload_id, content[:PART], 0, len(content))
    assert stored_files("dataset-uploads")
    assert alice_client.delete(f"{UPLOADS}{upload_id}/").status_code == 204
    assert stored_files() == []
    assert put(alice_client, upload_id, content[PART : 2 * PART], PART, len(content)).status_code == 404


def test_expired_uploads_lose_their_bytes(alice_client: APIClient) -> None:
    content = embeddings()
    unfinished, finished = begin(alice_client, content), begin(alice_client, content)
    put(alice_client, unfinished, content[:PART], 0, len(content))
    dataset_id = send_all(alice_client, finished, content).json()["id"]
    kept = begin(alice_client, content)
    put(alice_client, kept, content[:PART], 0, len(content))
    past = timezone.now() - timedelta(seconds=1)
    DatasetUpload.objects.filter(pk__in=[unfinished, finished]).update(expires_at=past)
    # Expired is gone for its owner at once, before the periodic task runs.
    assert put(alice_client, unfinished, content[PART : 2 * PART], PART, len(content)).status_code == 404

    assert expire_dataset_uploads() == 2
    assert set(DatasetUpload.objects.values_list("pk", flat=True)) == {dataset_uploads.UUID(kept)}
    assert [p.name for p in stored_files("dataset-uploads") if p.suffix == ".part"] == [f"{kept}.part"]
    assert Dataset.objects.filter(pk=dataset_id).exists()  # a finished upload's dataset stays
    assert expire_dataset_uploads() == 0


def test_the_expiry_runs_on_the_beat_schedule() -> None:
    scheduled = [entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()]
    assert "marketplace.expire_dataset_uploads" in scheduled
    assert expire_dataset_uploads.name == "marketplace.expire_dataset_uploads"


def test_a_server_failure_at_completion_loses_nothing_and_the_last_part_retries(
    alice_client: APIClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The insert fails after the file was moved into place (the database went away):
    the bytes go back, the upload stays, and sending the last part again completes it."""
    from django.db import OperationalError

    content = embeddings()
    upload_id = begin(alice_client, content)
    real_save = Dataset.save
    calls = {"n": 0}

    def failing_save(self: Dataset, *args: Any, **kwargs: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise OperationalError("database is locked")
        real_save(self, *args, **kwargs)

    monkeypatch.setattr(Dataset, "save", failing_save)
    alice_client.raise_request_exception = False
    last = (len(content) - 1) // PART * PART
    for start in range(0, last, PART):
        assert put(alice_client, upload_id, content[start : start + PART], start, len(content)).status_code == 202
    assert put(alice_client, upload_id, content[last:], last, len(content)).status_code == 500
    assert not Dataset.objects.exists()
    assert received(alice_client, upload_id) == len(content)
    assert [p.name for p in stored_files("datasets")] == []

    again = put(alice_client, upload_id, content[last:], last, len(content))
    assert again.status_code == 201
    dataset = Dataset.objects.get(pk=again.json()["id"])
    assert dataset.file.read() == content
    assert stored_files("dataset-uploads") == []


def test_leftover_lock_and_part_files_without_an_upload_are_swept(alice_client: APIClient) -> None:
    import os
    import time

    folder = Path(settings.MEDIA_ROOT) / "dataset-uploads"
    folder.mkdir(parents=True, exist_ok=True)
    stale = time.time() - settings.DATASET_UPLOAD_TTL - 60
    orphans = [
        folder / f"{dataset_uploads.UUID(int=i)}{suffix}" for i, suffix in enumerate([".lock", ".part", ".keep"])
    ]
    for orphan in orphans:
        orphan.write_bytes(b"x")
        os.utime(orphan, (stale, stale))
    content = embeddings()
    live = begin(alice_client, content)
    put(alice_client, live, content[:PART], 0, len(content))
    expire_dataset_uploads()
    assert sorted(p.name for p in stored_files("dataset-uploads")) == [f"{live}.lock", f"{live}.part"]
