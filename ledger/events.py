"""Live ledger events for browsers: one group, one typed payload (sent with
``config.events.send_event``)."""

from __future__ import annotations

from typing import Literal, TypedDict

from config.events import send_event

BLOCKS_GROUP = "ledger.blocks"


class BlockSealedEvent(TypedDict):
    type: Literal["block.sealed"]
    height: int
    hash: str
    timestamp: str
    tx_count: int
    gas_used: int


def send_block_event(payload: BlockSealedEvent) -> None:
    """Announce a sealed block. Best effort: the explorer recovers over REST."""
    send_event(BLOCKS_GROUP, payload)
