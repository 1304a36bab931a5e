"""The marketplace's channel-layer events (typed payloads and their groups), sent with
``config.events.send_event``, and the receivers that close a browser's sockets when its
session ends."""

from __future__ import annotations

import hashlib
from typing import Any, Literal, TypedDict
from uuid import UUID

from django.conf import settings
from django.db import transaction
from django.http import HttpRequest

from config.events import send_event


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


class PasswordChangedEvent(TypedDict):
    """A user's password changed: every browser socket of theirs closes with 4000, which
    the pages answer by reconnecting; a reconnect goes through Django's session check, so
    the browser that changed it (with its new cookie) comes back and every other session,
    a copied cookie included, is refused (4403)."""

    type: Literal["session.password_changed"]


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


def signins_group(user_id: object) -> str:
    """Every browser socket of one user, whichever session it signed in with."""
    return f"signins.{user_id}"


def end_session_sockets(groups: list[str]) -> None:
    """Close the sockets of these session groups. Best effort, like every event: a sign-out
    must never fail because the channel layer is down (it is logged)."""
    for group in groups:
        send_event(group, SessionEndedEvent(type="session.ended"))


def on_user_logged_out(sender: Any, request: HttpRequest | None = None, **kwargs: Any) -> None:
    """``user_logged_out`` receiver. ``logout()`` sends the signal before it flushes the
    session, so its key still names the group of the browser's sockets. (A password
    change cycles the key, but it also sends every socket of the user away to reconnect,
    so none is left in the old key's group.)"""
    session = getattr(request, "session", None)
    if session is not None and session.session_key:
        end_session_sockets([session_group(session.session_key)])


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
        end_session_sockets([session_group(previous)])


def on_user_pre_save(sender: Any, instance: Any, raw: bool = False, update_fields: Any = None, **kwargs: Any) -> None:
    """``pre_save`` receiver for the user model: notes whether this save changes the stored
    password hash (the session auth hash derives from it). One read, and only for saves
    that may write the password: a sign-in's ``update_fields=["last_login"]`` costs none."""
    instance._password_changed = False
    if raw or instance.pk is None or (update_fields is not None and "password" not in update_fields):
        return
    stored = sender._default_manager.filter(pk=instance.pk).values_list("password", flat=True).first()
    instance._password_changed = stored is not None and stored != instance.password


def on_user_post_save(sender: Any, instance: Any, raw: bool = False, **kwargs: Any) -> None:
    """``post_save`` receiver: once a password change commits, close that user's sockets.

    Django signs out every other session of the user on its next request (the session's
    auth hash no longer matches); an open socket makes no request, so it is told to make
    one. Which socket belongs to the browser that changed it cannot be told from the
    socket (a copied cookie has the same session), so all of them reconnect."""
    if not getattr(instance, "_password_changed", False):
        return
    instance._password_changed = False
    event = PasswordChangedEvent(type="session.password_changed")
    group = signins_group(instance.pk)
    transaction.on_commit(lambda: send_event(group, event), robust=True)
