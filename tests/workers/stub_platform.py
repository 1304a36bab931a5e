"""A stand-in platform on 127.0.0.1 for the node's command line: it answers each path with
what a test gives it, including what the real platform never sends (a template a
compromised server could forge, a login page, a proxy's error page). Run it with
``tests.workers.processes.serving``."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HTML = "text/html"
NOT_FOUND = (404, HTML, b"<h1>Not Found</h1>")
CHAIN = "proofwork-test-1"


def register_template(address: str, **changes: Any) -> dict[str, Any]:
    """The REGISTER_WORKER template workers.identity.services.register_tx_template sends."""
    template = {
        "chain_id": CHAIN,
        "type": "REGISTER_WORKER",
        "from": address,
        "to": address,
        "amount": 0,
        "fee": 0,
        "nonce": 0,
        "gas_price": 1000,
        "gas_limit": 0,
        "payload": {},
    }
    return {**template, **changes}


class JsonHandler(BaseHTTPRequestHandler):
    """A stand-in server's handler: ``send_json`` answers, and nothing is logged."""

    def send_json(self, code: int, payload: Any, content_type: str = "application/json") -> None:
        """Answer ``code`` with ``payload``: bytes as they are, anything else as JSON."""
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class StubPlatform(ThreadingHTTPServer):
    """Answers ``answers["METHOD path"]``, else ``answers[path]``: ``(status, body)`` sent as
    JSON, or ``(status, content type, body)`` with a body of bytes sent as it is (anything
    else as JSON). Records every request as (method, path, body: JSON if it parses, else bytes)."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.answers: dict[str, tuple[Any, ...]] = {}
        self.requests: list[tuple[str, str, Any]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    @property
    def asked(self) -> list[str]:
        return [f"{method} {path}" for method, path, _ in self.requests]

    def posted(self, path: str) -> list[Any]:
        return [body for method, p, body in self.requests if method == "POST" and p == path]


class _Handler(JsonHandler):
    server: StubPlatform

    def answer(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw
        self.server.requests.append((self.command, self.path, body))
        answers = self.server.answers
        answer = answers.get(f"{self.command} {self.path}") or answers.get(self.path) or NOT_FOUND
        code, kind, payload = answer if len(answer) == 3 else (answer[0], "application/json", answer[1])
        self.send_json(code, payload, kind)

    def do_GET(self) -> None:
        self.answer()

    def do_POST(self) -> None:
        self.answer()

    def do_PUT(self) -> None:
        self.answer()
