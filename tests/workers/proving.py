"""A node of the proof-of-training tests: registered, speaking REST as the agent does, and
the agent's own code with its HTTP going to the platform's WSGI application in-process."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import httpx
from django.conf import settings
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from rest_framework.test import APIClient

from tests.factories import make_worker
from training.plugin import Outcome
from workers.agent.identity import Credentials
from workers.agent.jobs import Node
from workers.models import Assignment


class RestNode:
    """A registered node speaking REST as the agent does."""

    def __init__(self, owner: Any, name: str, caps: dict[str, Any]) -> None:
        self.worker, self.token, self.key = make_worker(owner, name=name, caps=caps)
        self.client = APIClient()
        self.client.credentials(HTTP_AUTHORIZATION=f"Worker {self.token}")

    def url(self, assignment: Assignment, tail: str = "") -> str:
        return f"/api/v1/assignments/{assignment.pk}/{tail}"

    def job(self, assignment: Assignment) -> dict[str, Any]:
        job: dict[str, Any] = self.client.get(self.url(assignment)).json()
        assert self.client.post(self.url(assignment, "start/")).status_code == 200
        return job

    def put(self, assignment: Assignment, name: str, content: bytes) -> Any:
        return self.client.put(
            self.url(assignment, f"artifacts/{name}/"),
            data=content,
            content_type="application/octet-stream",
            HTTP_CONTENT_DISPOSITION=f'attachment; filename="{name}"',
        )

    def submit(self, assignment: Assignment, job: dict[str, Any], outcome: Outcome) -> Any:
        node = Node(self.key, Credentials("http://testserver", str(self.worker.pk), self.key.address, ""), "x")
        try:
            body = node.sign_result(job, outcome)
        finally:
            node.http.close()
        return self.client.post(self.url(assignment, "result/"), body, format="json")

    def upload_and_submit(self, assignment: Assignment, job: dict[str, Any], outcome: Outcome) -> Any:
        for name, path in outcome.artifacts.items():
            assert self.put(assignment, name, path.read_bytes()).status_code == 201
        return self.submit(assignment, job, outcome)


def answer_challenge(node: RestNode, assignment: Assignment, answer: dict[str, Any], outcome: Outcome) -> Any:
    last = None
    for name in answer["challenge"]["checkpoints"]:
        last = node.put(assignment, name, outcome.checkpoints[name].read_bytes())
        assert last.status_code == 201, last.json()
    return last


@contextlib.contextmanager
def in_process_agent(node: RestNode) -> Iterator[Node]:
    """The agent's Node for ``node``, its HTTP going to the platform's WSGI application in-process."""
    server = "http://testserver"
    creds = Credentials(
        server=server,
        worker_id=str(node.worker.pk),
        address=node.key.address,
        token=node.token,
        chain_id=settings.LEDGER_CHAIN_ID,
    )
    agent = Node(node.key, creds, server)
    agent.http.close()
    # As Django's test client does: the test's transaction holds the connection, which the
    # end of each request would otherwise close.
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    agent.http = httpx.Client(
        base_url=server,
        headers={"Authorization": f"Worker {node.token}"},
        transport=httpx.WSGITransport(app=get_wsgi_application()),
    )
    try:
        yield agent
    finally:
        agent.http.close()
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)
