"""``python -m workers.agent run`` at start-up, as a real process: it looks online (opens
its WebSocket, so heartbeats flow) only once its Celery consumer is connected to the
broker, and before that it asks the platform to abandon whatever an earlier run left
running.

The platform is a stand-in HTTP server on 127.0.0.1 that records the order of what the
node asks for; it answers the abandon call as the platform's endpoint is specified
(200 with the abandoned ids) and refuses the WebSocket upgrade, since only the attempt
matters here. The node runs against a real broker: the filesystem transport it uses in
embedded mode, and a Redis URL on which nothing listens.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.workers.processes import serving, spawn
from tests.workers.stub_platform import JsonHandler
from workers.agent.identity import Credentials, init_key

ROOT = Path(__file__).resolve().parents[2]
ABANDONED = "7d8c6a4e-0000-4000-8000-00000000000a"


class Platform(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.seen: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(JsonHandler):
    server: Platform

    def do_POST(self) -> None:  # noqa: N802 (BaseHTTPRequestHandler names it)
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.server.seen.append(f"POST {self.path} {json.dumps(body)} {self.headers.get('Authorization')}")
        self.send_json(200, {"abandoned": [ABANDONED]} if self.path == "/api/v1/workers/me/abandon/" else {})

    def do_GET(self) -> None:  # noqa: N802 (BaseHTTPRequestHandler names it)
        self.server.seen.append(f"GET {self.path} {self.headers.get('Upgrade', '')}")
        self.send_json(403, {})


@pytest.fixture
def platform() -> Iterator[Platform]:
    server = Platform()
    with serving(server):
        yield server


@contextmanager
def agent(tmp_path: Path, platform: Platform, *broker: str) -> Iterator[Path]:
    """A registered node's files and its ``run`` process; yields the process's log."""
    key_path = tmp_path / "worker.pem"
    key = init_key(key_path)
    Credentials(server=platform.url, worker_id="w1", address=key.address, token="pww_test", chain_id="c").save(
        key_path.with_name("worker.json")
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["PYTHONPATH"] = str(ROOT)
    log = tmp_path / "agent.log"
    args = [sys.executable, "-m", "workers.agent", "--key", str(key_path), "run", *broker]
    with spawn(args, log, env, cwd=tmp_path):
        yield log


def wait_for_text(log: Path, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in log.read_text(errors="replace"):
            return
        time.sleep(0.1)
    raise AssertionError(f"{text!r} not in the agent's log:\n{log.read_text(errors='replace')[-3000:]}")


def redis_url() -> str | None:
    """A Redis to test against (REDIS_URL, or one on the default port), if one answers."""
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    try:
        import redis

        redis.Redis.from_url(url, socket_connect_timeout=0.5).ping()
    except Exception:
        return None
    return url


@pytest.mark.slow
@pytest.mark.parametrize("broker", ["filesystem", "redis"])
def test_the_node_abandons_earlier_jobs_then_reports_once_its_consumer_is_ready(
    broker: str, platform: Platform, tmp_path: Path
) -> None:
    if broker == "redis":
        url = redis_url()
        if url is None:
            pytest.skip("no Redis answers")
        args = ["--broker", url]  # the node's queue w.<a fresh address> is its own
    else:
        folder = tmp_path / "broker" / "out"
        folder.mkdir(parents=True)
        args = ["--broker", "filesystem://", "--broker-folder", str(folder)]
    with agent(tmp_path, platform, *args) as log:
        deadline = time.monotonic() + 60
        while not any(s.startswith("GET /ws/worker/") for s in platform.seen) and time.monotonic() < deadline:
            time.sleep(0.05)
        text = log.read_text(errors="replace")
    # What the node offers now (an upgraded agent's features), then its earlier jobs given
    # up, and only then the socket that makes it look online.
    reported, *rest = platform.seen[:3]
    assert reported.startswith("POST /api/v1/workers/me/capabilities/ {"), text
    features = '["poc:aes256ctr", "poc:shake128", "verify_segments", "dataset:shards", "training:replay/2"]'
    assert f'"features": {features}' in reported
    assert rest == [
        "POST /api/v1/workers/me/abandon/ {} Worker pww_test",
        "GET /ws/worker/ websocket",
    ], text
    assert text.index("Connected to") < text.index("abandoned 1 job(s)")  # the consumer's broker connection came first
    assert f"an earlier run of this node left running: {ABANDONED}" in text


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_a_node_that_cannot_reach_its_broker_never_looks_online(platform: Platform, tmp_path: Path) -> None:
    unreachable = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    with agent(tmp_path, platform, "--broker", unreachable) as log:
        wait_for_text(log, "Cannot connect to redis://", 60)
        time.sleep(3)  # the old node opened its WebSocket within a second of starting
        seen = list(platform.seen)
    assert seen == []  # no heartbeat, and nothing abandoned by a node that takes no jobs


class Cuttable:
    """A TCP proxy to Redis on a port of its own: ``cut`` drops every connection and stops
    listening (the node's broker is gone), ``restore`` listens again on the same port."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = free_port()
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self.restore()

    def restore(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            server = socket.create_connection(self.upstream)
            with self._lock:
                self._conns += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)


def socket_attempts(platform: Platform) -> int:
    return sum(1 for s in list(platform.seen) if s.startswith("GET /ws/worker/"))


@pytest.mark.slow
def test_a_node_that_loses_its_broker_stops_looking_online_until_it_is_back(platform: Platform, tmp_path: Path) -> None:
    """Heartbeats ride on the socket: while the Celery consumer has no broker the node
    holds no socket (the stand-in counts the attempts to open one), so the platform
    stops offering it work; once the consumer reconnects, so does the socket."""
    url = redis_url()
    if url is None:
        pytest.skip("no Redis answers")
    parts = urlsplit(url)
    proxy = Cuttable((parts.hostname or "127.0.0.1", parts.port or 6379))
    try:
        with agent(tmp_path, platform, "--broker", f"redis://127.0.0.1:{proxy.port}{parts.path or '/0'}") as log:
            deadline = time.monotonic() + 60
            while socket_attempts(platform) == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert socket_attempts(platform) > 0, log.read_text(errors="replace")[-3000:]

            proxy.cut()
            wait_for_text(log, "no broker connection: the socket closes", 60)
            time.sleep(1)  # an attempt already under way may still land
            attempts = socket_attempts(platform)
            time.sleep(6)  # the socket retries at least every 5 s while it is wanted
            assert socket_attempts(platform) == attempts, log.read_text(errors="replace")[-3000:]

            proxy.restore()
            wait_for_text(log, "the broker connection is back", 90)
            deadline = time.monotonic() + 15
            while socket_attempts(platform) == attempts and time.monotonic() < deadline:
                time.sleep(0.05)
            assert socket_attempts(platform) > attempts, log.read_text(errors="replace")[-3000:]
    finally:
        proxy.cut()
