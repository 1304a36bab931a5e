"""The browsers' sockets (``/ws/tasks/<id>/``, ``/ws/dashboard/``, ``/ws/blocks/``) only
send events; a frame a client sends them anyway (not JSON, binary, blank) must neither
crash the socket (a 1011 and a traceback per frame, the public one by anyone) nor stop
the events that follow."""

from __future__ import annotations

import json
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator

from config.asgi import application
from ledger.events import BLOCKS_GROUP
from marketplace.events import dashboard_group, task_group
from tests.factories import post_task
from tests.marketplace.test_consumers import ORIGIN, session_cookie

pytestmark = pytest.mark.django_db(transaction=True)

STRAY_FRAMES: list[dict[str, Any]] = [
    {"text_data": "{not json"},
    {"text_data": " "},
    {"text_data": "[" * 100_000},
    {"bytes_data": b"\x00\x01"},
]


def survives_stray_frames(path: str, headers: list[tuple[bytes, bytes]], group: str, event: dict[str, Any]) -> None:
    """Send every stray frame, then an event to the socket's group: it arrives."""

    async def conversation() -> None:
        ws = WebsocketCommunicator(application, path, headers=[ORIGIN, *headers])
        assert (await ws.connect())[0]
        for frame in STRAY_FRAMES:
            await ws.send_to(**frame)
        layer = get_channel_layer()
        assert layer is not None
        await layer.group_send(group, event)
        while (output := await ws.receive_output(timeout=5))["type"] == "websocket.send":
            if '"error"' not in output["text"]:  # the dashboard says it only sends events
                break
        assert output == {"type": "websocket.send", "text": json.dumps(event)}
        await ws.disconnect()

    async_to_sync(conversation)()


def test_the_task_socket_survives_stray_frames(alice: Any) -> None:
    task = post_task(alice)
    event = {"type": "task.status", "task_id": str(task.pk), "status": "open", "status_reason": "", "progress": 0.0}
    survives_stray_frames(f"/ws/tasks/{task.pk}/", session_cookie("alice"), task_group(task.pk), event)


def test_the_dashboard_socket_survives_stray_frames(alice: Any) -> None:
    task = post_task(alice)
    event = {
        "type": "dashboard.task",
        "task_id": str(task.pk),
        "status": "open",
        "status_label": "Open",
        "progress": 0.0,
    }
    survives_stray_frames("/ws/dashboard/", session_cookie("alice"), dashboard_group(alice.pk), event)


def test_the_public_blocks_socket_survives_stray_frames() -> None:
    survives_stray_frames("/ws/blocks/", [], BLOCKS_GROUP, {"type": "block.sealed", "height": 2})
