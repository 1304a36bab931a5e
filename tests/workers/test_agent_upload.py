"""The node's artifact upload against a real HTTP server on a socket: streamed with its
Content-Length (never chunked, never the whole file as one buffer), and sent again whole
when the platform answers 503 while it restarts. The server here is a stand-in for the
platform so that it can answer 503 on demand; the platform's own upload view is covered
by the end-to-end tests with a real agent."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from ledger import keys
from workers.agent import node as node_module
from workers.agent.identity import Credentials
from workers.agent.node import Node


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
    monkeypatch.setattr(node_module, "UPLOAD_CHUNK", 4096)  # many chunks, so the stream is exercised
    monkeypatch.setattr(node_module.time, "sleep", lambda seconds: None)  # the retry back-off
    key = keys.generate()
    server = f"http://127.0.0.1:{platform.server_address[1]}"
    node = Node(key, Credentials(server=server, worker_id="w", address=key.address, token="t"), server)
    artifact = tmp_path / "product.safetensors"
    content = bytes(range(256)) * 1000 + b"tail"  # 256,004 bytes: not a multiple of the chunk
    artifact.write_bytes(content)
    try:
        response = node._upload("/api/v1/assignments/a/artifacts/product.safetensors/", artifact.name, artifact)
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
