"""The channel-layer events of the workers app and the group of one worker's sockets
(sent with ``config.events.send_event``)."""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict


def worker_group(worker_id: object) -> str:
    """The ``/ws/worker/`` sockets of one worker: only that worker's own sockets join it."""
    return f"worker.{worker_id}"


class StopEvent(TypedDict):
    """The channel-layer event a worker's sockets turn into ``{"type": "stop", ...}``."""

    type: Literal["worker.stop"]
    assignment_id: str
    reason: str


class CloseEvent(TypedDict):
    """The worker may no longer act (suspended, retired, its owner deactivated): its
    sockets close."""

    type: Literal["worker.close"]


class DashboardWorkerEvent(TypedDict):
    """A worker's status, for its owner's ``/ws/dashboard/``."""

    type: Literal["dashboard.worker"]
    worker_id: str
    status: str
    name: NotRequired[str]
