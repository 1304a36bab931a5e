"""A node is online or offline by one rule (``workers.models.online_cutoff``), and the
My workers page words its heartbeat to match: an offline node never reads "just now"."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from tests.factories import make_worker, post_task
from workers.models import Worker

pytestmark = pytest.mark.django_db


def presence_of(client: Client, name: str) -> tuple[str, str]:
    import re

    page = client.get("/workers/").content.decode()
    row = page[page.index(f">{name}</a>") :]
    status = re.search(r'data-worker-status="(\w+)"', row)
    line = re.search(r"data-worker-presence[^>]*>([^<]*)<", row)
    assert status
    assert line
    return status.group(1), line.group(1)


@pytest.mark.parametrize(
    ("silent_for", "status", "line"),
    [
        (timedelta(seconds=2), "online", "heartbeat just now"),
        (timedelta(seconds=20), "online", "heartbeat 20 s ago"),
        # Past the 30 s timeout but under a minute: offline, and said so with the age.
        (timedelta(seconds=45), "offline", "last heartbeat 45 s ago"),
        (timedelta(minutes=5, seconds=3), "offline", "last heartbeat 5 min ago"),
        (timedelta(hours=3), "offline", "last heartbeat 3 h ago"),
    ],
)
def test_heartbeat_wording_follows_the_online_rule(
    alice: Any, settings: Any, silent_for: timedelta, status: str, line: str
) -> None:
    settings.WORKER_HEARTBEAT_TIMEOUT = 30
    worker, _, _ = make_worker(alice, name="node-a")
    Worker.objects.filter(pk=worker.pk).update(last_heartbeat_at=timezone.now() - silent_for)
    client = Client()
    client.force_login(alice)
    assert presence_of(client, "node-a") == (status, line)
    assert Worker.objects.get(pk=worker.pk).is_online is (status == "online")
    assert Worker.objects.online().filter(pk=worker.pk).exists() is (status == "online")


def test_a_node_that_never_called_has_no_heartbeat_yet(alice: Any) -> None:
    worker, _, _ = make_worker(alice, name="node-a", online=False)
    Worker.objects.filter(pk=worker.pk).update(last_heartbeat_at=None)
    client = Client()
    client.force_login(alice)
    assert presence_of(client, "node-a") == ("offline", "no heartbeat yet")


def log_in(username: str) -> str:
    from tests.factories import PASSWORD

    client = Client()
    response = client.post("/accounts/login/", {"username": username, "password": PASSWORD}, follow=True)
    return response.redirect_chain[-1][0]


def test_a_provider_without_tasks_lands_on_my_workers(alice: Any, bob: Any) -> None:
    make_worker(alice, name="node-a")
    assert log_in("alice") == "/workers/"
    assert log_in("bob") == "/tasks/"  # neither nodes nor tasks
    post_task(alice, "synthetic", {"n": 64})
    assert log_in("alice") == "/tasks/"  # a provider who also posts lands on their tasks
