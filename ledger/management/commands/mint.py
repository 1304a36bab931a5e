"""``manage.py mint --user NAME --credits N``: development credits before payments exist."""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger import services
from ledger.sealer import seal_all
from ledger.units import credits_to_units, format_credits


class Command(BaseCommand):
    help = "Deposit development credits to a user (refused when DEBUG is off)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--user", required=True, help="username")
        parser.add_argument("--credits", required=True, help="amount in credits, e.g. 100 or 0.5")
        parser.add_argument("--no-seal", action="store_true", help="leave the deposit pending")

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.DEBUG:
            raise CommandError("mint is for development only and is refused when DEBUG is off")
        try:
            units = credits_to_units(options["credits"])
        except ValueError as exc:
            raise CommandError(f"--credits: {exc}") from None
        if units <= 0:
            raise CommandError("--credits: must be positive")
        user = get_user_model().objects.filter(username=options["user"]).first()
        if user is None:
            raise CommandError(f"--user: no user named {options['user']!r}")
        tx = services.deposit(user, units, f"mint:{uuid.uuid4()}")
        if not options["no_seal"]:
            seal_all()
        self.stdout.write(
            f"Minted {format_credits(units)} credits to {user.username} (tx {tx.hash});"
            f" balance {format_credits(services.balance(user))} credits"
        )
