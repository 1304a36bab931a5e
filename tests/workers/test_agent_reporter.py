"""The node's WebSocket reporter (workers/agent/reporter.py): it comes back quickly
enough after a platform restart that the platform's 30 s heartbeat timeout never fires,
and ``flush`` means sent.

The platform here is a stand-in WebSocket server on 127.0.0.1 that records what it
receives: what is under test is the client's timing, which the platform's consumer
(covered by test_consumer.py) does not see.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.server import ServerConnection

from tests.workers.processes import free_port
from tests.workers.socket_stand_in import StandInServer, reporters
from workers.agent.reporter import Reporter

PLATFORM_HEARTBEAT_TIMEOUT = 30.0  # config/settings.py WORKER_HEARTBEAT_TIMEOUT
__all__ = ["reporters"]  # a fixture, used by name


class StandIn(StandInServer):
    """Records what it receives: ``received`` holds (monotonic time, event)."""

    def __init__(self, port: int) -> None:
        super().__init__(port)
        self.received: list[tuple[float, dict[str, Any]]] = []
        self.connections = 0
        self.refuse_with: int | None = None  # a close code to refuse every socket with

    async def handle(self, connection: ServerConnection) -> None:
        self.connections += 1
        if self.refuse_with is not None:  # accept, then close at once: as the platform refuses
            await connection.close(code=self.refuse_with)
            return
        async for message in connection:
            self.received.append((time.monotonic(), json.loads(message)))

    def types(self) -> list[str]:
        return [event["type"] for _, event in self.received]


def test_reconnecting_waits_at_most_5_s_and_beats_at_once(
    monkeypatch: pytest.MonkeyPatch, reporters: list[Reporter]
) -> None:
    """The platform is down for a while: no wait between tries exceeds 5 s (with the
    10 s heartbeat interval, a restart costs at most about 15 s of silence, half the
    timeout), and the first thing the reporter says once it is back is a heartbeat."""
    waits: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(delay: float, result: Any = None) -> Any:
        # The reporter's backoff, on a fast clock: only what it asks for is recorded.
        waits.append(delay)
        return await real_sleep(0.005, result)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    port = free_port()  # nothing listens yet: every try is refused at once
    reporter = Reporter(f"http://127.0.0.1:{port}", "pww_test", heartbeat=10.0)
    reporters.append(reporter.start())
    deadline = time.monotonic() + 10
    while len(waits) < 10 and time.monotonic() < deadline:
        time.sleep(0.01)
    backoff = list(waits)
    assert len(backoff) >= 10
    assert max(backoff) <= 5.0
    assert 10.0 + max(backoff) <= PLATFORM_HEARTBEAT_TIMEOUT / 2
    with StandIn(port) as platform:
        assert reporter.connected.wait(5)
        limit = time.monotonic() + 5
        while not platform.received and time.monotonic() < limit:
            time.sleep(0.01)
        first_at, first = platform.received[0]
        assert first == {"type": "heartbeat"}
        assert first_at - platform.started < 2.0
        reporter.stop()


@pytest.mark.parametrize("code", [4401, 4403])
def test_a_refused_node_tries_again_every_minute_and_says_so_once(
    monkeypatch: pytest.MonkeyPatch, reporters: list[Reporter], caplog: pytest.LogCaptureFixture, code: int
) -> None:
    """Suspended, retired or with a replaced token, the node is refused at each try: it
    tries again about once a minute (a suspended worker may be resumed), not every 5 s,
    and logs the refusal once, not at each try. Taken back, it beats at once."""
    waits: list[float] = []
    real_sleep = asyncio.sleep

    def sleep(delay: float, result: Any = None) -> Any:
        # The reporter's own waits only (websockets' keepalive sleeps too), on a fast clock.
        if sys._getframe(1).f_globals["__name__"] == "workers.agent.reporter":
            waits.append(delay)
        return real_sleep(0.005, result)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    port = free_port()
    with StandIn(port) as platform:
        platform.refuse_with = code
        reporter = Reporter(f"http://127.0.0.1:{port}", "pww_test", heartbeat=10.0)
        caplog.set_level("INFO", logger="workers.agent.reporter")
        reporters.append(reporter.start())
        deadline = time.monotonic() + 10
        while platform.connections < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert platform.connections >= 4
        assert len(waits) >= 3
        assert all(48.0 <= wait <= 60.0 for wait in waits), waits
        refusals = [r.getMessage() for r in caplog.records if "refuses this node's socket" in r.getMessage()]
        assert len(refusals) == 1
        assert f"({code})" in refusals[0]
        assert "resumed from its page" in refusals[0]
        # Each refused socket was opened, then closed: none of them reads as a connection.
        assert not [r for r in caplog.records if r.getMessage().startswith("connected to")]
        platform.refuse_with = None  # resumed
        assert reporter.connected.wait(5)
        limit = time.monotonic() + 5
        while not platform.received and time.monotonic() < limit:
            time.sleep(0.01)
        assert platform.received[0][1] == {"type": "heartbeat"}
        limit = time.monotonic() + 5
        while time.monotonic() < limit and not any("socket again" in r.getMessage() for r in caplog.records):
            time.sleep(0.01)
        (back,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("connected to")]
        assert "the platform takes this node's socket again, after" in back
        reporter.stop()


def test_a_node_stopping_during_the_wait_after_a_refusal_stops_at_once(reporters: list[Reporter]) -> None:
    port = free_port()
    with StandIn(port) as platform:
        platform.refuse_with = 4403
        reporter = Reporter(f"http://127.0.0.1:{port}", "pww_test")
        reporters.append(reporter.start())
        deadline = time.monotonic() + 10
        while platform.connections < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)  # refused, and into its minute's wait
        started = time.monotonic()
        reporter.stop()
        assert time.monotonic() - started < 2.0
        assert not reporter._thread.is_alive()
        assert platform.connections == 1


def test_flush_returns_once_the_events_were_sent(monkeypatch: pytest.MonkeyPatch, reporters: list[Reporter]) -> None:
    """On a slow link a send takes time: flush must wait for it, not merely for the
    reporter thread to take the event off its queue, or the final progress can arrive
    after the result."""
    sent: list[str] = []
    real_send = ClientConnection.send

    async def slow_send(self: ClientConnection, message: Any, *args: Any, **kwargs: Any) -> None:
        if '"progress"' in str(message):
            await asyncio.sleep(0.3)
        await real_send(self, message, *args, **kwargs)
        sent.append(json.loads(message)["type"])

    monkeypatch.setattr(ClientConnection, "send", slow_send)
    port = free_port()
    with StandIn(port):
        reporter = Reporter(f"http://127.0.0.1:{port}", "pww_test")
        reporters.append(reporter.start())
        assert reporter.connected.wait(5)
        time.sleep(0.6)  # past the progress rate limit
        reporter.progress("a", 10, 10, {"loss": 0.1}, None)
        reporter.flush()
        assert "progress" in sent
        reporter.stop()


def test_flush_does_not_wait_for_a_socket_that_is_down(reporters: list[Reporter]) -> None:
    reporter = Reporter(f"http://127.0.0.1:{free_port()}", "pww_test")  # nothing listens
    reporters.append(reporter.start())
    reporter.log("a", "failed: out of memory")
    t0 = time.monotonic()
    reporter.flush(timeout=5.0)
    assert time.monotonic() - t0 < 1.0


def test_a_reporter_never_started_stops_cleanly() -> None:
    """The node stops before its consumer was ever ready (the broker was unreachable)."""
    Reporter("http://127.0.0.1:1", "pww_test").stop()
