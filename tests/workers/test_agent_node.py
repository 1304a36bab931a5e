"""The node's job loop (workers/agent/jobs.py) when the platform misbehaves: it is down
for longer than one request's retries, an answer is lost, a download breaks off or does
not match, or what it sends must not be trusted (a foreign URL, an odd file format, a
transaction template that is not a plain SUBMIT_RESULT).

The platform here is a stand-in (``httpx.MockTransport``) answering as
workers/api/assignment_views.py does, because each test needs it to fail in one precise way
the real one cannot be made to; the real endpoints are covered by test_jobs.py and the
end-to-end tests. The computation is replaced by a tiny fixed artifact: what is under
test is everything around it. Sleeps run on a fake clock, so retries for an hour of
simulated time take milliseconds.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from protocol import keys
from training.asl.dataset import load_dataset
from training.asl.landmarks import selected_landmarks
from training.asl.split import prepare as prepare_asl
from training.asl.synthetic import generate
from training.virtualzip import materialise
from workers.agent import bar, jobs, runners, transfer
from workers.agent.identity import Credentials
from workers.agent.jobs import Node
from workers.agent.transfer import JobError

SERVER = "http://127.0.0.1:8000"
ASSIGNMENT = "7d8c6a4e-0000-4000-8000-000000000001"
TASK = "7d8c6a4e-0000-4000-8000-000000000002"
CHAIN = "proofwork-test-1"
DATA = b"x,y\n" + b"1,2\n" * 5000


class Clock:
    """Stands in for the ``time`` module in the node's jobs.py, transfer.py and bar.py:
    ``sleep`` only moves the clock on."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


Answer = Callable[[httpx.Request], httpx.Response]


@dataclass
class Platform:
    """The stand-in platform: default answers as the real one gives them, overridable per
    path suffix with a list of answers used in turn (the last one repeats)."""

    key: keys.KeyPair
    clock: Clock
    job: dict[str, Any] = field(default_factory=dict)
    answers: dict[str, list[Answer]] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    bodies: dict[str, list[Any]] = field(default_factory=dict)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        self.calls.append((request.method, str(request.url)))
        assert request.headers["Authorization"] == "Worker pww_test"
        if request.method == "POST" and request.content:
            self.bodies.setdefault(path.rstrip("/").rsplit("/", 1)[-1], []).append(json.loads(request.content))
        for suffix, queue in self.answers.items():
            if path.endswith(suffix):
                answer = queue.pop(0) if len(queue) > 1 else queue[0]
                return answer(request)
        return self.default(request)

    def default(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if request.method == "GET" and path == f"/api/v1/assignments/{ASSIGNMENT}/":
            return httpx.Response(200, json=self.job)
        if path.endswith("/dataset/"):
            return httpx.Response(200, content=DATA)
        if path.endswith("/start/"):
            return httpx.Response(200, json={"state": "running"})
        if "/artifacts/" in path:
            return httpx.Response(201, json={"complete": True})
        if path.endswith("/result/"):
            return httpx.Response(202, json={"state": "submitted"})
        if path.endswith("/fail/"):
            return httpx.Response(200, json={"state": "expired"})
        return httpx.Response(404, json={"detail": "Not found."})

    def paths(self, suffix: str) -> list[str]:
        return [url for _, url in self.calls if httpx.URL(url).path.endswith(suffix)]


def submit_template(address: str, **changes: Any) -> dict[str, Any]:
    """What workers.assignments.jobs.submit_template sends (gas price 1,000, SUBMIT_RESULT's 80,000 gas)."""
    template = {
        "chain_id": CHAIN,
        "type": "SUBMIT_RESULT",
        "from": address,
        "to": address,
        "amount": 0,
        "fee": 80_000 * 1_000,
        "nonce": 3,
        "gas_price": 1_000,
        "gas_limit": 80_000,
    }
    return {**template, **changes}


def a_job(address: str, *, dataset: bool = False, **submit: Any) -> dict[str, Any]:
    """An assignment as workers.assignments.jobs.describe sends it."""
    return {
        "id": ASSIGNMENT,
        "task_id": TASK,
        "kind": "cube_training",
        "spec": {},
        "attempt": 1,
        "state": "offered",
        "deadline": (datetime.now(UTC) + timedelta(hours=1)).isoformat(),
        "seed": {"block_hash": "00" * 32, "worker_address": address, "task_id": TASK},
        "dataset": {
            "url": f"{SERVER}/api/v1/assignments/{ASSIGNMENT}/dataset/",
            "sha256": hashlib.sha256(DATA).hexdigest(),
            "size_bytes": len(DATA),
            "format": "csv",
        }
        if dataset
        else None,
        "artifacts": ["model.safetensors"],
        "submit": submit_template(address, **submit),
    }


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    for module in (transfer, jobs, bar):
        monkeypatch.setattr(module, "time", fake)
    return fake


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[bytes]:
    """Replaces the kind's runner: records the dataset it was given, returns one artifact."""
    seen: list[bytes] = []

    def run(job: dict[str, Any], workdir: Path, progress: runners.Progress) -> runners.Outcome:
        if job["dataset"]:
            seen.append((workdir / f"dataset.{job['dataset']['format']}").read_bytes())
        progress(1, 1, {"loss": 0.5})
        artifact = tmp_path / "model.safetensors"
        artifact.write_bytes(b"weights")
        return runners.Outcome(result_hash="ab" * 32, proof={"steps": 1}, artifacts={"model.safetensors": artifact})

    monkeypatch.setattr(runners, "run", run)
    return seen


@pytest.fixture
def platform(clock: Clock) -> Platform:
    key = keys.generate()
    return Platform(key=key, clock=clock, job=a_job(key.address))


@pytest.fixture
def node(platform: Platform) -> Iterator[Node]:
    key = platform.key
    creds = Credentials(server=SERVER, worker_id="w", address=key.address, token="pww_test", chain_id=CHAIN)
    agent = Node(key, creds, SERVER)
    agent.http.close()
    agent.http = httpx.Client(
        base_url=SERVER, headers={"Authorization": "Worker pww_test"}, transport=httpx.MockTransport(platform)
    )
    yield agent
    agent.http.close()


def status(code: int, body: Any = None) -> Answer:
    return lambda request: httpx.Response(code, json=body if body is not None else {})


def broken(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


# --- #5: a job is never dropped silently -------------------------------------------------


def test_a_result_is_retried_while_the_platform_is_down_for_minutes(
    node: Node, platform: Platform, clock: Clock, ran: list[bytes]
) -> None:
    """20 failed POSTs (about 8 minutes of backoff, far beyond one request's 91 s) and
    then the platform is back: the signed result still goes in."""
    platform.answers["/result/"] = [*[status(503)] * 10, *[broken] * 10, status(202, {"state": "submitted"})]
    assert node.run_assignment(ASSIGNMENT) == "submitted"
    assert len(platform.paths("/result/")) == 21
    assert platform.paths("/fail/") == []
    assert max(clock.slept) <= transfer.RETRY_MAX_DELAY
    assert sum(clock.slept) > 300


def test_a_result_is_given_up_only_at_the_deadline(
    node: Node, platform: Platform, clock: Clock, ran: list[bytes]
) -> None:
    platform.job["deadline"] = (datetime.now(UTC) + timedelta(seconds=120)).isoformat()
    platform.answers["/result/"] = [status(503)]
    assert node.run_assignment(ASSIGNMENT) == "undelivered"  # no exception escapes to Celery
    assert 115 <= sum(clock.slept) <= 121
    assert len(platform.paths("/result/")) > 8


def _lost(request: httpx.Request) -> httpx.Response:
    raise httpx.ReadError("connection reset", request=request)


@pytest.mark.parametrize(
    "conflict",
    [
        {"state": ["This assignment is submitted; it takes no result."], "assignment_state": "submitted"},
        {"state": ["This assignment is accepted; it takes no result."], "assignment_state": "accepted"},
        # A server from before ``assignment_state``: the sentence alone says it.
        {"state": ["This assignment is submitted; it takes no result."]},
    ],
)
def test_a_409_after_a_lost_answer_is_a_submission(
    node: Node, platform: Platform, clock: Clock, ran: list[bytes], conflict: dict[str, Any]
) -> None:
    """The first POST went through but its answer was lost; the platform's 409 for the
    retry says so."""
    platform.answers["/result/"] = [_lost, status(409, conflict)]
    assert node.run_assignment(ASSIGNMENT) == "submitted"
    assert platform.paths("/fail/") == []


def test_a_409_for_an_expired_job_after_a_lost_answer_is_not_a_submission(
    node: Node, platform: Platform, clock: Clock, ran: list[bytes]
) -> None:
    """The deadline passed while the answer was lost: the job was reassigned and the node
    must not count it as delivered, even if the sentence were reworded to mention a state
    that has a result (the field decides, not the prose)."""
    conflict = {
        "state": ["This assignment is expired; a result that is submitted now is refused."],
        "assignment_state": "expired",
    }
    platform.answers["/result/"] = [_lost, status(409, conflict)]
    assert node.run_assignment(ASSIGNMENT) == "refused"
    (fail,) = platform.bodies["fail"]
    assert "HTTP 409" in fail["reason"]


def test_a_refused_result_is_reported_as_a_failure(
    node: Node, platform: Platform, clock: Clock, ran: list[bytes]
) -> None:
    platform.answers["/result/"] = [status(400, {"transaction": ["The nonce is stale."]})]
    assert node.run_assignment(ASSIGNMENT) == "refused"
    (fail,) = platform.bodies["fail"]
    assert "the platform refused the result (HTTP 400)" in fail["reason"]


@pytest.mark.parametrize("step", ["fetch", "start"])
def test_a_fetch_or_start_that_never_gets_through_is_reported(
    step: str, node: Node, platform: Platform, clock: Clock, ran: list[bytes]
) -> None:
    if step == "fetch":
        platform.answers[f"{ASSIGNMENT}/"] = [status(503)]
    else:
        platform.answers["/start/"] = [broken]
    assert node.run_assignment(ASSIGNMENT) == "failed"
    (fail,) = platform.bodies["fail"]
    assert fail["reason"].startswith(f"could not {step}")
    assert platform.paths("/result/") == []


# --- #6, #8: downloads --------------------------------------------------------------------


class BreaksOff(httpx.SyncByteStream):
    """A body that stops halfway, as when the platform restarts mid-download."""

    def __iter__(self) -> Iterator[bytes]:
        yield DATA[: len(DATA) // 2]
        raise httpx.ReadError("connection reset")


def test_a_dataset_download_is_retried_from_the_start_and_checked(
    node: Node, platform: Platform, clock: Clock, ran: list[bytes]
) -> None:
    platform.job = a_job(platform.key.address, dataset=True)
    platform.answers["/dataset/"] = [
        status(502),
        lambda request: httpx.Response(200, stream=BreaksOff()),
        lambda request: httpx.Response(200, content=DATA),
    ]
    assert node.run_assignment(ASSIGNMENT) == "submitted"
    assert ran == [DATA]  # whole, not the broken half followed by the file
    assert len(platform.paths("/dataset/")) == 3


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"size_bytes": len(DATA) + 1}, f"is {len(DATA)} bytes, but the platform said {len(DATA) + 1}"),
        ({"sha256": "00" * 32}, f"has sha256 {hashlib.sha256(DATA).hexdigest()}, but the platform said {'00' * 32}"),
    ],
)
def test_a_dataset_that_is_not_what_the_platform_said_fails_the_job(
    change: dict[str, Any], words: str, node: Node, platform: Platform, clock: Clock, ran: list[bytes]
) -> None:
    platform.job = a_job(platform.key.address, dataset=True)
    platform.job["dataset"].update(change)
    assert node.run_assignment(ASSIGNMENT) == "failed"
    assert ran == []  # nothing was trained on it
    (fail,) = platform.bodies["fail"]
    assert words in fail["reason"]


def test_the_token_goes_only_to_the_nodes_own_server(
    node: Node, platform: Platform, clock: Clock, ran: list[bytes]
) -> None:
    platform.job = a_job(platform.key.address, dataset=True)
    platform.job["dataset"]["url"] = f"http://elsewhere.example/api/v1/assignments/{ASSIGNMENT}/dataset/"
    assert node.run_assignment(ASSIGNMENT) == "failed"
    assert all(httpx.URL(url).host == "127.0.0.1" for _, url in platform.calls)
    (fail,) = platform.bodies["fail"]
    assert "not on this node's server" in fail["reason"]


@pytest.mark.parametrize("fmt", ["../../../home/x/.bashrc", "CSV", "toolongfmt", "", None])
def test_a_dataset_format_that_is_no_plain_extension_is_refused(
    fmt: Any, node: Node, platform: Platform, clock: Clock, ran: list[bytes]
) -> None:
    platform.job = a_job(platform.key.address, dataset=True)
    platform.job["dataset"]["format"] = fmt
    assert node.run_assignment(ASSIGNMENT) == "failed"
    assert platform.paths("/dataset/") == []
    (fail,) = platform.bodies["fail"]
    assert "dataset format this node will not use" in fail["reason"]


# --- a dataset in shards: a manifest, then each file by ranges ---------------------------

SHARDS = {
    "train.csv": b"path,participant_id,sequence_id,sign\n" + b"a/1.parquet,1,1,x\n" * 300,
    "sign_to_prediction_index_map.json": b'{"x": 0}',
    "shard-00000.zip": bytes(range(256)) * 400,
    "shard-00001.zip": b"PK" + bytes(reversed(range(256))) * 300,
}


def shard_manifest(files: dict[str, bytes]) -> list[dict[str, Any]]:
    """The files workers.assignments.jobs.folder_manifest lists for ``files``."""
    return [
        {
            "name": name,
            "size_bytes": len(body),
            "sha256": hashlib.sha256(body).hexdigest(),
            "url": f"/api/v1/assignments/{ASSIGNMENT}/dataset/{name}/",
        }
        for name, body in files.items()
    ]


@dataclass
class ShardServer:
    """Serves a manifest and its files as the real dataset endpoints do, honouring one
    ``Range: bytes=N-``; counts the bytes it sends and can break a body off once."""

    files: dict[str, bytes]
    manifest: bytes = b""
    sent: int = 0
    ranges: list[str] = field(default_factory=list)
    break_after: dict[str, int] = field(default_factory=dict)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        name = request.url.path.rstrip("/").rsplit("/", 1)[-1]
        if name == "dataset":
            return httpx.Response(200, content=self.manifest)
        body = self.files[name]
        start, end = 0, len(body) - 1
        ranged = "Range" in request.headers
        if ranged:
            self.ranges.append(f"{name} {request.headers['Range']}")
            first, _, last = request.headers["Range"].removeprefix("bytes=").partition("-")
            start, end = int(first), int(last) if last else end
        part = body[start : end + 1]
        answered = {"Content-Range": f"bytes {start}-{end}/{len(body)}"} if ranged else {}
        cut = self.break_after.pop(name, None)
        if cut is not None:
            self.sent += cut
            return httpx.Response(206 if ranged else 200, stream=BreaksOffAt(part, cut), headers=answered)
        self.sent += len(part)
        return httpx.Response(206 if ranged else 200, content=part, headers=answered)


class BreaksOffAt(httpx.SyncByteStream):
    def __init__(self, body: bytes, cut: int) -> None:
        self.body, self.cut = body, cut

    def __iter__(self) -> Iterator[bytes]:
        yield self.body[: self.cut]
        raise httpx.ReadError("connection reset")


def sharded_job(platform: Platform, server: ShardServer, listed: list[dict[str, Any]]) -> None:
    server.manifest = json.dumps({"format": "shards", "files": listed}).encode()
    platform.job = a_job(platform.key.address, dataset=True)
    platform.job["dataset"].update(
        format="shards", size_bytes=len(server.manifest), sha256=hashlib.sha256(server.manifest).hexdigest()
    )
    platform.answers["/dataset/"] = [server]
    for entry in listed:
        platform.answers[f"/dataset/{entry['name']}/"] = [server]


@pytest.fixture
def trained_on(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[dict[str, bytes]]:
    """Replaces the kind's runner: records the dataset folder it was given, file by file."""
    seen: list[dict[str, bytes]] = []

    def run(job: dict[str, Any], workdir: Path, progress: runners.Progress) -> runners.Outcome:
        folder = workdir / f"dataset.{job['dataset']['format']}"
        seen.append({p.name: p.read_bytes() for p in folder.iterdir()})
        artifact = tmp_path / "model.safetensors"
        artifact.write_bytes(b"weights")
        return runners.Outcome(result_hash="ab" * 32, proof={"steps": 1}, artifacts={"model.safetensors": artifact})

    monkeypatch.setattr(runners, "run", run)
    return seen


def test_a_dataset_in_shards_lands_in_one_folder_and_resumes_where_it_broke_off(
    node: Node, platform: Platform, clock: Clock, trained_on: list[dict[str, bytes]]
) -> None:
    server = ShardServer(SHARDS, break_after={"shard-00000.zip": 30_000, "shard-00001.zip": 1})
    sharded_job(platform, server, shard_manifest(SHARDS))
    assert node.run_assignment(ASSIGNMENT) == "submitted"
    assert trained_on == [SHARDS]  # every file, whole, in the folder the runner reads
    # Each broken-off file was asked for from the byte it stopped at, not from its start:
    # the platform sent every byte once (plus the manifest).
    assert server.ranges == ["shard-00000.zip bytes=30000-", "shard-00001.zip bytes=1-"]
    assert server.sent == sum(len(body) for body in SHARDS.values())


def test_a_large_file_is_fetched_in_bounded_pieces_and_a_broken_piece_resumes(
    node: Node, platform: Platform, clock: Clock, trained_on: list[dict[str, bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The platform's ASGI server holds a response body it has not yet sent in memory, so a
    large file is asked for a piece at a time: no GET asks for more than DOWNLOAD_PIECE bytes,
    a piece that breaks off resumes where it stopped, and every byte is sent once."""
    monkeypatch.setattr(transfer, "DOWNLOAD_PIECE", 8_000)
    big = "shard-00000.zip"
    server = ShardServer(SHARDS, break_after={big: 3_000})
    sharded_job(platform, server, shard_manifest(SHARDS))
    assert node.run_assignment(ASSIGNMENT) == "submitted"
    assert trained_on == [SHARDS]
    asked = [r.split(" ", 1)[1].removeprefix("bytes=").split("-") for r in server.ranges if r.startswith(big)]
    assert all(last and int(last) - int(first) + 1 <= 8_000 for first, last in asked)
    starts = [int(first) for first, _ in asked]
    assert starts[:3] == [0, 3_000, 11_000]  # the first piece broke off at 3,000 and resumed there
    assert int(asked[-1][1]) == len(SHARDS[big]) - 1
    assert server.sent == sum(len(body) for body in SHARDS.values())


def test_a_download_that_keeps_breaking_off_but_moves_on_finishes(
    node: Node, platform: Platform, clock: Clock, trained_on: list[dict[str, bytes]]
) -> None:
    """A link that drops every 10 kB: far more break-offs than one request's retries, each
    after progress, so the retries start over each time and the file arrives whole."""
    server = ShardServer(SHARDS)
    sharded_job(platform, server, shard_manifest(SHARDS))
    drops = []

    def flaky(request: httpx.Request) -> httpx.Response:
        name = request.url.path.rstrip("/").rsplit("/", 1)[-1]
        body = SHARDS[name]
        start = int(request.headers.get("Range", "bytes=0-").removeprefix("bytes=").rstrip("-"))
        if len(body) - start > 10_000:
            drops.append(start)
            answered = {"Content-Range": f"bytes {start}-{len(body) - 1}/{len(body)}"} if start else {}
            return httpx.Response(206 if start else 200, stream=BreaksOffAt(body[start:], 10_000), headers=answered)
        return server(request)

    platform.answers["/dataset/shard-00000.zip/"] = [flaky]
    assert node.run_assignment(ASSIGNMENT) == "submitted"
    assert trained_on == [SHARDS]
    assert len(drops) > transfer.RETRY_ATTEMPTS
    assert drops == list(range(0, 10_000 * len(drops), 10_000))


def test_a_resumed_download_answered_with_other_bytes_fails_the_job(
    node: Node, platform: Platform, clock: Clock, trained_on: list[dict[str, bytes]]
) -> None:
    """A proxy that answers "the rest" with a range from elsewhere in the file: the node
    would splice two parts of it together, so it stops instead."""
    server = ShardServer(SHARDS, break_after={"shard-00000.zip": 5_000})
    sharded_job(platform, server, shard_manifest(SHARDS))

    def elsewhere(request: httpx.Request) -> httpx.Response:
        if "Range" not in request.headers:
            return server(request)
        body = SHARDS["shard-00000.zip"]
        return httpx.Response(206, content=body[:100], headers={"Content-Range": f"bytes 0-99/{len(body)}"})

    platform.answers["/dataset/shard-00000.zip/"] = [elsewhere]
    assert node.run_assignment(ASSIGNMENT) == "failed"
    assert trained_on == []
    (fail,) = platform.bodies["fail"]
    assert "asked for the bytes from 5000, got the range 'bytes 0-99/" in fail["reason"]


@pytest.mark.parametrize(
    "name",
    ["../../.bashrc", "/etc/passwd", "sub/shard-00000.zip", "shard-1.zip", ".train.csv", "model.py", "", None, 7],
)
def test_a_manifest_naming_anything_but_shard_files_is_refused(
    name: Any, node: Node, platform: Platform, clock: Clock, trained_on: list[dict[str, bytes]], tmp_path: Path
) -> None:
    server = ShardServer({**SHARDS, "x": b"payload"})
    listed = [*shard_manifest(SHARDS), {**shard_manifest({"x": b"payload"})[0], "name": name}]
    sharded_job(platform, server, listed)
    assert node.run_assignment(ASSIGNMENT) == "failed"
    assert trained_on == []
    assert server.sent == 0  # not one file was fetched
    (fail,) = platform.bodies["fail"]
    assert "is not a file name of a dataset in shards" in fail["reason"]


def test_a_shard_that_is_not_what_the_manifest_says_fails_the_job(
    node: Node, platform: Platform, clock: Clock, trained_on: list[dict[str, bytes]]
) -> None:
    forged = {**SHARDS, "shard-00001.zip": SHARDS["shard-00001.zip"][:-1] + b"!"}
    server = ShardServer(forged)
    sharded_job(platform, server, shard_manifest(SHARDS))
    assert node.run_assignment(ASSIGNMENT) == "failed"
    assert trained_on == []  # nothing was trained on it
    (fail,) = platform.bodies["fail"]
    assert "shard-00001.zip has sha256" in fail["reason"]
    assert f"but the platform said {hashlib.sha256(SHARDS['shard-00001.zip']).hexdigest()}" in fail["reason"]


def test_a_manifest_other_than_the_job_names_is_refused(
    node: Node, platform: Platform, clock: Clock, trained_on: list[dict[str, bytes]]
) -> None:
    server = ShardServer(SHARDS)
    sharded_job(platform, server, shard_manifest(SHARDS))
    server.manifest = json.dumps({"format": "shards", "files": shard_manifest({"train.csv": b"other"})}).encode()
    assert node.run_assignment(ASSIGNMENT) == "failed"
    assert trained_on == []
    assert server.sent == 0
    (fail,) = platform.bodies["fail"]
    assert "dataset.shards.manifest.json is" in fail["reason"]


# --- an asl_training share, read into its cache as it arrives ------------------------------


ASL_SPEC: dict[str, Any] = {"dim": 192, "blocks": 1, "max_len": 32, "epochs": 1, "batch_size": 8, "seed": 0}


@pytest.fixture(scope="module")
def asl_share(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The files of a worker share the platform's split writes, in several shards."""
    root = tmp_path_factory.mktemp("asl-share")
    upload = generate(root / "signs.zip", n_signs=3, n_participants=3, per_participant=2, max_frames=12, as_zip=True)
    worker, _ = prepare_asl(ASL_SPEC, upload, root / "split", bytes(32), shard_bytes=15_000)
    assert worker is not None
    served = materialise(worker, upload, root / "served")  # what the platform serves of its virtual shards
    files = {p.name: p.read_bytes() for p in sorted(served.iterdir())}
    assert sum(name.startswith("shard-") for name in files) >= 3
    return files


@pytest.fixture
def asl_trained_on(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple[list[str], int]]:
    """Replaces the kind's runner: records what its dataset folder holds and how many
    sequences the trainer's reader opens from it."""
    seen: list[tuple[list[str], int]] = []

    def run(job: dict[str, Any], workdir: Path, progress: runners.Progress) -> runners.Outcome:
        folder = workdir / f"dataset.{job['dataset']['format']}"
        read = load_dataset(folder, workdir / "cache", points=selected_landmarks(False))
        seen.append((sorted(p.name for p in folder.iterdir()), len(read)))
        artifact = tmp_path / "model.safetensors"
        artifact.write_bytes(b"weights")
        return runners.Outcome(result_hash="ab" * 32, proof={"steps": 1}, artifacts={"model.safetensors": artifact})

    monkeypatch.setattr(runners, "run", run)
    return seen


def test_an_asl_share_is_read_into_its_cache_as_it_arrives_and_no_shard_is_kept(
    node: Node,
    platform: Platform,
    clock: Clock,
    asl_share: dict[str, bytes],
    asl_trained_on: list[tuple[list[str], int]],
) -> None:
    server = ShardServer(asl_share, break_after={"shard-00001.zip": 4_000})
    sharded_job(platform, server, shard_manifest(asl_share))
    platform.job.update(kind="asl_training", spec=dict(ASL_SPEC))
    assert node.run_assignment(ASSIGNMENT) == "submitted"
    rows = asl_share["train.csv"].decode().count("\n") - 1
    # The trainer reads every sequence from the cache; the folder holds no shard.
    assert asl_trained_on == [
        ([".islr_cache", "ingested.json", "sign_to_prediction_index_map.json", "train.csv"], rows)
    ]
    assert server.ranges == ["shard-00001.zip bytes=4000-"]  # still resumed where it broke off
    assert server.sent == sum(len(body) for body in asl_share.values())


def test_an_asl_shard_that_is_not_what_the_manifest_says_fails_the_job_before_training(
    node: Node,
    platform: Platform,
    clock: Clock,
    asl_share: dict[str, bytes],
    asl_trained_on: list[tuple[list[str], int]],
) -> None:
    body = asl_share["shard-00001.zip"]
    forged = {**asl_share, "shard-00001.zip": body[:100] + bytes([body[100] ^ 1]) + body[101:]}
    server = ShardServer(forged)
    sharded_job(platform, server, shard_manifest(asl_share))
    platform.job.update(kind="asl_training", spec=dict(ASL_SPEC))
    assert node.run_assignment(ASSIGNMENT) == "failed"
    assert asl_trained_on == []
    (fail,) = platform.bodies["fail"]
    assert "shard-00001.zip has sha256" in fail["reason"]
    assert f"but the platform said {hashlib.sha256(body).hexdigest()}" in fail["reason"]


# --- #7: the SUBMIT_RESULT template -------------------------------------------------------


# A fixed key: it names a test (below), and xdist workers must collect the same names.
THIEF = keys.from_seed(bytes(range(32))).address


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"type": "TRANSFER"}, "type is 'TRANSFER'"),
        ({"to": THIEF}, f"to is '{THIEF}'"),
        ({"amount": 10**12}, "amount is 1000000000000"),
        ({"gas_price": 10**9, "fee": 80_000 * 10**9}, "above this node's ceiling 100000"),
        ({"fee": 10**12}, "fee 1000000000000 is not gas_limit × gas_price"),
        ({"chain_id": "proofwork-main"}, "this node registered on 'proofwork-test-1'"),
    ],
)
def test_a_submit_template_that_is_not_a_plain_submission_is_not_signed(
    change: dict[str, Any], words: str, node: Node, platform: Platform, clock: Clock, ran: list[bytes]
) -> None:
    platform.job = a_job(platform.key.address, **change)
    assert node.run_assignment(ASSIGNMENT) == "failed"
    assert platform.paths("/start/") == []  # refused before any work
    assert platform.paths("/result/") == []
    (fail,) = platform.bodies["fail"]
    assert "refused to sign the platform's SUBMIT_RESULT template" in fail["reason"]
    assert words in fail["reason"]
    outcome = runners.Outcome(result_hash="ab" * 32, proof={}, artifacts={})
    with pytest.raises(JobError, match="refused to sign"):
        node.sign_result(platform.job, outcome)


def test_the_gas_price_ceiling_is_the_nodes_to_set(platform: Platform) -> None:
    key = platform.key
    creds = Credentials(server=SERVER, worker_id="w", address=key.address, token="pww_test", chain_id=CHAIN)
    strict = Node(key, creds, SERVER, max_gas_price=999)
    outcome = runners.Outcome(result_hash="ab" * 32, proof={}, artifacts={})
    try:
        with pytest.raises(JobError, match="gas_price 1000 is above this node's ceiling 999"):
            strict.sign_result(a_job(key.address), outcome)
    finally:
        strict.http.close()


def test_credentials_from_before_the_chain_id_was_recorded_still_sign(platform: Platform) -> None:
    key = platform.key
    old = Credentials(server=SERVER, worker_id="w", address=key.address, token="pww_test")
    agent = Node(key, old, SERVER)
    try:
        body = agent.sign_result(a_job(key.address), runners.Outcome(result_hash="ab" * 32, proof={}, artifacts={}))
    finally:
        agent.http.close()
    assert body["transaction"]["chain_id"] == CHAIN
    assert body["transaction"]["from"] == key.address


# --- #3: at start-up, what an earlier run left running is abandoned -----------------------


def test_start_up_abandons_what_an_earlier_run_left_running(
    node: Node, platform: Platform, caplog: pytest.LogCaptureFixture
) -> None:
    platform.answers["/workers/me/abandon/"] = [status(200, {"abandoned": [ASSIGNMENT]})]
    with caplog.at_level("WARNING", logger="workers.agent"):
        assert node.abandon_running() == [ASSIGNMENT]
    assert platform.calls == [("POST", f"{SERVER}/api/v1/workers/me/abandon/")]
    assert platform.bodies["abandon"] == [{}]
    assert f"abandoned 1 job(s) an earlier run of this node left running: {ASSIGNMENT}" in caplog.text


def test_start_up_reports_the_nodes_capabilities(node: Node, platform: Platform) -> None:
    caps = {"kinds": ["synthetic"], "features": ["poc:aes256ctr", "poc:shake128"]}
    platform.answers["/workers/me/capabilities/"] = [status(200, {"capabilities": caps})]
    assert node.report_capabilities(caps) is True
    assert platform.calls == [("POST", f"{SERVER}/api/v1/workers/me/capabilities/")]
    assert platform.bodies["capabilities"] == [caps]


def test_an_older_platform_keeps_the_registered_capabilities(node: Node, platform: Platform) -> None:
    assert node.report_capabilities({"kinds": []}) is False  # the stand-in's default answer is 404


def test_an_older_platform_without_abandon_is_nothing_to_do(node: Node, platform: Platform) -> None:
    assert node.abandon_running() == []  # the stand-in's default answer is 404
