"""WebSocket routes owned by the marketplace."""

from __future__ import annotations

from django.urls import path

from marketplace import consumers

websocket_urlpatterns = [
    path("ws/tasks/<uuid:task_id>/", consumers.TaskConsumer.as_asgi()),
]
