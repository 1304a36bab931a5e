"""/ws/tasks/<id>/ through the real ASGI application: session auth, owner only, and
status events sent when a service's transaction commits.

Set-up runs synchronously (fixtures, services); only the socket conversation is async,
run with async_to_sync so no asyncio plugin is needed.
"""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.db import transaction
from django.test import Client

from config.asgi import application
from marketplace import services
from tests.factories import PASSWORD, post_task
from tests.sockets import open_or_refused

# Events go out on transaction commit, so these tests need real commits.
pytestmark = pytest.mark.django_db(transaction=True)

ORIGIN = (b"origin", b"http://testserver")


def session_cookie(username: str) -> list[tuple[bytes, bytes]]:
    client = Client()
    assert client.login(username=username, password=PASSWORD)
    value = client.cookies[settings.SESSION_COOKIE_NAME].value
    return [(b"cookie", f"{settings.SESSION_COOKIE_NAME}={value}".encode())]


def communicator(task_id: Any, headers: list[tuple[bytes, bytes]]) -> WebsocketCommunicator:
    return WebsocketCommunicator(application, f"/ws/tasks/{task_id}/", headers=[ORIGIN, *headers])


@async_to_sync
async def connect(ws: WebsocketCommunicator) -> tuple[bool, int | str | None]:
    connected, code = await open_or_refused(ws)
    await ws.disconnect()
    return connected, code


def test_owner_receives_the_status_event_when_the_task_is_cancelled(alice: Any) -> None:
    task = post_task(alice)
    ws = communicator(task.pk, session_cookie("alice"))

    async def conversation() -> dict[str, Any]:
        connected, _ = await ws.connect()
        assert connected
        await database_sync_to_async(services.cancel_task)(alice, task.pk)
        event: dict[str, Any] = await ws.receive_json_from(timeout=5)
        await ws.disconnect()
        return event

    assert async_to_sync(conversation)() == {
        "type": "task.status",
        "task_id": str(task.pk),
        "status": "cancelled",
        "status_reason": "Cancelled by you.",
        "progress": 0.0,
    }


def test_a_waiting_tasks_new_reason_reaches_its_page(alice: Any, bob: Any) -> None:
    """The status stays open; the page still hears why it waits now (a worker came online)."""
    from tests.factories import make_worker
    from workers.assignments import scheduler

    task = post_task(alice, "synthetic", {"n": 64}, min_reputation=90)
    scheduler.schedule(task.pk)
    task.refresh_from_db()
    assert task.status_reason.startswith("Waiting for a worker: no worker is online.")
    ws = communicator(task.pk, session_cookie("alice"))

    async def conversation() -> tuple[dict[str, Any], bool]:
        assert (await ws.connect())[0]
        await database_sync_to_async(make_worker)(bob, reputation=50)
        await database_sync_to_async(scheduler.schedule)(task.pk)
        event: dict[str, Any] = await ws.receive_json_from(timeout=5)
        await database_sync_to_async(scheduler.schedule)(task.pk)  # nothing new to say
        quiet = await ws.receive_nothing(timeout=0.5)
        await ws.disconnect()
        return event, quiet

    event, quiet = async_to_sync(conversation)()
    assert event["type"] == "task.status"
    assert event["status"] == "open"
    assert event["status_reason"].startswith("Waiting for a worker: of the 1 online, 1 has reputation below 90.")
    assert quiet


def test_no_event_is_sent_when_the_transaction_rolls_back(alice: Any) -> None:
    task = post_task(alice)
    ws = communicator(task.pk, session_cookie("alice"))

    def cancel_then_fail() -> None:
        with transaction.atomic():
            services.cancel_task(alice, task.pk)
            raise RuntimeError("rolled back")

    async def conversation() -> bool:
        assert (await ws.connect())[0]
        with pytest.raises(RuntimeError):
            await database_sync_to_async(cancel_then_fail)()
        quiet = await ws.receive_nothing(timeout=0.5)
        await ws.disconnect()
        return quiet

    assert async_to_sync(conversation)()
    task.refresh_from_db()
    assert task.status == "open"


def test_another_user_is_refused(alice: Any, bob: Any) -> None:
    task = post_task(alice)
    assert connect(communicator(task.pk, session_cookie("bob"))) == (False, 4403)


def test_anonymous_is_refused(alice: Any) -> None:
    task = post_task(alice)
    assert connect(communicator(task.pk, [])) == (False, 4403)


def test_a_foreign_origin_is_refused(alice: Any) -> None:
    task = post_task(alice)
    ws = WebsocketCommunicator(
        application, f"/ws/tasks/{task.pk}/", headers=[(b"origin", b"http://evil.example"), *session_cookie("alice")]
    )
    # Refused at the handshake by the origin check, before any consumer runs: a page on
    # another site gets no code to read, by design.
    connected, _ = async_to_sync(ws.connect)()
    assert connected is False


def test_a_missing_task_is_refused(alice: Any) -> None:
    ws = communicator("00000000-0000-0000-0000-000000000000", session_cookie("alice"))
    assert connect(ws) == (False, 4403)
