"""A socket the platform refuses must tell the browser why.

A refusal at the handshake reaches a page as close code 1006 (abnormal closure), the
same as a server that is down, and the task and dashboard pages retry on 1006 forever.
The consumers accept, then close with 4403 (signed out, or not the owner); here a real
Chromium against daphne reads the code the pages act on.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import funded
from tests.e2e.browsing import log_in
from tests.factories import UserFactory, post_task

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

CLOSE_CODE = """async (path) => {
  const url = location.origin.replace(/^http/, "ws") + path;
  return await new Promise((resolve) => {
    const socket = new WebSocket(url);
    socket.addEventListener("close", (event) => resolve(event.code));
    setTimeout(() => resolve("still open after 10 s"), 10000);
  });
}"""


def test_a_signed_out_browser_reads_4403_from_both_sockets(page: Any, live_url: str) -> None:
    task = post_task(funded(UserFactory(username="owner")))
    page.goto("/")
    assert page.evaluate(CLOSE_CODE, "/ws/dashboard/") == 4403
    assert page.evaluate(CLOSE_CODE, f"/ws/tasks/{task.pk}/") == 4403


def test_another_users_task_socket_reads_4403(page: Any, live_url: str) -> None:
    task = post_task(funded(UserFactory(username="owner")))
    UserFactory(username="stranger")
    log_in(page, "stranger")
    assert page.evaluate(CLOSE_CODE, f"/ws/tasks/{task.pk}/") == 4403
