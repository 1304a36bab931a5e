"""Print the demo logins and the site's address in a box once the site answers.

``make run`` starts it beside the other Procfile processes: by the time the site answers,
the logins ``make demo`` printed have scrolled away under the workers' logs. It prints the
demo logins only (never a setting), then waits for Ctrl-C, since honcho stops every process
once one of them exits.
"""

from __future__ import annotations

import signal
import time
import urllib.error
import urllib.request
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from marketplace import demo
from marketplace.models import User


def answers(url: str) -> bool:
    """Whether ``url`` answers 200 (a redirect followed)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 (the site's own http URL)
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def login_line(login: demo.DemoLogin) -> str:
    """How to sign in as ``login``: its password only while it is still the one it was
    created with (the account already existed with another one otherwise)."""
    user = User.objects.filter(username=login.username).first()
    if user is None:
        return f"{login.role}: {login.username!r} has not been created (run `make demo`)"
    if not user.check_password(login.password):
        return f"{login.role}: {login.username!r} (password as you set it)"
    return f"{login.role}: {login.username} / {login.password}"


def boxed(lines: list[str]) -> str:
    """``lines`` in a box of plain ASCII (any terminal, any log viewer)."""
    width = max(len(line) for line in lines)
    rule = "+" + "-" * (width + 2) + "+"
    return "\n".join([rule, *(f"| {line.ljust(width)} |" for line in lines), rule])


class Command(BaseCommand):
    help = "Wait until the site answers, then print its address and the demo logins in a box."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--url", default="http://127.0.0.1:8000/", help="The site's address.")
        parser.add_argument("--timeout", type=float, default=300, help="Seconds to wait for the site.")
        parser.add_argument("--exit", action="store_true", help="Exit after printing instead of waiting.")

    def handle(self, *args: Any, **options: Any) -> None:
        if settings.PRODUCTION:
            raise CommandError("The demo logins are for development; PROOFWORK_PRODUCTION is set.")
        url = options["url"]
        deadline = time.monotonic() + options["timeout"]
        while not answers(url):
            if time.monotonic() > deadline:
                self.stderr.write(f"{url} did not answer within {options['timeout']:.0f} s; no banner.")
                return self._stay(options)
            time.sleep(0.5)
        lines = [
            f"Proofwork is up: {url}",
            "",
            "Demo logins (username / password):",
            "  " + login_line(demo.requester()),
            "  " + login_line(demo.provider()),
            "",
            "Ctrl-C stops every process.",
        ]
        self.stdout.write(boxed(lines))
        self.stdout.flush()
        self._stay(options)

    def _stay(self, options: dict[str, Any]) -> None:
        if not options["exit"]:
            signal.pause()
