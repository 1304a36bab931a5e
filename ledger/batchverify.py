"""Many ed25519 verifications at once, spread over the machine's cores.

Signature checks dominate admission and the chain audit (a SUBMIT_RESULT carries two).
``cryptography`` has no batch verification, so a large batch is split across a small
pool of spawned processes (they import only ``ledger.keys``: no Django, no database
connection inherited). Small batches stay in-process, where a pool would cost more than
it saves.
"""

from __future__ import annotations

import atexit
import multiprocessing
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor

from ledger import keys

Item = tuple[bytes, bytes, bytes]  # public key, message, signature

PARALLEL_MIN = 512
_pool: ProcessPoolExecutor | None = None
_pool_size = 0


def _verify_chunk(items: Sequence[Item]) -> list[bool]:
    return [keys.verify(pk, msg, sig) for pk, msg, sig in items]


def _processes() -> int:
    from django.conf import settings

    return int(getattr(settings, "LEDGER_VERIFY_PROCESSES", 1))


def _get_pool(size: int) -> ProcessPoolExecutor:
    global _pool, _pool_size
    if _pool is None or _pool_size != size:
        if _pool is not None:
            _pool.shutdown(wait=False, cancel_futures=True)
        _pool = ProcessPoolExecutor(max_workers=size, mp_context=multiprocessing.get_context("spawn"))
        _pool_size = size
    return _pool


@atexit.register
def _shutdown() -> None:
    if _pool is not None:
        _pool.shutdown(wait=False, cancel_futures=True)


def verify_many(items: Sequence[Item]) -> list[bool]:
    """``keys.verify`` over every item, in order."""
    size = _processes()
    if size <= 1 or len(items) < PARALLEL_MIN:
        return _verify_chunk(items)
    step = -(-len(items) // (size * 2))
    chunks = [items[i : i + step] for i in range(0, len(items), step)]
    out: list[bool] = []
    for part in _get_pool(size).map(_verify_chunk, chunks):
        out.extend(part)
    return out
