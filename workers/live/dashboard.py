"""``/ws/dashboard/``: a signed-in user's live feed of their own tasks and workers.

Task status changes come from ``marketplace.lifecycle`` (every transition) and progress
from the ``/ws/worker/`` consumer; worker status (online, busy, suspended, …) from
``worker_changed``, called on commit wherever a worker's state, connection or jobs
change. The consumer joins the user's group (and its session's) on connect and relays
``dashboard.task`` and ``dashboard.worker`` events, re-checking on each one that the user
is still active and owns the row named.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from django.core.exceptions import ValidationError

from config.events import send_event
from marketplace.consumers import SessionConsumer
from marketplace.events import DashboardTaskEvent, dashboard_group
from marketplace.models import Task, User
from workers.live.events import DashboardWorkerEvent
from workers.models import Assignment, Worker

DashboardEvent = DashboardTaskEvent | DashboardWorkerEvent


def send_dashboard_event(user_id: Any, payload: DashboardEvent) -> None:
    """Fan an event out to one user's dashboards. Best effort: never fails the caller.

    Call it from ``transaction.on_commit`` so a browser never sees a rolled-back change.
    """
    send_event(dashboard_group(user_id), payload)


def worker_changed(worker_id: Any) -> None:
    """Send a worker's current status to its owner's dashboards (call it on commit)."""
    worker = Worker.objects.filter(pk=worker_id).only("pk", "owner_id", "name", "state", "last_heartbeat_at").first()
    if worker is None:
        return
    busy = Assignment.objects.filter(
        worker_id=worker.pk, state__in=(Assignment.State.OFFERED, Assignment.State.RUNNING)
    ).exists()
    send_dashboard_event(
        worker.owner_id,
        DashboardWorkerEvent(
            type="dashboard.worker", worker_id=str(worker.pk), status=worker.status(busy), name=worker.name
        ),
    )


class DashboardConsumer(SessionConsumer):
    """One browser tab of a signed-in user; anonymous sockets are closed with 4403, and the
    tabs of a session that ends (logout) with 4401."""

    group: str | None = None
    user_id: Any = None

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.refuse(4403)
            return
        self.user_id = user.pk
        self.group = dashboard_group(user.pk)
        await self.channel_layer.group_add(self.group, self.channel_name)
        if not await self.join_session():  # logged out while connecting
            await self.leave_groups()
            await self.refuse(4403)
            return
        await self.accept()

    async def leave_groups(self) -> None:
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)
            self.group = None
        await super().leave_groups()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        # The feed is one-way; say so rather than ignore a client that talks. Any frame,
        # undecoded: the JSON base class would raise on one that is not JSON (a 1011).
        await self.send_json({"type": "error", "detail": "This socket only sends events."})

    async def dashboard_task(self, event: dict[str, Any]) -> None:
        if await self._may_see(Task, event.get("task_id")):
            await self.send_json(event)

    async def dashboard_worker(self, event: dict[str, Any]) -> None:
        if await self._may_see(Worker, event.get("worker_id")):
            await self.send_json(event)

    async def _may_see(self, model: type[Task] | type[Worker], pk: Any) -> bool:
        allowed = await self._check(model, pk)
        if allowed is None:  # the account was deactivated or deleted since connect
            await self.close(code=4403)
            return False
        return allowed

    @database_sync_to_async
    def _check(self, model: type[Task] | type[Worker], pk: Any) -> bool | None:
        user = User.objects.filter(pk=self.user_id, is_active=True).first()
        if user is None:
            return None
        try:
            return model.objects.owned_by(user).filter(pk=pk).exists()
        except (ValueError, TypeError, ValidationError):  # a malformed id names nothing of ours
            return False
