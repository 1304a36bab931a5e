"""``manage.py demo_banner`` (a Procfile process of ``make run``): once the site answers it
prints the address and the demo logins in a box, and nothing it was not asked to."""

from __future__ import annotations

import http.server
import io
import socketserver
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from marketplace.models import User
from tests.workers.processes import free_port, serving

pytestmark = pytest.mark.django_db


class _Answering(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def site() -> Iterator[str]:
    server = socketserver.TCPServer(("127.0.0.1", 0), _Answering)
    with serving(server):
        yield f"http://127.0.0.1:{server.server_address[1]}/"


def banner(url: str, timeout: float = 10) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("demo_banner", url=url, timeout=timeout, exit=True, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def demo_user(username: str, password: str) -> User:
    return User.objects.create_user(username, password=password)


def test_prints_the_address_and_both_demo_logins_in_a_box(site: str, settings: Any) -> None:
    demo_user("demo", "demo-password-123")
    demo_user("provider", "provider-password-123")
    out, _ = banner(site)
    lines = out.strip().splitlines()
    assert lines[0].startswith("+-")
    assert lines[-1] == lines[0]
    assert all(line.startswith("| ") and line.endswith(" |") and len(line) == len(lines[0]) for line in lines[1:-1])
    assert f"Proofwork is up: {site}" in out
    assert "requester: demo / demo-password-123" in out
    assert "provider: provider / provider-password-123" in out
    assert settings.SECRET_KEY not in out


def test_a_changed_password_is_not_printed(site: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The account existed before with another password: the configured one would not work.
    demo_user("demo", "set-by-the-user-456")
    monkeypatch.setenv("PROOFWORK_DEMO_PROVIDER", "someone")
    out, _ = banner(site)
    assert "requester: 'demo' (password as you set it)" in out
    assert "demo-password-123" not in out
    assert "set-by-the-user-456" not in out
    assert "provider: 'someone' has not been created (run `make demo`)" in out
    assert "provider-password-123" not in out


def test_no_banner_while_the_site_does_not_answer() -> None:
    demo_user("demo", "demo-password-123")
    out, err = banner(f"http://127.0.0.1:{free_port()}/", timeout=1)
    assert out == ""
    assert "did not answer within 1 s; no banner." in err


def test_refused_in_production(settings: Any, site: str) -> None:
    settings.PRODUCTION = True
    with pytest.raises(CommandError, match="PROOFWORK_PRODUCTION"):
        banner(site)
