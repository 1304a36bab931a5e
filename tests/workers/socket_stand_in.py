"""A stand-in for the platform's WebSocket endpoint, for the node's reporter tests: a
server on 127.0.0.1 in a thread of its own for the block of a ``with``, and the
``reporters`` fixture that stops each reporter a test started."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Self

import pytest
from websockets.asyncio.server import ServerConnection, serve

from tests.workers.processes import free_port
from workers.agent.reporter import Reporter


class StandInServer:
    """A WebSocket server on ``port`` (a free one when None); a subclass answers each
    connection in ``handle``. ``started`` is the monotonic time it began listening."""

    def __init__(self, port: int | None = None) -> None:
        self.port = free_port() if port is None else port
        self.started = 0.0
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def handle(self, connection: ServerConnection) -> None:
        raise NotImplementedError

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with serve(self.handle, "127.0.0.1", self.port):
            self.started = time.monotonic()
            self._ready.set()
            await self._stop.wait()

    def __enter__(self) -> Self:
        self._thread.start()
        assert self._ready.wait(5)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(5)


@pytest.fixture
def reporters() -> Iterator[list[Reporter]]:
    """The reporters a test started (it appends them), stopped after the test."""
    started: list[Reporter] = []
    yield started
    for reporter in started:
        reporter.stop()
