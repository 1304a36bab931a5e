"""The one helper that talks to the channel layer, and the typed events it carries."""

from __future__ import annotations

import hashlib
import logging
from typing import Any, Literal, TypedDict
from uuid import UUID

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.http import HttpRequest

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


class SessionEndedEvent(TypedDict):
    """The browser session a socket signed in with is over: the socket closes with 4401."""

    type: Literal["session.ended"]


Event = TaskStatusEvent | DashboardTaskEvent | SessionEndedEvent


def task_group(task_id: UUID | str) -> str:
    return f"task.{task_id}"


def dashboard_group(user_id: object) -> str:
    """One user's ``/ws/dashboard/`` sockets (their tasks and workers)."""
    return f"dashboard.{user_id}"


def session_group(session_key: str) -> str:
    """The sockets a browser opened while signed in with one session (``session.ended``).

    Named from a hash of the key, never the key: group names are stored in the layer
    (Redis keys) and may be logged, and a session key is a credential.
    """
    return f"session.{hashlib.sha256(session_key.encode()).hexdigest()}"


def send_event(group: str, payload: Event) -> None:
    """Fan an event out to a group. Best effort: a broken layer never fails the caller."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(group, dict(payload))
    except Exception:  # the event is advisory; the page recovers state over REST
        log.exception("could not send %s to %s", payload["type"], group)


def end_session_sockets(session_key: str | None) -> None:
    """Close the sockets signed in with ``session_key``. Best effort, like every event: a
    sign-out must never fail because the channel layer is down (it is logged)."""
    if session_key:
        send_event(session_group(session_key), SessionEndedEvent(type="session.ended"))


def on_user_logged_out(sender: Any, request: HttpRequest | None = None, **kwargs: Any) -> None:
    """``user_logged_out`` receiver. ``logout()`` sends the signal before it flushes the
    session, so the key is still the one the browser's sockets signed in with."""
    session = getattr(request, "session", None)
    if session is not None:
        end_session_sockets(session.session_key)


def on_user_logged_in(sender: Any, request: HttpRequest | None = None, **kwargs: Any) -> None:
    """``user_logged_in`` receiver. Signing in over another user's session ends that session
    (``login()`` flushes it) without a ``user_logged_out``; by now the request holds the new
    key, but its cookie still names the old one. Re-signing in as the same user keeps the
    key (nothing to end); an anonymous session's key is cycled, but no socket of this app
    signs in anonymously, so that group is empty and the send costs one round trip."""
    if request is None or not hasattr(request, "session"):
        return
    previous = request.COOKIES.get(settings.SESSION_COOKIE_NAME)
    if previous and previous != request.session.session_key:
        end_session_sockets(previous)
