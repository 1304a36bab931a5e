"""Live feeds through the real ASGI application: a worker's progress and log lines reach
the task owner's ``/ws/tasks/<id>/`` socket, and ``/ws/dashboard/`` relays a user's own
task and worker events to that user only.

Set-up runs synchronously (fixtures, services); only the socket conversations are async,
run with async_to_sync so no asyncio plugin is needed.
"""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator

from config.asgi import application
from ledger.units import UNITS_PER_CREDIT
from tests.factories import make_worker, post_task
from tests.marketplace.test_consumers import ORIGIN, session_cookie
from tests.sockets import open_or_refused
from tests.workers.test_pages import CAPS as RIG_CAPS
from tests.workers.test_pages import make_assignment, make_rig
from workers.live.dashboard import send_dashboard_event
from workers.models import Assignment

pytestmark = pytest.mark.django_db(transaction=True)


def worker_socket(raw_token: str) -> WebsocketCommunicator:
    return WebsocketCommunicator(
        application, "/ws/worker/", headers=[ORIGIN, (b"authorization", f"Worker {raw_token}".encode())]
    )


def browser_socket(path: str, headers: list[tuple[bytes, bytes]]) -> WebsocketCommunicator:
    return WebsocketCommunicator(application, path, headers=[ORIGIN, *headers])


def test_the_task_owner_receives_progress_and_log_lines_from_the_worker(alice: Any, bob: Any) -> None:
    task = post_task(bob, budget=UNITS_PER_CREDIT)
    worker, raw, _ = make_worker(alice, name="alice-h100", caps=RIG_CAPS)
    assignment = make_assignment(task, worker)
    browser = browser_socket(f"/ws/tasks/{task.pk}/", session_cookie("bob"))
    node = worker_socket(raw)

    async def conversation() -> tuple[dict[str, Any], dict[str, Any]]:
        assert (await browser.connect())[0]
        assert (await node.connect())[0]
        await node.send_json_to(
            {
                "type": "progress",
                "assignment_id": str(assignment.pk),
                "step": 5,
                "total": 10,
                "metrics": {"loss": 0.5, "accuracy": 0.75},
                "eta": 12.5,
            }
        )
        progress = await browser.receive_json_from(timeout=5)
        await node.send_json_to({"type": "log", "assignment_id": str(assignment.pk), "lines": ["epoch 1: loss 0.5"]})
        log = await browser.receive_json_from(timeout=5)
        await node.disconnect()
        await browser.disconnect()
        return progress, log

    progress, log = async_to_sync(conversation)()
    assert progress == {
        "type": "task.progress",
        "task_id": str(task.pk),
        "assignment_id": str(assignment.pk),
        "step": 5,
        "total": 10,
        "percent": 50.0,
        "metrics": {"loss": 0.5, "accuracy": 0.75},
        "eta": 12.5,
        "sent_at": None,
    }
    assert log == {
        "type": "task.log",
        "task_id": str(task.pk),
        "assignment_id": str(assignment.pk),
        "lines": ["epoch 1: loss 0.5"],
    }
    # What a reconnecting browser recovers over REST was persisted.
    row = Assignment.objects.get(pk=assignment.pk)
    assert row.progress == 50.0
    assert row.history[-1]["step"] == 5
    assert row.history[-1]["loss"] == 0.5
    assert row.log_tail == ["epoch 1: loss 0.5"]


def test_an_event_naming_another_task_is_not_relayed(alice: Any, bob: Any) -> None:
    task = post_task(bob, budget=UNITS_PER_CREDIT)
    other = post_task(bob, budget=UNITS_PER_CREDIT)
    browser = browser_socket(f"/ws/tasks/{task.pk}/", session_cookie("bob"))

    async def conversation() -> bool:
        assert (await browser.connect())[0]
        layer = get_channel_layer()
        # Sent to this task's group but naming another task: a mis-addressed event stays out.
        await layer.group_send(f"task.{task.pk}", {"type": "task.log", "task_id": str(other.pk), "lines": ["x"]})
        await layer.group_send(f"task.{task.pk}", {"type": "task.log", "task_id": str(task.pk), "lines": ["mine"]})
        event = await browser.receive_json_from(timeout=5)
        quiet = await browser.receive_nothing(timeout=0.2)
        await browser.disconnect()
        return event["lines"] == ["mine"] and quiet

    assert async_to_sync(conversation)()


def test_one_ownership_check_serves_every_tab_of_the_owner(
    alice: Any, bob: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every relayed event is re-checked, but once for all of a user's tabs on the task,
    not once per socket: a progress event costs one query however many tabs follow it."""
    from marketplace import consumers as task_consumers

    monkeypatch.setattr(task_consumers, "ACCESS_TTL", 60.0)  # both events within one answer's life
    task = post_task(bob, budget=UNITS_PER_CREDIT)
    worker, raw, _ = make_worker(alice, name="alice-h100", caps=RIG_CAPS)
    assignment = make_assignment(task, worker)
    tabs = [browser_socket(f"/ws/tasks/{task.pk}/", session_cookie("bob")) for _ in range(5)]
    node = worker_socket(raw)
    checks: list[tuple[Any, str]] = []
    real_check = task_consumers._may_see

    def counted(user: Any, task_id: str) -> bool:
        checks.append((user.pk, task_id))
        return real_check(user, task_id)

    async def conversation() -> list[int]:
        for tab in tabs:
            assert (await tab.connect())[0]
        assert (await node.connect())[0]
        monkeypatch.setattr(task_consumers, "_may_see", counted)  # after the connects' own checks
        for step in (1, 2):
            await node.send_json_to({"type": "progress", "assignment_id": str(assignment.pk), "step": step, "total": 4})
        steps = [(await tab.receive_json_from(timeout=5))["step"] for tab in tabs for _ in (1, 2)]
        for socket in (node, *tabs):
            await socket.disconnect()
        return steps

    assert async_to_sync(conversation)() == [1, 2] * len(tabs)
    assert checks == [(bob.pk, str(task.pk))]


def test_a_deactivated_owner_is_disconnected_from_the_task_on_the_next_event(
    alice: Any, bob: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from marketplace import consumers as task_consumers

    monkeypatch.setattr(task_consumers, "ACCESS_TTL", 0.0)  # no grace: the next event re-asks
    task = post_task(bob, budget=UNITS_PER_CREDIT)
    worker, raw, _ = make_worker(alice, name="alice-h100", caps=RIG_CAPS)
    assignment = make_assignment(task, worker)
    tab = browser_socket(f"/ws/tasks/{task.pk}/", session_cookie("bob"))
    node = worker_socket(raw)

    async def conversation() -> tuple[dict[str, Any], dict[str, Any]]:
        assert (await tab.connect())[0]
        assert (await node.connect())[0]
        progress = {"type": "progress", "assignment_id": str(assignment.pk), "total": 4}
        await node.send_json_to({**progress, "step": 1})
        before = await tab.receive_json_from(timeout=5)
        await database_sync_to_async(type(bob).objects.filter(pk=bob.pk).update)(is_active=False)
        await node.send_json_to({**progress, "step": 2})
        after: dict[str, Any] = await tab.receive_output(timeout=5)
        await node.disconnect()
        return before, after

    before, after = async_to_sync(conversation)()
    assert before["step"] == 1
    assert after == {"type": "websocket.close", "code": 4403}


def test_a_failed_access_check_withholds_the_event_but_keeps_the_tab(
    alice: Any, bob: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.db import DatabaseError

    from marketplace import consumers as task_consumers

    monkeypatch.setattr(task_consumers, "ACCESS_TTL", 0.0)
    task = post_task(bob, budget=UNITS_PER_CREDIT)
    worker, raw, _ = make_worker(alice, name="alice-h100", caps=RIG_CAPS)
    assignment = make_assignment(task, worker)
    tab = browser_socket(f"/ws/tasks/{task.pk}/", session_cookie("bob"))
    node = worker_socket(raw)
    real_check = task_consumers._may_see

    def broken(user: Any, task_id: str) -> bool:
        raise DatabaseError("connection lost")

    async def conversation() -> tuple[bool, dict[str, Any]]:
        assert (await tab.connect())[0]
        assert (await node.connect())[0]
        progress = {"type": "progress", "assignment_id": str(assignment.pk), "total": 4}
        monkeypatch.setattr(task_consumers, "_may_see", broken)
        await node.send_json_to({**progress, "step": 1})
        withheld = await tab.receive_nothing(timeout=0.5)
        monkeypatch.setattr(task_consumers, "_may_see", real_check)
        await node.send_json_to({**progress, "step": 2})
        later = await tab.receive_json_from(timeout=5)
        for socket in (node, tab):
            await socket.disconnect()
        return withheld, later

    withheld, later = async_to_sync(conversation)()
    assert withheld
    assert later["step"] == 2


def test_anonymous_is_refused_on_the_dashboard() -> None:
    socket = browser_socket("/ws/dashboard/", [])

    async def conversation() -> tuple[bool, Any]:
        return await open_or_refused(socket)

    connected, code = async_to_sync(conversation)()
    assert not connected
    assert code == 4403


def test_the_dashboard_relays_a_users_own_task_and_worker_events_only(alice: Any, bob: Any) -> None:
    alices_task = post_task(alice, budget=UNITS_PER_CREDIT)
    bobs_task = post_task(bob, budget=UNITS_PER_CREDIT)
    worker = make_rig(alice, "alice-h100")
    alice_feed = browser_socket("/ws/dashboard/", session_cookie("alice"))
    bob_feed = browser_socket("/ws/dashboard/", session_cookie("bob"))

    async def conversation() -> tuple[list[dict[str, Any]], bool]:
        assert (await alice_feed.connect())[0]
        assert (await bob_feed.connect())[0]
        send = database_sync_to_async(send_dashboard_event)
        await send(
            alice.pk,
            {"type": "dashboard.task", "task_id": str(alices_task.pk), "status": "running", "progress": 30.0},
        )
        await send(alice.pk, {"type": "dashboard.worker", "worker_id": str(worker.pk), "status": "busy"})
        # Addressed to alice's group but naming bob's task: the per-event check drops it.
        await send(
            alice.pk, {"type": "dashboard.task", "task_id": str(bobs_task.pk), "status": "running", "progress": 1.0}
        )
        received = [await alice_feed.receive_json_from(timeout=5), await alice_feed.receive_json_from(timeout=5)]
        alice_quiet = await alice_feed.receive_nothing(timeout=0.3)
        bob_quiet = await bob_feed.receive_nothing(timeout=0.1)
        await alice_feed.disconnect()
        await bob_feed.disconnect()
        return received, alice_quiet and bob_quiet

    received, quiet = async_to_sync(conversation)()
    assert received == [
        {"type": "dashboard.task", "task_id": str(alices_task.pk), "status": "running", "progress": 30.0},
        {"type": "dashboard.worker", "worker_id": str(worker.pk), "status": "busy"},
    ]
    assert quiet


def test_a_deactivated_user_is_disconnected_on_the_next_event(alice: Any) -> None:
    worker = make_rig(alice, "alice-h100")
    feed = browser_socket("/ws/dashboard/", session_cookie("alice"))

    async def conversation() -> dict[str, Any]:
        assert (await feed.connect())[0]
        await database_sync_to_async(type(alice).objects.filter(pk=alice.pk).update)(is_active=False)
        await database_sync_to_async(send_dashboard_event)(
            alice.pk, {"type": "dashboard.worker", "worker_id": str(worker.pk), "status": "offline"}
        )
        output: dict[str, Any] = await feed.receive_output(timeout=5)
        return output

    assert async_to_sync(conversation)() == {"type": "websocket.close", "code": 4403}


def test_the_dashboards_follow_real_changes_of_tasks_and_workers(alice: Any, bob: Any) -> None:
    """No hand-sent events: a node connecting, its progress, a suspension and a cancel
    each reach the owner's dashboard through the code paths that cause them."""
    from marketplace import services as marketplace
    from workers.identity import services as workers

    running = post_task(bob, budget=UNITS_PER_CREDIT)
    waiting = post_task(bob, budget=UNITS_PER_CREDIT)
    worker, raw, _ = make_worker(alice, name="alice-h100", caps=RIG_CAPS, online=False)
    assignment = make_assignment(running, worker)
    alice_feed = browser_socket("/ws/dashboard/", session_cookie("alice"))
    bob_feed = browser_socket("/ws/dashboard/", session_cookie("bob"))
    node = worker_socket(raw)

    async def conversation() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        assert (await alice_feed.connect())[0]
        assert (await bob_feed.connect())[0]
        assert (await node.connect())[0]
        alice_saw = [await alice_feed.receive_json_from(timeout=5)]  # the node came online (busy)
        await node.send_json_to(
            {"type": "progress", "assignment_id": str(assignment.pk), "step": 1, "total": 4, "metrics": {"loss": 1.0}}
        )
        bob_saw = [await bob_feed.receive_json_from(timeout=5)]
        await database_sync_to_async(marketplace.cancel_task)(bob, waiting.pk)
        bob_saw.append(await bob_feed.receive_json_from(timeout=5))
        await database_sync_to_async(workers.set_worker_state)(alice, worker.pk, "suspended")
        alice_saw.append(await alice_feed.receive_json_from(timeout=5))
        assert await bob_feed.receive_nothing(timeout=0.2)  # nothing of alice's worker reaches bob
        for socket in (node, alice_feed, bob_feed):
            await socket.disconnect()
        return alice_saw, bob_saw

    alice_saw, bob_saw = async_to_sync(conversation)()
    assert alice_saw == [
        {"type": "dashboard.worker", "worker_id": str(worker.pk), "status": "busy", "name": "alice-h100"},
        {"type": "dashboard.worker", "worker_id": str(worker.pk), "status": "suspended", "name": "alice-h100"},
    ]
    assert bob_saw[0] == {
        "type": "dashboard.task",
        "task_id": str(running.pk),
        "status": running.status,
        "status_label": running.get_status_display(),
        "progress": 25.0,
    }
    assert bob_saw[1]["task_id"] == str(waiting.pk)
    assert (bob_saw[1]["status"], bob_saw[1]["status_label"]) == ("cancelled", "Cancelled")
