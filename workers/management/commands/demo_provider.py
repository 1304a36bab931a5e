"""Create the demo provider and register a local agent node for it. Idempotent.

The node's key and credentials go under var/agent/ (mode 0600). Registration runs the
same protocol the CLI uses over HTTP: a one-time token, a signed challenge, and the
node's own signed REGISTER_WORKER transaction; only the transport is in-process, since
the server is not up yet when ``make run`` prepares the demo.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from marketplace import demo
from marketplace import services as marketplace_services
from marketplace.models import User
from protocol.wire import registration_message, sign_template
from workers.agent import capabilities
from workers.agent.identity import Credentials, credentials_path, init_key, load_key
from workers.assignments import nodebroker
from workers.identity import services
from workers.models import Worker


class Command(BaseCommand):
    help = "Create the demo provider and register the local agent's key (var/agent/worker.pem)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--server", default=f"http://127.0.0.1:{os.environ.get('PORT', '8000')}")

    def handle(self, *args: Any, **options: Any) -> None:
        if settings.PRODUCTION:
            raise CommandError("The demo provider is for development; PROOFWORK_PRODUCTION is set.")
        username, password = demo.provider().username, demo.provider().password
        user, created = User.objects.get_or_create(username=username, defaults={"email": "provider@example.com"})
        if created:
            user.set_password(password)
            user.save(update_fields=["password"])
            marketplace_services.welcome_user(user)
        key_path = Path(settings.VAR_DIR) / "agent" / "worker.pem"
        key = load_key(key_path) if key_path.exists() else init_key(key_path)
        creds_path = credentials_path(key_path)
        worker = Worker.objects.filter(address=key.address).first()
        # Registered again when a node broker was configured since: the agent needs its login.
        stale = creds_path.exists() and nodebroker.configured() and not Credentials.load(creds_path).broker_url
        if worker is None or not creds_path.exists() or stale:
            _, raw = services.create_registration_token(user)
            public_key = key.public_key.hex()
            offer = services.issue_challenge(raw, public_key)
            worker, token, _, broker_url = services.register_worker(
                raw,
                public_key,
                key.sign(registration_message(offer["challenge"], public_key)).hex(),
                capabilities.detect(),
                "local-agent",
                sign_template(offer["register_tx"], key).hex(),
            )
            Credentials(
                server=options["server"],
                worker_id=str(worker.pk),
                address=key.address,
                token=token,
                chain_id=offer["register_tx"]["chain_id"],
                broker_url=broker_url or "",
            ).save(creds_path)
        self.stdout.write(
            self.style.SUCCESS(
                f"Demo provider: username {username!r}, password {password!r}"
                + ("" if created else " (already existed, password unchanged)")
                + f"; local agent {worker.name} {worker.address}"
            )
        )
