"""Provider pages, mounted under /workers/."""

from __future__ import annotations

from django.urls import path

from workers import views

urlpatterns = [
    path("", views.my_workers, name="my-workers"),
    path("start/", views.start, name="start"),
    path("register", views.register, name="worker-register-page"),
    path("register/", views.register),
    path("<uuid:pk>/", views.worker_detail, name="worker-detail"),
    path("<uuid:pk>/<slug:action>/", views.worker_action, name="worker-action"),
    path("tasks/<uuid:pk>/live.json", views.task_live, name="task-live"),
    path("tasks/<uuid:pk>/log.json", views.task_log, name="task-log"),
    path("tasks/<uuid:pk>/log.txt", views.task_log_download, name="task-log-download"),
]
