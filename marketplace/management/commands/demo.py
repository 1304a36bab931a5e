"""Create the demo requester and a few demo tasks; print how to sign in. Idempotent."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ledger.units import UNITS_PER_CREDIT
from marketplace import demo, services
from marketplace.models import Task, User

# Small enough that the local agent finishes all three within a minute on two cores, so a
# newcomer's first task starts at once (docs/pages.md records the measured times). The cube
# run is a 4³ lattice on 64-wide synthetic embeddings: it still has to beat the platform's
# held-out loss bar and prove its training like any other.
DEMO_TASKS: list[tuple[str, str, dict[str, Any]]] = [
    ("Proof of compute, 512²", "synthetic", {"n": 512}),
    ("Proof of compute, 1024² × 2", "synthetic", {"n": 1024, "count": 2}),
    (
        "Cube autoencoder on synthetic embeddings",
        "cube_training",
        {
            "teacher_dim": 64,
            "lattice_edge": 4,
            "state_size": 8,
            "epochs": 6,
            "batch_size": 16,
            "warmup_steps": 5,
            "learning_rate": 1e-2,
            "synthetic_samples": 192,
        },
    ),
]


class Command(BaseCommand):
    help = "Create the demo user (printed) and demo tasks. Refused in production."

    def handle(self, *args: Any, **options: Any) -> None:
        from django.conf import settings

        if settings.PRODUCTION:
            raise CommandError("The demo data is for development; PROOFWORK_PRODUCTION is set.")
        username, password = demo.requester().username, demo.requester().password
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
