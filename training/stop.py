"""A stop signal the long computations check between their steps.

The node runs one job at a time; when the platform tells it to stop that job (the task
was cancelled, the worker suspended, ...) or the node itself is told to shut down, it
calls ``request(reason)`` from another thread. Every long computation here calls
``check()`` between steps (the training loop's micro-batches and validation batches, the
proof-of-compute products and their generation chunks, the inference batches), which
raises ``Stopped`` once a stop was requested, so the job ends within one step.

The signal is process-wide (a job's helper threads, such as the generation pool, see it
too) and cleared by ``watching()`` when a job starts and when it ends. Outside a job,
``check()`` costs one flag read and never raises unless a stop was requested.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Stopped(Exception):
    """The computation was told to stop; ``reason`` says by whom and why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


_requested = threading.Event()
_lock = threading.Lock()
_reason = ""


def request(reason: str) -> None:
    """Ask the running computation to stop at its next check (any thread)."""
    global _reason
    with _lock:
        if not _requested.is_set():
            _reason = reason
            _requested.set()


def requested() -> str | None:
    """The reason of a pending stop, or None."""
    with _lock:
        return _reason if _requested.is_set() else None


def check() -> None:
    """Raise ``Stopped`` when a stop was requested; return at once otherwise."""
    if _requested.is_set():
        raise Stopped(requested() or "stopped")


def clear() -> None:
    """Forget a pending stop (a new job starts)."""
    global _reason
    with _lock:
        _requested.clear()
        _reason = ""


@contextmanager
def watching() -> Iterator[None]:
    """The block is one job: a stop requested before it or left over after it is dropped."""
    clear()
    try:
        yield
    finally:
        clear()


__all__ = ["Stopped", "check", "clear", "request", "requested", "watching"]
