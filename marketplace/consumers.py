"""WebSocket consumers for the requester's browser, and the base of every live consumer."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from channels.auth import get_user
from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.db import DatabaseError

from marketplace.events import session_group, signins_group, task_group
from marketplace.models import Task

log = logging.getLogger(__name__)

# How long one ownership check vouches for every socket of that user on that task in this
# process: the bound on how late a user who lost access (deactivated) stops receiving.
ACCESS_TTL = 1.0
# Close code: the session may have changed (a password change); reconnect, and the
# handshake's session check decides. Pages wait a moment first (see static/js).
RECONNECT = 4000


class LiveConsumer(AsyncJsonWebsocketConsumer):
    """A JSON consumer whose database access goes through ``database_sync_to_async`` only.

    Channels hops to the sync thread before every message it dispatches, to close stale
    database connections. ``database_sync_to_async`` already closes them around each call,
    so for these consumers the hop only costs: a thread round trip per socket per event,
    serialised on the one sync thread (200 browsers on a task: 200 hops per progress
    event, queued behind any database write of the process). Subclasses must not use the
    ORM outside ``database_sync_to_async``.
    """

    refused = False  # closed by ``refuse``: frames the client sends meanwhile are not read

    async def dispatch(self, message: dict[str, Any]) -> None:
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def refuse(self, code: int) -> None:
        """Refuse the socket with an application close code the client can read.

        A close before ``accept`` is a refused handshake: the server answers HTTP 403 and a
        browser reports only 1006 (abnormal closure), so a page cannot tell "signed out"
        from "server down" and keeps reconnecting. Accepting, then closing at once, carries
        the code (4401, 4403) to the client; nothing is sent in between, and a subclass that
        reads frames drops those sent after (``refused``)."""
        self.refused = True
        await self.accept()
        await self.close(code=code)


class SessionConsumer(LiveConsumer):
    """A browser's socket, signed in through its session cookie.

    Besides its feed's group it joins its session's (``join_session``, on connect: named
    from the session key), so that logging out of that browser closes it with 4401 (``session.ended``), and its user's,
    so that a password change closes it with 4000 (``session.password_changed``): the page
    reconnects, and only a session still signed in is let back. Subclasses leave their
    feed's groups in ``leave_groups``.
    """

    joined_sessions: tuple[str, ...] = ()  # the session groups this socket is in

    async def join_session(self) -> bool:
        """Join the groups of the session this socket signed in with (call it on connect,
        once the user is known to be signed in: their session then has a key). False when
        that session has ended meanwhile: the caller refuses the socket.

        The user was read from the session before the connect began; a logout since sent
        its ``session.ended`` before this socket could hear it. Joining first and checking
        second narrows that gap to the instant between logout's signal and its flush: a
        logout after the join reaches the socket, one before it has deleted the session."""
        session = self.scope.get("session")
        if session is None or not session.session_key:
            return True
        self.joined_sessions = (session_group(session.session_key), signins_group(self.scope["user"].pk))
        for group in self.joined_sessions:
            await self.channel_layer.group_add(group, self.channel_name)
        if not await database_sync_to_async(session.exists)(session.session_key):
            return False
        # Django's own check again, now that the socket hears changes: the session's auth
        # hash still matches the user's password (a change meanwhile signed it out) and the
        # account is still active.
        user = await get_user(self.scope)
        return bool(user.is_authenticated and user.pk == self.scope["user"].pk)

    async def leave_groups(self) -> None:
        """Leave every group this socket joined (idempotent); subclasses leave their feed's
        group, then call this."""
        groups, self.joined_sessions = self.joined_sessions, ()
        for group in groups:
            await self.channel_layer.group_discard(group, self.channel_name)

    async def disconnect(self, code: int) -> None:
        await self.leave_groups()

    async def session_ended(self, event: dict[str, Any]) -> None:
        """The session was logged out, or replaced by signing in as someone else."""
        await self.leave_groups()
        await self.close(code=4401)

    async def session_password_changed(self, event: dict[str, Any]) -> None:
        """The user's password changed: reconnect (4000), through the session check."""
        await self.leave_groups()
        await self.close(code=RECONNECT)


class TaskAccess:
    """Process-wide, single-flight ownership checks shared by the sockets of one (user, task).

    Hundreds of tabs may follow one task, and each must re-check on every event that its
    user may still see it. One query per socket per event would put hundreds of database
    round trips on every progress event; instead the first socket that needs a fresh
    answer asks once, every other socket of that user and task awaits the same answer, and
    the answer is trusted for ``ACCESS_TTL`` seconds from when the question was asked.
    """

    def __init__(self) -> None:
        self._answers: dict[tuple[Any, str], tuple[float, bool]] = {}
        self._pending: dict[tuple[Any, str, asyncio.AbstractEventLoop], asyncio.Future[bool | None]] = {}

    async def allowed(self, user: Any, task_id: str) -> bool | None:
        """Whether ``user`` is still active and still owns the task; None when the database
        could not say (nothing is cached then: the next event asks again)."""
        answer = self._answers.get((user.pk, task_id))
        if answer is not None and time.monotonic() - answer[0] < ACCESS_TTL:
            return answer[1]
        key = (user.pk, task_id, asyncio.get_running_loop())  # a future belongs to one loop
        pending = self._pending.get(key)
        if pending is None:
            pending = asyncio.ensure_future(self._ask(user, task_id))
            self._pending[key] = pending
            pending.add_done_callback(lambda _: self._pending.pop(key, None))
        return await asyncio.shield(pending)

    async def _ask(self, user: Any, task_id: str) -> bool | None:
        asked_at = time.monotonic()
        try:
            # Not thread-sensitive: a read on a connection of its own, so it never waits
            # behind the worker socket's progress writes on the shared sync thread.
            allowed = await database_sync_to_async(_may_see, thread_sensitive=False)(user, task_id)
        except DatabaseError:
            # A blip must not close every tab of the task at once (and have them all
            # reconnect together); this event is withheld, the next one asks again.
            log.exception("could not re-check access of user %s to task %s", user.pk, task_id)
            return None
        self._answers = {k: v for k, v in self._answers.items() if asked_at - v[0] < ACCESS_TTL}
        self._answers[(user.pk, task_id)] = (asked_at, allowed)
        return allowed


def _may_see(user: Any, task_id: str) -> bool:
    return Task.objects.owned_by(user).filter(pk=task_id, owner__is_active=True).exists()


task_access = TaskAccess()


class TaskConsumer(SessionConsumer):
    """``/ws/tasks/<id>/``: live status of one task, for its owner only.

    Ownership is checked on connect and again for every event relayed (through
    ``task_access``); a socket whose user lost access is closed with 4403 on the next event,
    and one whose session ends (logout) with 4401.
    """

    group: str | None = None
    task_id: str = ""

    async def connect(self) -> None:
        user = self.scope.get("user")
        task_id = str(self.scope["url_route"]["kwargs"]["task_id"])
        if user is None or not user.is_authenticated or not await database_sync_to_async(_may_see)(user, task_id):
            await self.refuse(4403)
            return
        self.task_id = task_id
        self.group = task_group(task_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        if not await self.join_session():
            await self.leave_groups()
            await self.refuse(4403)
            return
        await self.accept()

    async def leave_groups(self) -> None:
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)
            self.group = None
        await super().leave_groups()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        """The feed is one-way: any frame is ignored, undecoded (the JSON base class would
        raise on one that is not JSON, closing the socket with 1011)."""

    async def task_status(self, event: dict[str, Any]) -> None:
        if await self._may_relay(event):
            await self.send_json(event)

    async def task_progress(self, event: dict[str, Any]) -> None:
        """A worker's step, metrics and ETA, relayed by ``/ws/worker/``."""
        if await self._may_relay(event):
            await self.send_json(event)

    async def task_log(self, event: dict[str, Any]) -> None:
        """Log lines a worker sent for this task."""
        if await self._may_relay(event):
            await self.send_json(event)

    async def _may_relay(self, event: dict[str, Any]) -> bool:
        """The per-event check: the event names this socket's task, and its user may still
        see it. A user who may not is dropped from the group and disconnected."""
        if self.group is None or str(event.get("task_id", "")) != self.task_id:
            return False
        allowed = await task_access.allowed(self.scope["user"], self.task_id)
        if allowed is None:  # unknown: withhold the event, keep the socket
            return False
        if allowed:
            return True
        await self.leave_groups()
        await self.close(code=4403)
        return False
