"""``/ws/blocks/``: new blocks as they are sealed. Public, like the explorer."""

from __future__ import annotations

from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from ledger.events import BLOCKS_GROUP


class BlocksConsumer(AsyncJsonWebsocketConsumer):
    """Pushes ``block.sealed`` events; clients only listen."""

    async def connect(self) -> None:
        await self.channel_layer.group_add(BLOCKS_GROUP, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(BLOCKS_GROUP, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        """Nothing to say to the server: any frame is ignored, undecoded (the JSON base
        class would raise on one that is not JSON, closing the socket with 1011)."""

    async def block_sealed(self, event: dict[str, Any]) -> None:
        await self.send_json(event)
