"""The one helper that talks to the channel layer, and the typed events it carries."""

from __future__ import annotations

import logging
from typing import Literal, TypedDict
from uuid import UUID

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

log = logging.getLogger(__name__)


class TaskStatusEvent(TypedDict):
    type: Literal["task.status"]
    task_id: str
    status: str
    status_reason: str
    progress: float


class DashboardTaskEvent(TypedDict):
    type: Literal["dashboard.task"]
    task_id: str
    status: str
    status_label: str
    progress: float


Event = TaskStatusEvent | DashboardTaskEvent


def task_group(task_id: UUID | str) -> str:
    return f"task.{task_id}"


def dashboard_group(user_id: object) -> str:
    """One user's ``/ws/dashboard/`` sockets (their tasks and workers)."""
    return f"dashboard.{user_id}"


def send_event(group: str, payload: Event) -> None:
    """Fan an event out to a group. Best effort: a broken layer never fails the caller."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(group, dict(payload))
    except Exception:  # the event is advisory; the page recovers state over REST
        log.exception("could not send %s to %s", payload["type"], group)
