"""The platform's Celery app. Provider nodes run their own app in workers/agent/."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("proofwork")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
