"""The node's one WebSocket to ``/ws/worker/``: heartbeats, progress, log lines.

Runs in its own thread with its own event loop, so the job (on the Celery worker's
thread) never waits on the network. Progress is coalesced: at most ``max_rate`` events
a second leave, always the latest. The socket reconnects with jittered exponential
backoff capped at ``RECONNECT_MAX_SECONDS`` and sends a heartbeat the moment it is back:
the platform expires a worker's jobs after 30 s without one (WORKER_HEARTBEAT_TIMEOUT),
so a web restart must cost at most one heartbeat interval plus that cap, well below it.

The socket is up only while the node's Celery consumer holds its broker connection
(``broker_lost`` / ``broker_back``, from the agent's consumer step): a node that cannot
take jobs must not look online, or the platform would keep offering it work that waits
in a queue nobody reads. Queued events stay queued and go out once it reconnects.

The platform talks back on the same socket: a ``stop`` naming the job this node runs
goes to ``on_stop`` (the node stops the computation), and a close with 4401/4403 (the
worker suspended, retired or its token replaced) to ``on_refused``. Heartbeats name the
running job (``current``), so a stop sent while the socket was down is answered to the
first heartbeat after it is back. Log lines of one job are coalesced into messages of at
most ``LOG_BATCH`` lines, and at most ``LOG_QUEUE`` lines wait while the socket is down.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import websockets

log = logging.getLogger("workers.agent.reporter")

HEARTBEAT_SECONDS = 10.0
RECONNECT_MAX_SECONDS = 5.0  # jitter included: 10 s between beats + 5 s stays well below the 30 s timeout
# After the platform refused the token (4401) or the worker (4403: suspended or retired):
# tried again this often, since a suspended worker may be resumed, but not every 5 s.
REFUSED_RETRY_SECONDS = 60.0
# A refusal streak is logged as an error once, then reminded of this often.
REFUSED_REMINDER_SECONDS = 600.0
LOG_BATCH = 50  # lines in one log message (the platform takes no more)
LOG_QUEUE = 500  # log lines kept while the socket is down; the oldest go first


def reconnect_delay(failures: int) -> float:
    """Seconds to wait before reconnecting after ``failures`` failed tries in a row (≥ 1)."""
    # The exponent is capped too: 2.0 ** 1024 overflows, and that, after about 85 minutes
    # of a platform down, ended the reporter's thread and the node's heartbeats for good.
    return min(2.0 ** min(failures - 1, 16) * random.uniform(0.8, 1.2), RECONNECT_MAX_SECONDS)


def refused_delay() -> float:
    """Seconds to wait before trying again after the platform refused this node's socket."""
    return REFUSED_RETRY_SECONDS * random.uniform(0.8, 1.0)


def ws_url(server: str) -> str:
    parts = urlsplit(server.rstrip("/"))
    scheme = "wss" if parts.scheme == "https" else "ws"
    return f"{scheme}://{parts.netloc}{parts.path}/ws/worker/"


class Reporter:
    def __init__(self, server: str, token: str, *, max_rate: float = 2.0, heartbeat: float = HEARTBEAT_SECONDS):
        self.url = ws_url(server)
        self.origin = server.rstrip("/")
        self.token = token
        self.min_interval = 1.0 / max_rate
        self.heartbeat = heartbeat
        self._latest: dict[str, dict[str, Any]] = {}
        self._logs: list[dict[str, Any]] = []
        self._in_flight = 0  # events taken off the queues whose send has not returned yet
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake: asyncio.Event | None = None
        self._stopping: asyncio.Event | None = None  # set on the loop by stop(): ends a wait
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, name="reporter", daemon=True)
        self.connected = threading.Event()
        self.broker_up = threading.Event()
        self.current: str | None = None  # the job this node runs, named in heartbeats
        # Called on the reporter's thread: (assignment id, reason) and the close code.
        self.on_stop: Callable[[str, str], None] | None = None
        self.on_refused: Callable[[int], None] | None = None

    def start(self) -> Reporter:
        """Start reporting; the caller's broker connection is up (see ``broker_lost``)."""
        self.broker_up.set()
        self._thread.start()
        return self

    def broker_lost(self) -> None:
        """The node's consumer lost its broker: close the socket, so heartbeats stop."""
        if self.broker_up.is_set():
            log.warning("no broker connection: the socket closes and heartbeats stop until it is back")
        self.broker_up.clear()
        self._poke()

    def broker_back(self) -> None:
        """The consumer is connected again: reconnect and beat at once."""
        if not self.broker_up.is_set() and self._thread.ident is not None:
            log.warning("the broker connection is back: reconnecting the socket")
        self.broker_up.set()
        self._poke()

    def stop(self) -> None:
        self._stop.set()
        self._poke()
        if self._loop is not None and self._stopping is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed already
                self._loop.call_soon_threadsafe(self._stopping.set)
        if self._thread.ident is not None:  # never started: the node stopped before its consumer was ready
            self._thread.join(timeout=5)

    def progress(self, assignment_id: str, step: int, total: int, metrics: dict[str, float], eta: float | None) -> None:
        """Queue a progress event; a newer one for the same assignment replaces it."""
        event = {
            "type": "progress",
            "assignment_id": assignment_id,
            "step": step,
            "total": total,
            "metrics": metrics,
            "eta": eta,
            "sent_at": time.time(),
        }
        with self._lock:
            self._latest[assignment_id] = event
        self._poke()

    def log(self, assignment_id: str, *lines: str) -> None:
        """Queue log lines of a job; they join the last queued message of the same job."""
        with self._lock:
            last = self._logs[-1] if self._logs else None
            if last and last["type"] == "log" and last["assignment_id"] == assignment_id:
                last["lines"].extend(lines)
            else:
                self._logs.append({"type": "log", "assignment_id": assignment_id, "lines": list(lines)})
            self._bound_logs()
        self._poke()

    def stopped(self, assignment_id: str) -> None:
        """Tell the platform this node stopped a job the platform ended."""
        with self._lock:
            self._logs.append({"type": "stopped", "assignment_id": assignment_id})
        self._poke()

    def _bound_logs(self) -> None:
        """At most LOG_QUEUE lines wait (the oldest are dropped), in messages of LOG_BATCH (lock held)."""
        queued = sum(len(item.get("lines", ())) for item in self._logs)
        while queued > LOG_QUEUE:
            first = next(item for item in self._logs if item.get("lines"))
            first["lines"].pop(0)
            queued -= 1
        split: list[dict[str, Any]] = []
        for item in self._logs:
            if item["type"] == "log" and len(item["lines"]) > LOG_BATCH:
                lines = item["lines"]
                split.extend({**item, "lines": lines[i : i + LOG_BATCH]} for i in range(0, len(lines), LOG_BATCH))
            elif item["type"] != "log" or item["lines"]:
                split.append(item)
        self._logs = split

    def flush(self, timeout: float = 5.0) -> None:
        """Wait until queued events have been sent on the socket, the socket is down, or
        the timeout passes. Sent means written to the connection, not merely dequeued."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.connected.is_set():
                return  # nothing will leave until the socket is back; the job need not wait for it
            with self._lock:
                if not self._latest and not self._logs and not self._in_flight:
                    return
            time.sleep(0.02)

    def _poke(self) -> None:
        if self._loop is not None and self._wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the reporter was stopped
                self._loop.call_soon_threadsafe(self._wake.set)

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        if self._stop.is_set():
            return
        failures = 0
        refused_since: float | None = None  # monotonic time of a refusal streak's first
        reminded = 0.0
        while not self._stop.is_set():
            refused = False
            if not self.broker_up.is_set():
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=1.0)
                failures = 0
                continue
            try:
                async with websockets.connect(
                    self.url,
                    additional_headers={"Authorization": f"Worker {self.token}"},
                    origin=websockets.Origin(self.origin),
                    open_timeout=10,
                    ping_interval=20,
                ) as socket:
                    self.connected.set()
                    failures = 0
                    # A refused socket is accepted, then closed at once: "connected" is
                    # said once the socket stays open, not at each refused try.
                    await self._session(socket, settled=functools.partial(self._say_connected, refused_since))
            except websockets.ConnectionClosedError as exc:
                if exc.rcvd is not None and exc.rcvd.code in (4401, 4403):
                    refused = True
                    if self.on_refused is not None:
                        self.on_refused(exc.rcvd.code)
                    now = time.monotonic()
                    if refused_since is None or now - reminded >= REFUSED_REMINDER_SECONDS:
                        log.error(
                            "the platform refuses this node's socket (%s)%s: its worker is suspended or"
                            " retired, or its token was replaced by registering the key again. Trying again"
                            " every minute: a suspended worker may be resumed from its page; a retired one"
                            " must register anew",
                            exc.rcvd.code,
                            "" if refused_since is None else f", for {(now - refused_since) / 60:.0f} min now",
                        )
                        reminded = now
                    refused_since = now if refused_since is None else refused_since
                elif exc.rcvd is not None:
                    # 4429: over the message budget, or too many sockets for this worker
                    # (another process running with this node's token?); retrying after
                    # the backoff is the right answer to both.
                    log.warning("the platform closed the socket (%s: %s); reconnecting", exc.rcvd.code, exc.rcvd.reason)
                else:
                    log.warning("the socket dropped (%s); reconnecting", exc)
            except (TimeoutError, OSError, websockets.WebSocketException) as exc:
                log.warning("WebSocket unavailable (%s); retrying", exc)
            except Exception:  # a bug here must not silence the node's heartbeats for good
                log.exception("reporter session failed; reconnecting")
            self.connected.clear()
            if not refused:  # refusals are accepted, then closed: any other end ends a streak
                refused_since = None
            if self._stop.is_set():
                break
            failures += 1
            await self._pause(refused_delay() if refused else reconnect_delay(failures))

    def _say_connected(self, refused_since: float | None) -> None:
        if refused_since is None:
            log.info("connected to %s", self.url)
        else:
            minutes = (time.monotonic() - refused_since) / 60
            log.info("connected to %s: the platform takes this node's socket again, after %.0f min", self.url, minutes)

    async def _pause(self, seconds: float) -> None:
        """Wait ``seconds`` before the next try, or less when the reporter is stopped: a
        node stopping during a minute's wait after a refusal stops now."""
        assert self._stopping is not None
        sleeper = asyncio.ensure_future(asyncio.sleep(seconds))
        stopper = asyncio.ensure_future(self._stopping.wait())
        await asyncio.wait({sleeper, stopper}, return_when=asyncio.FIRST_COMPLETED)
        for waiter in (sleeper, stopper):
            waiter.cancel()

    async def _session(self, socket: Any, settled: Callable[[], None] | None = None) -> None:
        """Beat and send progress until the socket closes. ``settled`` is called once the
        socket has stayed open past its first wait (a refusal closes it at once)."""
        assert self._wake is not None
        reader = asyncio.ensure_future(self._read(socket))
        try:
            await self._beat_and_send(socket, settled)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader

    async def _read(self, socket: Any) -> None:
        """Hand the platform's messages to their callbacks until the socket closes."""
        with contextlib.suppress(websockets.ConnectionClosed):
            async for raw in socket:
                self.handle(raw)

    def handle(self, raw: str | bytes) -> None:
        """One message from the platform: a ``stop`` goes to ``on_stop``; an ``error``
        (the platform refused something this node sent) is logged; nothing else is acted on."""
        try:
            message = json.loads(raw)
        except (ValueError, RecursionError):
            return
        if not isinstance(message, dict):
            return
        if message.get("type") == "stop":
            assignment_id, reason = message.get("assignment_id"), message.get("reason")
            if isinstance(assignment_id, str) and isinstance(reason, str) and self.on_stop is not None:
                self.on_stop(assignment_id, reason[:300])
        elif message.get("type") == "error":
            log.warning("the platform refused a message: %s", str(message.get("detail"))[:300])

    async def _beat_and_send(self, socket: Any, settled: Callable[[], None] | None) -> None:
        assert self._wake is not None
        next_beat = 0.0  # a new connection beats at once: the platform may be counting since the last one
        last_progress = 0.0
        while not self._stop.is_set():
            if not self.broker_up.is_set():
                return  # the broker is lost (see broker_lost): closing the socket stops the beats
            now = time.monotonic()
            if now >= next_beat:
                current = self.current
                beat = {"type": "heartbeat"} if current is None else {"type": "heartbeat", "assignment_id": current}
                await socket.send(json.dumps(beat))
                next_beat = now + self.heartbeat
            with self._lock:
                logs, self._logs = self._logs, []
                due = now - last_progress >= self.min_interval
                events = list(self._latest.values()) if due else []
                if due:
                    self._latest.clear()
                self._in_flight = len(logs) + len(events)
            try:
                for item in logs:
                    await socket.send(json.dumps(item))
                for item in events:
                    await socket.send(json.dumps(item))
            finally:
                with self._lock:
                    self._in_flight = 0
            if events:
                last_progress = now
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=min(self.min_interval, self.heartbeat))
            # Surface a server-side close promptly instead of at the next send.
            if socket.close_code is not None:
                state = socket.protocol  # the sans-I/O side knows which close frames went each way
                raise websockets.ConnectionClosedError(state.close_rcvd, state.close_sent, state.close_rcvd_then_sent)
            if settled is not None:
                settled()
                settled = None
