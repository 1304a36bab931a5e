"""WebSocket consumers for the requester's browser."""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from marketplace.events import task_group
from marketplace.models import Task


class TaskConsumer(AsyncJsonWebsocketConsumer):
    """``/ws/tasks/<id>/``: live status of one task, for its owner only."""

    group: str | None = None

    async def connect(self) -> None:
        user = self.scope.get("user")
        task_id = self.scope["url_route"]["kwargs"]["task_id"]
        if user is None or not user.is_authenticated or not await self._owns(user, task_id):
            await self.close(code=4403)
            return
        self.group = task_group(task_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def task_status(self, event: dict[str, Any]) -> None:
        await self.send_json(event)

    async def task_progress(self, event: dict[str, Any]) -> None:
        """A worker's step, metrics and ETA, relayed by ``/ws/worker/``."""
        if self._is_ours(event):
            await self.send_json(event)

    async def task_log(self, event: dict[str, Any]) -> None:
        """Log lines a worker sent for this task."""
        if self._is_ours(event):
            await self.send_json(event)

    def _is_ours(self, event: dict[str, Any]) -> bool:
        # Ownership was checked on connect and the group is per task, so the per-event
        # check is that the event names this socket's task: no query per progress event
        # (hundreds of browsers may follow one task).
        return self.group is not None and self.group == task_group(str(event.get("task_id", "")))

    @database_sync_to_async
    def _owns(self, user: Any, task_id: Any) -> bool:
        return Task.objects.visible_to(user).filter(pk=task_id).exists()
