"""The platform's Celery app. Provider nodes run their own app in workers/agent/."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("proofwork")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def enqueue(name: str, *args: object) -> None:
    """Queue the task registered under ``name`` with these JSON arguments.

    How a module starts work that a module above it defines, without importing it (the
    marketplace schedules a task of the workers app, a service its own app's task). The
    queue comes from ``CELERY_TASK_ROUTES``. Call it from ``transaction.on_commit``.
    """
    if name not in app.tasks:
        # A web process imports no tasks module until it needs one: autodiscovery
        # registers every app's tasks, so the task runs as configured (inline when eager).
        app.loader.import_default_modules()
    app.tasks[name].delay(*args)
