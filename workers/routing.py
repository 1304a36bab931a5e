from __future__ import annotations

from django.urls import path

from workers import dashboard
from workers.api import node_socket

websocket_urlpatterns = [
    path("ws/worker/", node_socket.WorkerConsumer.as_asgi()),
    path("ws/dashboard/", dashboard.DashboardConsumer.as_asgi()),
]
