from __future__ import annotations

from django.urls import path

from workers import consumers, dashboard

websocket_urlpatterns = [
    path("ws/worker/", consumers.WorkerConsumer.as_asgi()),
    path("ws/dashboard/", dashboard.DashboardConsumer.as_asgi()),
]
