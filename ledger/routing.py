"""WebSocket routes owned by the ledger."""

from __future__ import annotations

from django.urls import path

from ledger import consumers

websocket_urlpatterns = [
    path("ws/blocks/", consumers.BlocksConsumer.as_asgi()),
]
