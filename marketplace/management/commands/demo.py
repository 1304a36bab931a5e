"""Create the demo requester and a few demo tasks; print how to sign in. Idempotent."""

from __future__ import annotations

import os
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ledger.units import UNITS_PER_CREDIT
from marketplace import services
from marketplace.models import Task, User

DEMO_TASKS = [
    ("Proof of compute, 1024²", "synthetic", {"n": 1024}),
    ("Proof of compute, 2048² × 2", "synthetic", {"n": 2048, "count": 2}),
    ("Cube autoencoder on synthetic embeddings", "cube_training", {"epochs": 3}),
]


class Command(BaseCommand):
    help = "Create the demo user (printed) and demo tasks. Refused in production."

    def handle(self, *args: Any, **options: Any) -> None:
        from django.conf import settings

        if settings.PRODUCTION:
            raise CommandError("The demo data is for development; PROOFWORK_PRODUCTION is set.")
        username = os.environ.get("PROOFWORK_DEMO_USER", "demo")
        password = os.environ.get("PROOFWORK_DEMO_PASSWORD", "demo-password-123")
        user, created = User.objects.get_or_create(username=username, defaults={"email": "demo@example.com"})
        if created:
            user.set_password(password)
            user.save(update_fields=["password"])
            services.welcome_user(user)
            for title, kind, spec in DEMO_TASKS:
                services.post_task(
                    user, services.TaskRequest(kind=kind, spec=spec, title=title, budget=5 * UNITS_PER_CREDIT)
                )
        count = Task.objects.owned_by(user).count()
        self.stdout.write(
            self.style.SUCCESS(
                f"Demo requester: username {username!r}, password {password!r} ({count} demo tasks)"
                + ("" if created else "; already existed, password unchanged")
            )
        )
