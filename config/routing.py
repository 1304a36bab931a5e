"""WebSocket routes of every app, collected in one place."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver

from ledger.routing import websocket_urlpatterns as ledger_ws
from marketplace.routing import websocket_urlpatterns as marketplace_ws
from workers.routing import websocket_urlpatterns as workers_ws

websocket_urlpatterns: list[URLPattern | URLResolver] = [*marketplace_ws, *workers_ws, *ledger_ws]
