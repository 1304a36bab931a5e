"""Per-assignment rate limits for ``/ws/worker/``, shared by every socket of this process.

A node may hold several sockets at once (a reconnect overlapping the old one, or on
purpose), so a limit kept per socket multiplies with its sockets. These are kept per key
(an assignment, or an assignment and an event type) for the whole process instead:

- ``Coalescer``: fan-out to a group at most once per interval per key, the last event of
  a burst always delivered;
- ``Throttle``: whether a write may run now (once per interval, plus once for a final one);
- ``WriteBuffer``: items gathered in memory and written at most once per interval.

Per worker rather than per assignment (``/ws/worker/``'s flood guard):

- ``Allowance``: a token bucket, so a node's sockets share one message budget;
- ``Openings``: which sockets a node holds open, the oldest displaced past a cap.

They hold timers, and a timer belongs to one event loop: daphne runs one per process, the
tests one per scenario, so state found on another loop is stale and starts afresh. Keys
idle for ``IDLE_FORGET`` seconds are forgotten; forgetting costs at most one early write
or send, which the callers' own checks (the row, for progress) bound.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

IDLE_FORGET = 300.0  # seconds


@dataclass
class _Outbox:
    loop: asyncio.AbstractEventLoop
    sent_at: float = -math.inf
    pending: tuple[str, dict[str, Any]] | None = None
    timer: asyncio.Task[None] | None = None


class Coalescer:
    """At most one group message per ``interval`` per key; the last of a burst still goes out.

    An event that follows a quiet interval is sent at once, so an isolated event gains no
    latency. One that follows sooner is held until the interval's end, merged with
    whatever else arrives meanwhile (``merge(held, newer)``: a newer progress event
    replaces the held one, log lines join), and sent then: a burst reaches the group at
    most 1/interval times a second and ends on its latest state.
    """

    def __init__(self, merge: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]) -> None:
        self._merge = merge
        self._boxes: dict[Hashable, _Outbox] = {}

    async def send(self, layer: Any, group: str, key: Hashable, event: dict[str, Any], interval: float) -> None:
        now = time.monotonic()
        box = self._box(key, now)
        if box.timer is None and now - box.sent_at >= interval:
            box.sent_at = now
            await layer.group_send(group, event)
            return
        held = box.pending[1] if box.pending is not None else None
        box.pending = (group, event if held is None else self._merge(held, event))
        if box.timer is None:
            delay = max(0.0, box.sent_at + interval - now)
            box.timer = box.loop.create_task(self._send_later(layer, box, delay))

    async def _send_later(self, layer: Any, box: _Outbox, delay: float) -> None:
        await asyncio.sleep(delay)
        pending, box.pending, box.timer = box.pending, None, None
        box.sent_at = time.monotonic()
        if pending is None:
            return
        try:
            await layer.group_send(*pending)
        except Exception:  # no socket is left to report to; the page recovers over REST
            log.exception("could not send a held %s to %s", pending[1].get("type"), pending[0])

    def _box(self, key: Hashable, now: float) -> _Outbox:
        loop = asyncio.get_running_loop()
        box = self._boxes.get(key)
        if box is None or box.loop is not loop:
            self._boxes = {k: b for k, b in self._boxes.items() if b.timer is not None or now - b.sent_at < IDLE_FORGET}
            box = self._boxes[key] = _Outbox(loop)
        return box


class Throttle:
    """Whether a write for a key may run now: once per interval, plus once for a final one.

    ``admit`` decides and reserves in one step (no await in between), so two sockets of
    one process cannot both pass; ``done`` restarts the interval from the end of the write,
    so the next one is measured from when the row was actually written.
    """

    def __init__(self) -> None:
        self._last: dict[Hashable, tuple[float, bool]] = {}  # key → (last admitted, final admitted)

    def admit(self, key: Hashable, interval: float, *, final: bool = False) -> bool:
        now = time.monotonic()
        last, final_seen = self._last.get(key, (-math.inf, False))
        if now - last < interval and (final_seen or not final):
            return False
        if key not in self._last:
            self._last = {k: v for k, v in self._last.items() if now - v[0] < IDLE_FORGET}
        self._last[key] = (now, final_seen or final)
        return True

    def done(self, key: Hashable) -> None:
        if key in self._last:
            self._last[key] = (time.monotonic(), self._last[key][1])


@dataclass
class _Buffer:
    loop: asyncio.AbstractEventLoop
    lock: asyncio.Lock
    items: list[Any] = field(default_factory=list)
    written_at: float = -math.inf
    timer: asyncio.Task[None] | None = None


class WriteBuffer:
    """Items per key, written by ``write(key, items)`` at most once per interval.

    ``add`` writes at once when the last write of that key is an interval old, else makes
    sure a timer writes at the interval's end. Only the last ``limit`` items are kept. One
    lock per key serialises the writes, so items reach the row in the order they came. A
    failed write is logged and its items dropped (they are advisory, like the events).
    """

    def __init__(self, write: Callable[[Any, list[Any]], Awaitable[None]], limit: int) -> None:
        self._write = write
        self._limit = limit
        self._buffers: dict[Hashable, _Buffer] = {}

    async def add(self, key: Hashable, items: list[Any], interval: float) -> None:
        now = time.monotonic()
        buffer = self._buffer(key, now)
        buffer.items = (buffer.items + items)[-self._limit :]
        if buffer.timer is not None:
            return
        delay = buffer.written_at + interval - now
        if delay <= 0:
            await self.flush(key)
        else:
            buffer.timer = buffer.loop.create_task(self._flush_later(key, buffer, delay))

    async def flush(self, key: Hashable) -> None:
        """Write what is buffered for ``key`` now, whatever the interval (on disconnect)."""
        buffer = self._buffers.get(key)
        if buffer is None or buffer.loop is not asyncio.get_running_loop():
            return
        async with buffer.lock:
            items, buffer.items = buffer.items, []
            if not items:
                return
            buffer.written_at = time.monotonic()
            try:
                await self._write(key, items)
            except Exception:
                log.exception("could not write %d buffered items for %s", len(items), key)

    async def _flush_later(self, key: Hashable, buffer: _Buffer, delay: float) -> None:
        await asyncio.sleep(delay)
        buffer.timer = None
        await self.flush(key)

    def _buffer(self, key: Hashable, now: float) -> _Buffer:
        loop = asyncio.get_running_loop()
        buffer = self._buffers.get(key)
        if buffer is None or buffer.loop is not loop:
            self._buffers = {
                k: b
                for k, b in self._buffers.items()
                if b.items or b.timer is not None or b.lock.locked() or now - b.written_at < IDLE_FORGET
            }
            buffer = self._buffers[key] = _Buffer(loop, asyncio.Lock())
        return buffer


class Allowance:
    """A token bucket per key: ``burst`` messages at once, refilled at ``rate`` a second.

    Kept per worker for the whole process, so a node's sockets draw on one budget: opening
    more of them buys no more messages, and a socket closed for flooding does not come
    back with a fresh budget. A bucket that has refilled is the same as a new one, so full
    ones are dropped now and then (a new key prunes them once the map holds ``PRUNE_AT``).
    No timers: the state is valid on any event loop.
    """

    PRUNE_AT = 1024

    def __init__(self) -> None:
        self._buckets: dict[Hashable, tuple[float, float]] = {}  # key → (allowance, at)

    def take(self, key: Hashable, rate: float, burst: float) -> bool:
        """Spend one message of ``key``'s budget; False (spending nothing) when it is empty."""
        now = time.monotonic()
        if key not in self._buckets and len(self._buckets) >= self.PRUNE_AT:
            self._buckets = {k: (a, t) for k, (a, t) in self._buckets.items() if a + (now - t) * rate < burst}
        allowance, at = self._buckets.get(key, (burst, now))
        allowance = min(burst, allowance + (now - at) * rate)
        if allowance < 1.0:
            self._buckets[key] = (allowance, now)
            return False
        self._buckets[key] = (allowance - 1.0, now)
        return True


class Openings:
    """The sockets each key (a worker) holds open in this process, oldest first, under a cap.

    Past the cap the oldest are displaced rather than the newest refused: a node whose
    network drops without a FIN leaves sockets the server still counts until their pings
    time out, and refusing its live reconnection meanwhile would silence its heartbeats.
    """

    def __init__(self) -> None:
        self._open: dict[Hashable, list[str]] = {}

    def open(self, key: Hashable, name: str, limit: int) -> list[str]:
        """Count socket ``name`` for ``key``; return the oldest ones it displaces to stay
        within ``limit`` (no longer counted: the caller closes them)."""
        names = self._open.setdefault(key, [])
        names.append(name)
        displaced = names[: max(0, len(names) - limit)]
        del names[: len(displaced)]
        return displaced

    def close(self, key: Hashable, name: str) -> None:
        names = self._open.get(key, [])
        if name in names:
            names.remove(name)
        if not names:
            self._open.pop(key, None)

    def count(self, key: Hashable) -> int:
        return len(self._open.get(key, ()))
