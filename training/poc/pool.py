"""Chunked work on a few threads: hashlib, numpy and the AVX-512 kernels release the GIL.

The generators' output (AES-CTR and SHAKE), the row hashing and the matrix-vector products
are loops in C; running disjoint chunks on several cores is what keeps them small next to
a multi-threaded BLAS product. The threads are started once per process and kept: a
verification at n = 2048 takes a few milliseconds, and starting a pool for each of its
phases cost a tenth of that. A process forked from one that had the pool (a Celery
prefork child) starts its own.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")
MAX_WORKERS = 8

_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None
_inside = threading.local()


def workers() -> int:
    """Threads to use: the cores this process may run on, at most MAX_WORKERS."""
    try:
        available = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS and Windows
        available = os.cpu_count() or 1
    return max(1, min(MAX_WORKERS, available))


def _forget_after_fork() -> None:
    # The parent's threads do not exist in the child: its executor would never run a task.
    global _executor, _lock
    _executor = None
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


def _pool() -> ThreadPoolExecutor:
    global _executor
    with _lock:
        if _executor is None:
            # The caller's thread is one of the workers (parallel_map): the pool adds the rest.
            _executor = ThreadPoolExecutor(
                max_workers=max(1, workers() - 1), thread_name_prefix="poc", initializer=_mark
            )
        return _executor


def _mark() -> None:
    _inside.worker = True


def chunks(stop: int, pieces: int, start: int = 0) -> list[tuple[int, int]]:
    """``[start, stop)`` cut into at most ``pieces`` contiguous ranges of nearly equal length."""
    total = stop - start
    pieces = max(1, min(pieces, total))
    bounds = [start + total * i // pieces for i in range(pieces + 1)]
    return [(lo, hi) for lo, hi in itertools.pairwise(bounds) if hi > lo]


def submit(fn: Callable[..., R], *args: object) -> Future[R]:
    """Run ``fn(*args)`` on one of the pool's threads; at once on this thread where there is no other core.

    From one of the pool's own threads it also runs at once (see ``parallel_map``).
    """
    if workers() <= 1 or getattr(_inside, "worker", False):
        done: Future[R] = Future()
        try:
            done.set_result(fn(*args))
        except BaseException as exc:
            done.set_exception(exc)
        return done
    return _pool().submit(fn, *args)


def parallel_map(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """``[fn(x) for x in items]``, on the calling thread and the pool's when there is more than one item and core.

    The calling thread takes items too rather than waiting: each call wakes the pool's
    threads once, and on a small machine a thread woken from idle costs tens of
    microseconds, a measurable part of a few-millisecond verification. Called from one of
    the pool's own threads it runs in that thread alone: waiting there for tasks queued
    behind it could wait for ever. An exception from any item is raised here, after every
    thread has stopped taking items.
    """
    helpers = min(workers(), len(items)) - 1
    if helpers <= 0 or getattr(_inside, "worker", False):
        return [fn(x) for x in items]
    results: list[R | None] = [None] * len(items)
    pending = iter(range(len(items)))
    take = threading.Lock()
    failed = threading.Event()

    def drain() -> None:
        while not failed.is_set():
            with take:
                i = next(pending, None)
            if i is None:
                return
            try:
                results[i] = fn(items[i])
            except BaseException:
                failed.set()
                raise

    futures = [_pool().submit(drain) for _ in range(helpers)]
    try:
        drain()
    finally:
        for future in futures:
            future.exception()  # wait: no item may still be running when this returns
    for future in futures:
        if (error := future.exception()) is not None:
            raise error
    return results  # type: ignore[return-value]  # every slot was filled: no item failed
