"""Live ledger events for browsers: one group, one typed payload."""

from __future__ import annotations

import logging
from typing import Literal, TypedDict

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

log = logging.getLogger(__name__)

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
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(BLOCKS_GROUP, dict(payload))
    except Exception:  # advisory only
        log.exception("could not announce block %s", payload["height"])
