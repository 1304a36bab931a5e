"""Many ed25519 verifications at once, spread over the machine's cores.

Signature checks dominate admission and the chain audit (a SUBMIT_RESULT carries two).
``cryptography`` has no batch verification, so a large batch is split into chunks for a
small pool of spawned processes (they import only ``protocol.keys``: no Django, no
database connection inherited). Small batches stay in-process, where a pool would cost
more than it saves.

``start`` hands the chunks to the pool and returns at once, so the caller can do other
work (the next batch's encoding, the current one's database writes) while the pool
verifies. (Having the caller also verify chunks the pool has not reached yet gained
nothing measurable: with one pool process per core, the cores are already busy.)
"""

from __future__ import annotations

import atexit
import multiprocessing
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor

from protocol import keys

Item = tuple[bytes, bytes, bytes]  # public key, message, signature

PARALLEL_MIN = 512
# Small enough that the pool's processes finish a batch at about the same time, large
# enough that pickling and the round trip stay well under 1 % of the work.
CHUNK = 128
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


class Verification:
    """A batch of verifications under way; ``result()`` gives the verdicts in order."""

    def __init__(self, items: Sequence[Item], futures: list[Future[list[bool]]] | None) -> None:
        self._items = items
        self._futures = futures
        self._verdicts: list[bool] | None = None

    def result(self) -> list[bool]:
        """Every item's verdict, in order. Blocks until all are verified."""
        if self._verdicts is None:
            if self._futures is None:
                self._verdicts = _verify_chunk(self._items)
            else:
                self._verdicts = [ok for future in self._futures for ok in future.result()]
        return self._verdicts

    def cancel(self) -> None:
        """Drop the verdicts: chunks the pool has not started are never verified."""
        for future in self._futures or ():
            future.cancel()


def start(items: Sequence[Item]) -> Verification:
    """Begin ``keys.verify`` over every item: in the pool when the batch is large enough
    and LEDGER_VERIFY_PROCESSES > 1, else in-process when the result is asked for."""
    size = _processes()
    # A daemonic process (a Celery prefork child) may not start children: verify in-process.
    if size <= 1 or len(items) < PARALLEL_MIN or multiprocessing.current_process().daemon:
        return Verification(items, None)
    pool = _get_pool(size)
    chunks = [items[i : i + CHUNK] for i in range(0, len(items), CHUNK)]
    return Verification(items, [pool.submit(_verify_chunk, chunk) for chunk in chunks])


def verify_many(items: Sequence[Item]) -> list[bool]:
    """``keys.verify`` over every item, in order."""
    return start(items).result()
