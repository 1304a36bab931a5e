"""The embedded channel layer: in memory for the one web process, with a spool directory
through which the other processes of `make run` reach it.

Browsers and provider nodes hold their sockets on the one web process, so delivery to them
is in memory. But status changes made by the platform's Celery worker (verification,
settlement, scheduling) and blocks sealed by it must reach those sockets too, and an
in-memory layer cannot cross a process boundary. So a process that hosts no consumer
writes each group message as one JSON file into the spool (atomically: a temporary name,
then a rename), and the web process relays the files it finds there into its own groups.

Only JSON-serialisable messages cross (they are typed event dicts). Messages written
before the web process started relaying are dropped: a page that connects later recovers
its state over REST. Nothing is spooled while no web process is relaying, so the
directory cannot fill up while the server is down. Production uses channels-redis instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from channels.exceptions import ChannelFull
from channels.layers import InMemoryChannelLayer

log = logging.getLogger(__name__)

_MARKER_PREFIX = "relay."
_counter = itertools.count()


def _number(text: str) -> int | None:
    """The non-negative integer a spool file's name part spells, or None."""
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value >= 0 else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class EmbeddedChannelLayer(InMemoryChannelLayer):
    """InMemoryChannelLayer plus a cross-process spool (see the module docstring)."""

    # Expiry sweeps are housekeeping (messages: 60 s, group memberships: a day); the base
    # class runs one on every receive and group_send, walking every queued channel and every
    # membership of every group: O(sockets) per delivery, O(sockets²) per event fanned out
    # to a group (200 browsers on one task: ~80,000 steps per progress event, and enough
    # garbage to trigger full collections mid-fan-out). Once a second keeps the bounds.
    SWEEP_INTERVAL = 1.0
    # A temporary spool file is renamed right after it is written; one this old was left by
    # a writer that died in between.
    ABANDONED_AFTER = 60.0

    def __init__(self, spool: str, poll_interval: float = 0.1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spool = Path(spool)
        self.poll_interval = poll_interval
        self._relay: asyncio.Task[None] | None = None
        self._since_ns = 0
        self._swept_at = 0.0

    def _clean_expired(self) -> None:
        now = time.monotonic()
        if now - self._swept_at >= self.SWEEP_INTERVAL:
            self._swept_at = now
            super()._clean_expired()

    async def _local_group_send(self, group: str, message: dict[str, Any]) -> None:
        """The base group_send without its task per member: sending in memory never waits."""
        assert isinstance(message, dict), "Message is not a dict"
        self.require_valid_group_name(group)
        self._clean_expired()
        for channel in list(self.groups.get(group, ())):
            with contextlib.suppress(ChannelFull):
                await self.send(channel, message)

    # --- the web process: hosting consumers starts the relay ----------------------------

    @property
    def serving(self) -> bool:
        """Whether this process hosts consumers, relaying on a loop that is still running."""
        relay = self._relay
        return relay is not None and not relay.done() and relay.get_loop().is_running()

    def _start_relay(self) -> None:
        if self.serving:
            return
        self.spool.mkdir(parents=True, exist_ok=True)
        self._since_ns = time.time_ns()
        (self.spool / f"{_MARKER_PREFIX}{os.getpid()}").touch()
        self._relay = asyncio.get_running_loop().create_task(self._relay_forever())

    async def new_channel(self, prefix: str = "specific.") -> str:
        self._start_relay()
        return await super().new_channel(prefix)

    async def group_add(self, group: str, channel: str) -> None:
        self._start_relay()
        await super().group_add(group, channel)

    async def _relay_forever(self) -> None:
        while True:
            try:
                await self.relay_pending()
            except Exception:  # a bad file must not stop live updates for everyone
                log.exception("channel spool relay failed; retrying")
            await asyncio.sleep(self.poll_interval)

    async def relay_pending(self) -> int:
        """Deliver (and remove) every spooled message; returns how many were delivered."""
        delivered = 0
        listed = os.listdir(self.spool)
        self._remove_abandoned(n for n in listed if n.startswith("."))
        # A writer's ".<name>" is still being written: it is its writer's until renamed.
        names = sorted(n for n in listed if n.endswith(".json") and not n.startswith("."))
        for name in names:
            path = self.spool / name
            try:
                raw = path.read_bytes()
                path.unlink()
            except FileNotFoundError:
                continue
            written_ns = _number(name.split("-", 1)[0])
            if written_ns is not None and written_ns < self._since_ns:
                continue
            envelope = self._envelope(raw) if written_ns is not None else None
            if envelope is None:
                log.warning("dropping malformed spooled channel message %s", name)
                continue
            await self._local_group_send(*envelope)
            delivered += 1
        return delivered

    def _envelope(self, raw: bytes) -> tuple[str, dict[str, Any]] | None:
        """The group and message of a spooled file, or None unless it is one a consumer can
        take: a message without a type, or with a socket's own ``websocket.*`` type, would
        crash (or close) every consumer of the group."""
        try:
            envelope = json.loads(raw)
            group, message = envelope["group"], envelope["message"]
        except (ValueError, KeyError, TypeError, RecursionError):
            return None
        try:
            self.require_valid_group_name(group)
        except TypeError:
            return None
        if not isinstance(message, dict):
            return None
        kind = message.get("type")
        if not isinstance(kind, str) or kind.startswith("websocket.") or "__asgi_channel__" in message:
            return None
        return group, message

    def _remove_abandoned(self, temporaries: Iterable[str]) -> None:
        """Remove temporary files whose writer died before renaming them (else they stay)."""
        cutoff = time.time() - self.ABANDONED_AFTER
        for name in temporaries:
            path = self.spool / name
            with contextlib.suppress(FileNotFoundError):
                if path.stat().st_mtime < cutoff:
                    path.unlink()

    # --- every process: send locally when serving, else through the spool ---------------

    def _relay_running(self) -> bool:
        try:
            markers = [n for n in os.listdir(self.spool) if n.startswith(_MARKER_PREFIX)]
        except FileNotFoundError:
            return False
        for marker in markers:
            pid = _number(marker[len(_MARKER_PREFIX) :])
            if not pid:  # not a marker this module wrote (and 0 would name every process)
                continue
            if pid != os.getpid() and _alive(pid):
                return True
            if not _alive(pid):
                with contextlib.suppress(FileNotFoundError):
                    (self.spool / marker).unlink()
        return False

    def _spool_write(self, group: str, message: dict[str, Any]) -> None:
        if not self._relay_running():
            return
        data = json.dumps({"group": group, "message": message}).encode()
        name = f"{time.time_ns():020d}-{os.getpid()}-{next(_counter)}.json"
        temporary = self.spool / f".{name}"
        temporary.write_bytes(data)
        os.replace(temporary, self.spool / name)

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        if self.serving:
            await self._local_group_send(group, message)
        else:
            self._spool_write(group, message)
