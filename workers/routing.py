from __future__ import annotations

from django.urls import path

from workers.api import node_socket
from workers.live import dashboard

websocket_urlpatterns = [
    path("ws/worker/", node_socket.WorkerConsumer.as_asgi()),
    path("ws/dashboard/", dashboard.DashboardConsumer.as_asgi()),
]
