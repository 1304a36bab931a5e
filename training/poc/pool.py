"""Chunked work on a few threads: hashlib and numpy release the GIL on large buffers.

The generators' output (AES-CTR and SHAKE) and the int64 matrix-vector products are
memory-bound loops in C; running disjoint chunks on several cores is what keeps them small
next to a multi-threaded BLAS product. (Hashing C's rows stays on one thread: each row's
digest re-takes the GIL, see ``commit.row_leaf_hashes``.)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")
MAX_WORKERS = 8


def workers() -> int:
    """Threads to use: the cores this process may run on, at most MAX_WORKERS."""
    try:
        available = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS and Windows
        available = os.cpu_count() or 1
    return max(1, min(MAX_WORKERS, available))


def parallel_map(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """``[fn(x) for x in items]``, on threads when there is more than one item and core."""
    count = min(workers(), len(items))
    if count <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=count) as pool:
        return list(pool.map(fn, items))
