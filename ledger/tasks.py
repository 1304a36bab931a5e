"""Celery tasks of the ledger. JSON arguments only; running twice is harmless."""

from __future__ import annotations

from celery import shared_task

from ledger.sealer import seal_all


@shared_task(name="ledger.tasks.seal_pending", ignore_result=True)
def seal_pending() -> int:
    """Seal what is pending (beat runs it every LEDGER_BLOCK_TIME seconds, admission
    sooner when the mempool is full). A second concurrent run finds the lock taken and
    returns 0. Returns the number of blocks sealed."""
    return len(seal_all(max_blocks=20))
