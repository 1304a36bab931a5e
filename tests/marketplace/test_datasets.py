"""Datasets: multipart upload with size limit, type sniffing and sha256; list, retrieve,
and delete only when no task uses them."""

from __future__ import annotations

import hashlib
import io
import json
import struct
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from marketplace.datasets import clean_name, sniff_format
from marketplace.models import Dataset
from tests.factories import make_dataset, npy_bytes, post_task, upload, zip_bytes

pytestmark = pytest.mark.django_db

DATASETS = "/api/v1/datasets/"


def safetensors_bytes() -> bytes:
    header = json.dumps({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    return struct.pack("<Q", len(header)) + header + b"\x00\x00\x80\x3f"


def parquet_bytes() -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.table({"sign": ["hello", "bye"]}), buf)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("content", "filename", "fmt"),
    [
        (npy_bytes(), "x.npy", "npy"),
        (zip_bytes(), "islr.zip", "zip"),
        (safetensors_bytes(), "m.safetensors", "safetensors"),
        (b"a,b\n1,2\n", "t.csv", "csv"),
        (b'{"a": [1, 2]}', "d.json", "json"),
        ("naïve text\n".encode(), "notes.txt", "text"),
    ],
)
def test_upload_sniffs_the_format_from_content(
    alice: Any, alice_client: APIClient, content: bytes, filename: str, fmt: str
) -> None:
    # The filename's extension is deliberately ignored: only the bytes decide.
    response = alice_client.post(DATASETS, {"file": upload(content, filename + ".bin")}, format="multipart")
    assert response.status_code == 201, response.json()
    data = response.json()
    assert data["format"] == fmt
    assert data["size_bytes"] == len(content)
    assert data["sha256"] == hashlib.sha256(content).hexdigest()
    assert data["name"] == filename + ".bin"
    assert data["in_use"] is False
    dataset = Dataset.objects.get(pk=data["id"])
    assert dataset.owner == alice
    stored = Path(dataset.file.path)
    assert stored.read_bytes() == content
    # The client's filename never reaches the disk.
    assert filename not in stored.name
    assert stored.is_relative_to(Path(settings.MEDIA_ROOT))


def test_upload_of_parquet(alice_client: APIClient) -> None:
    response = alice_client.post(DATASETS, {"file": upload(parquet_bytes(), "s.parquet")}, format="multipart")
    assert response.status_code == 201
    assert response.json()["format"] == "parquet"


def test_upload_takes_an_explicit_name_and_strips_paths(alice_client: APIClient) -> None:
    named = alice_client.post(DATASETS, {"file": upload(npy_bytes()), "name": " embeddings "}, format="multipart")
    assert named.json()["name"] == "embeddings"
    sneaky = alice_client.post(DATASETS, {"file": upload(npy_bytes(), "../../etc/passwd")}, format="multipart")
    assert sneaky.status_code == 201
    assert sneaky.json()["name"] == "passwd"
    assert clean_name("C:\\Users\\a\\data.npy") == "data.npy"
    assert clean_name("") == "dataset"


def test_list_and_retrieve_own_datasets(alice: Any, bob: Any, alice_client: APIClient) -> None:
    first = make_dataset(alice, name="first")
    make_dataset(alice, name="second")
    make_dataset(bob, name="bob's")
    post_task(alice, kind="cube_training", dataset=first.pk, budget=100 * 10**9)
    listing = alice_client.get(DATASETS)
    assert listing.status_code == 200
    assert [(d["name"], d["in_use"]) for d in listing.json()["results"]] == [("second", False), ("first", True)]
    detail = alice_client.get(f"{DATASETS}{first.pk}/")
    assert detail.status_code == 200
    assert detail.json()["in_use"] is True
    assert detail.json()["sha256"] == first.sha256
    ordered = alice_client.get(f"{DATASETS}?ordering=name").json()["results"]
    assert [d["name"] for d in ordered] == ["first", "second"]


def test_delete_an_unused_dataset_removes_row_and_file(
    alice: Any, alice_client: APIClient, django_capture_on_commit_callbacks: Any
) -> None:
    dataset = make_dataset(alice)
    path = Path(dataset.file.path)
    assert path.exists()
    # The file goes only once the row's deletion has committed.
    with django_capture_on_commit_callbacks(execute=True):
        response = alice_client.delete(f"{DATASETS}{dataset.pk}/")
    assert response.status_code == 204
    assert not Dataset.objects.filter(pk=dataset.pk).exists()
    assert not path.exists()


def test_delete_a_dataset_in_use_is_refused(alice: Any, alice_client: APIClient) -> None:
    dataset = make_dataset(alice)
    post_task(alice, kind="cube_training", dataset=dataset.pk, budget=100 * 10**9)
    response = alice_client.delete(f"{DATASETS}{dataset.pk}/")
    assert response.status_code == 400
    assert response.json() == {"dataset": ["In use by 1 task(s); it cannot be deleted."]}
    assert Dataset.objects.filter(pk=dataset.pk).exists()
    assert Path(dataset.file.path).exists()


# --- Bad uploads -----------------------------------------------------------------------


def assert_refused(response: Any, field: str, words: str) -> None:
    assert response.status_code == 400, response.content
    assert words in str(response.json()[field]), response.json()
    assert Dataset.objects.count() == 0
    media = Path(settings.MEDIA_ROOT)
    assert not media.exists() or not any(p.is_file() for p in media.rglob("*"))


def test_oversized_upload_is_refused(alice_client: APIClient, settings: Any) -> None:
    settings.DATASET_MAX_BYTES = 100
    response = alice_client.post(DATASETS, {"file": upload(npy_bytes())}, format="multipart")
    assert_refused(response, "file", "the limit is 100 bytes")


def test_empty_upload_is_refused(alice_client: APIClient) -> None:
    response = alice_client.post(DATASETS, {"file": upload(b"", "empty.npy")}, format="multipart")
    assert_refused(response, "file", "empty")


@pytest.mark.parametrize(
    "content",
    [
        b"\x7fELF\x02\x01\x01\x00" + b"\x00" * 64,
        b"\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00.",  # a pickle: never accepted
        bytes(range(256)) * 4,
        b"\xff\xfe\xfd\xfc garbage",
    ],
    ids=["elf", "pickle", "binary", "bad-utf8"],
)
def test_unsupported_file_types_are_refused(alice_client: APIClient, content: bytes) -> None:
    response = alice_client.post(DATASETS, {"file": upload(content, "x.npy")}, format="multipart")
    assert_refused(response, "file", "Unsupported file type")


def test_broken_json_is_refused(alice_client: APIClient) -> None:
    response = alice_client.post(DATASETS, {"file": upload(b'{"a": ', "x.json")}, format="multipart")
    assert_refused(response, "file", "does not parse")


def test_deeply_nested_json_is_refused_not_a_500(alice_client: APIClient) -> None:
    # json raises RecursionError, not ValueError, on ``[[[[…``.
    response = alice_client.post(DATASETS, {"file": upload(b"[" * 20_000, "x.json")}, format="multipart")
    assert_refused(response, "file", "nested too deeply")


def test_missing_file_is_refused(alice_client: APIClient) -> None:
    assert_refused(alice_client.post(DATASETS, {"name": "x"}, format="multipart"), "file", "No file")
    assert_refused(alice_client.post(DATASETS, {"file": "not a file"}, format="json"), "file", "not a file")


def test_an_over_long_name_is_refused(alice_client: APIClient) -> None:
    response = alice_client.post(DATASETS, {"file": upload(npy_bytes()), "name": "n" * 201}, format="multipart")
    assert_refused(response, "name", "200 characters")


def test_null_bytes_in_the_filename_never_reach_the_database(alice_client: APIClient) -> None:
    response = alice_client.post(DATASETS, {"file": upload(npy_bytes(), "a\x00b.npy")}, format="multipart")
    assert response.status_code in (201, 400)
    if response.status_code == 201:
        assert "\x00" not in response.json()["name"]


# --- Sniffing, unit level -----------------------------------------------------------------


def test_sniff_keeps_a_multibyte_character_cut_at_the_boundary() -> None:
    head = ("é" * 10).encode()[:-1]
    assert sniff_format(head, 10_000_000) == "text"


def test_sniff_safetensors_needs_a_plausible_header_length() -> None:
    fake = struct.pack("<Q", 10**12) + b'{"x": 1}'
    with pytest.raises(Exception, match="Unsupported"):
        sniff_format(fake, len(fake))


def test_a_dataset_deleted_while_a_task_is_posted_is_a_400(alice: Any, monkeypatch: Any) -> None:
    from rest_framework.exceptions import ValidationError

    from marketplace import services

    dataset = make_dataset(alice)
    real_check = services.check_task_request

    def check_then_lose_the_race(*args: Any) -> Any:
        # Simulates a concurrent delete landing between validation and the insert.
        result = real_check(*args)
        Dataset.objects.filter(pk=dataset.pk).delete()
        return result

    monkeypatch.setattr(services, "check_task_request", check_then_lose_the_race)
    with pytest.raises(ValidationError) as caught:
        post_task(alice, kind="cube_training", dataset=dataset.pk, budget=100 * 10**9)
    assert caught.value.detail == {"dataset": ["No such dataset among yours."]}
    from marketplace.models import Task

    assert Task.objects.count() == 0
