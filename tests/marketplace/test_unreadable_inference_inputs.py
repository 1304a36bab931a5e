"""Inference inputs that upload fine but that no worker could read are refused when the task
is quoted or posted: a 400 naming the dataset and the reason, never a 500 and never a task
that every worker then fails. Nothing is written: no task, no event, no escrow.

asl_inference: a zip whose train.csv is damaged (bad CRC, encrypted, an unknown compression
method, corrupt or cut-short data) or holds a field over the csv module's limit.
cube_inference: a safetensors file whose header the workers' loader
(``safetensors.numpy.load_file``) refuses although its embeddings tensor looks right.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rest_framework.test import APIClient

from ledger import services as ledger
from ledger.models import Account, AccountKind, Transaction
from marketplace.datasets import embeddings_shape
from marketplace.models import Task, TaskEvent, TaskStatus
from tests.factories import make_dataset, post_task
from tests.marketplace.test_source_task import completed, inference
from tests.training.damaged_zips import DAMAGES, INDEX_HEADER, archive, damaged, words
from training.cube.data import CubeDataError, load_array

pytestmark = pytest.mark.django_db

TASKS = "/api/v1/tasks/"
DIM = 32


def written(owner: Any) -> tuple[int, ...]:
    """What posting a task writes: tasks, their events, escrow accounts, ledger
    transactions, and the owner's balance."""
    return (
        Task.objects.count(),
        TaskEvent.objects.count(),
        Account.objects.filter(kind=AccountKind.ESCROW).count(),
        Transaction.objects.count(),
        ledger.balance(owner),
    )


def refusals(client: APIClient, owner: Any, body: dict[str, Any]) -> list[list[str]]:
    """The ``dataset`` errors of quoting and of posting ``body``: both 400s, writing nothing."""
    before = written(owner)
    errors = []
    for url in (f"{TASKS}quote/", TASKS):
        response = client.post(url, body, format="json")
        assert response.status_code == 400, response.json()
        assert list(response.json()) == ["dataset"], response.json()
        errors.append(response.json()["dataset"])
    assert written(owner) == before
    return errors


# --- asl_inference: a damaged train.csv ------------------------------------------------------

SEQUENCES = {"train.csv": INDEX_HEADER + b"a.parquet,1,2,hello\n", "a.parquet": b"not read at posting"}


@pytest.fixture
def asl_source(alice: Any) -> Task:
    source = completed(post_task(alice, "synthetic", {"n": 64}))
    Task.objects.filter(pk=source.pk).update(kind="asl_training")
    return source


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_train_csv_is_a_400_naming_the_dataset(
    alice: Any, alice_client: APIClient, asl_source: Task, damage: str
) -> None:
    dataset = make_dataset(alice, damaged(SEQUENCES, "train.csv", damage), "in.zip")
    for errors in refusals(alice_client, alice, inference("asl_inference", dataset, asl_source)):
        assert len(errors) == 1
        assert errors[0].startswith(f"in.zip: train.csv: {words(damage)}"), errors


def test_a_train_csv_field_over_the_csv_limit_is_a_400_naming_the_line(
    alice: Any, alice_client: APIClient, asl_source: Task
) -> None:
    index = INDEX_HEADER + b"a" * 131_073 + b".parquet,1,2,hello\n"
    dataset = make_dataset(alice, archive({**SEQUENCES, "train.csv": index}), "in.zip")
    refused = ["in.zip: train.csv line 2: is not valid CSV (field larger than field limit (131072))."]
    assert refusals(alice_client, alice, inference("asl_inference", dataset, asl_source)) == [refused] * 2


def test_the_same_archive_undamaged_is_taken(alice: Any, alice_client: APIClient, asl_source: Task) -> None:
    dataset = make_dataset(alice, archive(SEQUENCES), "in.zip")
    body = inference("asl_inference", dataset, asl_source)
    assert alice_client.post(f"{TASKS}quote/", body, format="json").status_code == 200
    response = alice_client.post(TASKS, body, format="json")
    assert response.status_code == 201, response.json()
    assert Task.objects.get(pk=response.json()["id"]).status == TaskStatus.OPEN


# --- cube_inference: a safetensors header the workers' loader refuses --------------------------


def raw_header(raw: bytes, data: bytes) -> bytes:
    """A safetensors file of the header bytes ``raw``, then ``data``."""
    return struct.pack("<Q", len(raw)) + raw + data


def safetensors(header: dict[str, Any], data: bytes, pad: int = 0) -> bytes:
    """A safetensors file written by hand: the header as given, then ``data``."""
    return raw_header(json.dumps(header).encode() + b" " * pad, data)


ROW = np.ones((1, DIM), dtype="<f4")  # 128 bytes
ROWS = np.arange(3 * DIM, dtype="<f4").reshape(3, DIM)  # 384 bytes


def f32(offsets: list[int], shape: list[int] | None = None) -> dict[str, Any]:
    return {"dtype": "F32", "shape": shape or [1, DIM], "data_offsets": offsets}


MALFORMED = {
    "negative data_offsets": (
        safetensors({"embeddings": f32([-64, 64])}, ROW.tobytes()),
        "the data_offsets of tensor 'embeddings' are not a pair of non-negative integers",
    ),
    "a gap before the data": (
        safetensors({"embeddings": f32([64, 192])}, bytes(64) + ROW.tobytes()),
        "the data of tensor 'embeddings' starts at byte 64, not 0: tensors must lie back to back",
    ),
    "trailing bytes": (
        safetensors({"embeddings": f32([0, 128])}, ROW.tobytes() + bytes(16)),
        "bytes, 16 more than its header and tensors (the last must end it)",
    ),
    "a number in __metadata__": (
        safetensors({"__metadata__": {"rows": 1}, "embeddings": f32([0, 128])}, ROW.tobytes()),
        "the safetensors __metadata__ must map strings to strings",
    ),
    "a second tensor overlapping the first": (
        safetensors({"embeddings": f32([0, 128]), "targets": f32([64, 192])}, ROW.tobytes() + bytes(64)),
        "the data of tensor 'targets' starts at byte 64, not 128: tensors must lie back to back",
    ),
}


def valid_layouts(tmp_path: Path) -> dict[str, bytes]:
    """Files the workers load, embeddings [3, DIM] among other tensors in several layouts."""
    from safetensors.numpy import save_file

    save_file({"embeddings": ROWS, "targets": ROWS[:, :8].astype("<f8")}, str(tmp_path / "two.safetensors"))
    labels = np.array([7, 8, 9], dtype="<u1")
    return {
        "one tensor": safetensors({"embeddings": f32([0, 384], [3, DIM])}, ROWS.tobytes()),
        "written by safetensors, with targets": (tmp_path / "two.safetensors").read_bytes(),
        # Embeddings after a 3-byte tensor (so unaligned), named out of offset order, with
        # metadata, an empty tensor and a header padded with spaces.
        "hand-laid, several tensors": safetensors(
            {
                "embeddings": f32([3, 387], [3, DIM]),
                "__metadata__": {"format": "np", "note": ""},
                "labels": {"dtype": "U8", "shape": [3], "data_offsets": [0, 3]},
                "empty": {"dtype": "F64", "shape": [0, 4], "data_offsets": [387, 387]},
            },
            labels.tobytes() + ROWS.tobytes(),
            pad=5,
        ),
        "metadata null": safetensors({"__metadata__": None, "embeddings": f32([0, 384], [3, DIM])}, ROWS.tobytes()),
    }


def loads_in_a_worker(content: bytes, folder: Path) -> bool:
    """Whether the workers' loader reads ``content`` as the inputs of cube_inference."""
    path = folder / "dataset.safetensors"
    path.write_bytes(content)
    try:
        load_array(path, "embeddings")
    except CubeDataError:
        return False
    return True


@pytest.fixture
def cube_source(alice: Any) -> Task:
    return completed(post_task(alice, "cube_training", {"teacher_dim": DIM, "synthetic_samples": 64}))


@pytest.mark.parametrize("case", MALFORMED)
def test_a_safetensors_header_the_workers_refuse_is_a_400_naming_the_dataset(
    alice: Any, alice_client: APIClient, cube_source: Task, tmp_path: Path, case: str
) -> None:
    content, problem = MALFORMED[case]
    assert not loads_in_a_worker(content, tmp_path)
    dataset = make_dataset(alice, content, "in.safetensors")
    for errors in refusals(alice_client, alice, inference("cube_inference", dataset, cube_source)):
        assert len(errors) == 1
        assert errors[0].startswith("in.safetensors: "), errors
        assert problem in errors[0], errors


def test_safetensors_files_the_workers_load_are_taken(
    alice: Any, alice_client: APIClient, cube_source: Task, tmp_path: Path
) -> None:
    for layout, content in valid_layouts(tmp_path).items():
        assert loads_in_a_worker(content, tmp_path), layout
        dataset = make_dataset(alice, content, "in.safetensors")
        body = inference("cube_inference", dataset, cube_source)
        response = alice_client.post(f"{TASKS}quote/", body, format="json")
        assert response.status_code == 200, (layout, response.json())
    response = alice_client.post(TASKS, body, format="json")
    assert response.status_code == 201, response.json()


# Headers Python's json reads one way and the library another, or that the library reads
# but numpy cannot hold: the check must refuse each as the loader does.
E = f32([0, 128])
DIVERGENT = {
    "a BF16 tensor beside": (
        safetensors({"embeddings": E, "t": {"dtype": "BF16", "shape": [2], "data_offsets": [128, 132]}}, bytes(132)),
        "tensor 't' has dtype 'BF16', which workers cannot load",
    ),
    "an unknown dtype": (
        safetensors({"embeddings": E, "t": {"dtype": "F9", "shape": [1], "data_offsets": [128, 129]}}, bytes(129)),
        "tensor 't' has dtype 'F9'",
    ),
    "offset -0": (
        raw_header(b'{"embeddings":{"dtype":"F32","shape":[1,32],"data_offsets":[-0,128]}}', bytes(128)),
        "the data_offsets of tensor 'embeddings' are not a pair of non-negative integers",
    ),
    "NaN in the header": (
        safetensors({"embeddings": {**E, "shape": [1, float("nan")]}}, bytes(128)),
        "the safetensors header is not JSON",
    ),
    "a lone surrogate in a key": (
        safetensors({"embeddings": E, "\ud800": E}, bytes(128)),
        "the safetensors header holds a key that is not valid Unicode",
    ),
    "a shape overflowing a u64": (
        safetensors({"embeddings": E, "t": f32([128, 128], [2**63, 2**63, 0])}, bytes(128)),
        "the shape of tensor 't' is too large",
    ),
    "a header not UTF-8": (
        raw_header(b'{"\xff": 1}', b""),
        "the safetensors header is not UTF-8 text",
    ),
    "a tensor entry not an object": (
        safetensors({"embeddings": E, "t": 5}, bytes(128)),
        "the header entry of tensor 't' is not a JSON object",
    ),
    "a span unlike the shape": (
        safetensors({"embeddings": f32([0, 124])}, bytes(124)),
        "the data_offsets of tensor 'embeddings' span 124 bytes, its shape and dtype 128",
    ),
}


@pytest.mark.parametrize("case", DIVERGENT)
def test_the_header_check_refuses_what_the_loader_refuses(tmp_path: Path, case: str) -> None:
    content, problem = DIVERGENT[case]
    assert not loads_in_a_worker(content, tmp_path)
    path = tmp_path / "in.safetensors"
    path.write_bytes(content)
    with path.open("rb") as handle, pytest.raises(ValueError, match=f"^{re.escape(problem)}"):
        embeddings_shape(handle, "safetensors")


def test_the_header_check_reads_only_the_header(tmp_path: Path) -> None:
    # The check seeks to the end for the file's size, but reads only the header.
    path = tmp_path / "big.safetensors"
    rows = 100_000
    header = json.dumps({"embeddings": f32([0, rows * DIM * 4], [rows, DIM])}).encode()
    with path.open("wb") as out:
        out.write(struct.pack("<Q", len(header)) + header)
        out.truncate(8 + len(header) + rows * DIM * 4)

    class Counting:
        def __init__(self, handle: Any) -> None:
            self.handle, self.read_bytes = handle, 0

        def read(self, n: int = -1) -> bytes:
            data = self.handle.read(n)
            self.read_bytes += len(data)
            return bytes(data)

        def seek(self, offset: int, whence: int = 0) -> int:
            return int(self.handle.seek(offset, whence))

    with path.open("rb") as handle:
        counting = Counting(handle)
        assert embeddings_shape(counting, "safetensors") == ([rows, DIM], "float")  # type: ignore[arg-type]
    assert counting.read_bytes == 8 + len(header)
