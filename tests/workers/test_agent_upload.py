"""The node's artifact upload against a real HTTP server on a socket: streamed with its
Content-Length (never chunked, never the whole file as one buffer), and sent again whole
when the platform answers 503 while it restarts. The server here is a stand-in for the
platform so that it can answer 503 on demand; the platform's own upload view is covered
by the end-to-end tests with a real agent."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from protocol import keys
from tests.workers.stub_platform import JsonHandler
from workers.agent import transfer
from workers.agent.identity import Credentials
from workers.agent.jobs import Node


class Platform(ThreadingHTTPServer):
    """Answers the first ``unavailable`` PUTs with 503, then keeps each body it receives."""

    def __init__(self, unavailable: int) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.unavailable = unavailable
        self.requests: list[dict[str, Any]] = []


class Handler(BaseHTTPRequestHandler):
    server: Platform

    def do_PUT(self) -> None:
        length = int(self.headers.get("Content-Length", "-1"))
        body = self.rfile.read(length) if length >= 0 else b""
        self.server.requests.append({"headers": dict(self.headers), "body": body})
        if len(self.server.requests) <= self.server.unavailable:
            self.send_response(503)
        else:
            self.send_response(201)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def platform() -> Iterator[Platform]:
    server = Platform(unavailable=1)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_an_artifact_is_streamed_whole_and_sent_again_after_a_503(
    platform: Platform, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transfer, "UPLOAD_CHUNK", 4096)  # many chunks, so the stream is exercised
    monkeypatch.setattr(transfer.time, "sleep", lambda seconds: None)  # the retry back-off
    key = keys.generate()
    server = f"http://127.0.0.1:{platform.server_address[1]}"
    node = Node(key, Credentials(server=server, worker_id="w", address=key.address, token="t"), server)
    artifact = tmp_path / "product.safetensors"
    content = bytes(range(256)) * 1000 + b"tail"  # 256,004 bytes: not a multiple of the chunk
    artifact.write_bytes(content)
    try:
        response = node.upload("/api/v1/assignments/a/artifacts/product.safetensors/", artifact.name, artifact)
    finally:
        node.http.close()

    assert response.status_code == 201
    assert len(platform.requests) == 2  # refused once while "restarting", then accepted
    for request in platform.requests:
        assert request["body"] == content
        assert request["headers"]["Content-Length"] == str(len(content))
        assert "Transfer-Encoding" not in request["headers"]
        assert request["headers"]["Content-Disposition"] == 'attachment; filename="product.safetensors"'
        assert request["headers"]["Authorization"] == "Worker t"


class PartsPlatform(ThreadingHTTPServer):
    """Keeps ordered parts like workers/assignments/uploads.py; the answer to the second part is lost
    (503 after the bytes were kept), as when the platform restarts mid-reply."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), PartsHandler)
        self.received = bytearray()
        self.ranges: list[str] = []


class PartsHandler(JsonHandler):
    server: PartsPlatform

    def do_PUT(self) -> None:  # noqa: N802 (BaseHTTPRequestHandler names it)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        content_range = self.headers["Content-Range"]
        self.server.ranges.append(content_range)
        start, rest = content_range.removeprefix("bytes ").split("-")
        end, total = (int(x) for x in rest.split("/"))
        if int(start) != len(self.server.received):
            self.send_json(409, {"received": len(self.server.received)})
            return
        self.server.received += body
        if len(self.server.ranges) == 2:
            self.send_json(503, {})
        else:
            self.send_json(201 if end + 1 == total else 202, {"received": end + 1})


def test_a_part_whose_answer_was_lost_is_not_sent_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transfer, "UPLOAD_PART", 4096)
    monkeypatch.setattr(transfer.time, "sleep", lambda seconds: None)
    server = PartsPlatform()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    key = keys.generate()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    node = Node(key, Credentials(server=url, worker_id="w", address=key.address, token="t"), url)
    artifact = tmp_path / "product.safetensors"
    content = os.urandom(10_000)
    artifact.write_bytes(content)
    try:
        response = node.upload("/a/", artifact.name, artifact)
    finally:
        node.http.close()
        server.shutdown()
        server.server_close()
    assert response.status_code == 201
    assert bytes(server.received) == content
    # The retried second part is refused (409, received 8192) and the node goes on from there.
    assert server.ranges == [
        "bytes 0-4095/10000",
        "bytes 4096-8191/10000",
        "bytes 4096-8191/10000",
        "bytes 8192-9999/10000",
    ]
