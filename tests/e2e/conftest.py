"""Real-browser fixtures: daphne serving the app from a subprocess, headless Chromium.

The daphne subprocess uses the test database itself (the file SQLite test database,
or ``test_<name>`` on PostgreSQL), so a test can create rows, drive the browser, and
check the rows the pages changed. Tests here must use ``django_db(transaction=True)``:
rows have to be committed for the other process to see them.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

CHROMIUM = Path("/usr/bin/chromium")
ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 60


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _database_url(settings_dict: dict[str, Any]) -> str:
    """DATABASE_URL naming the test database this process set up."""
    engine = settings_dict["ENGINE"]
    name = str(settings_dict["NAME"])
    if engine.endswith("sqlite3"):
        if name.startswith("file:") or ":memory:" in name:
            pytest.fail(
                "The SQLite test database is in memory, so the daphne subprocess cannot share it: "
                'set DATABASES["default"]["TEST"]["NAME"] to a file (config/settings.py does).'
            )
        return f"sqlite:///{Path(name).resolve()}"
    if engine.endswith("postgresql"):
        user = quote(str(settings_dict.get("USER") or ""))
        password = settings_dict.get("PASSWORD")
        auth = f"{user}:{quote(str(password))}@" if password else (f"{user}@" if user else "")
        host = settings_dict.get("HOST") or "127.0.0.1"
        port = settings_dict.get("PORT") or 5432
        return f"postgres://{auth}{host}:{port}/{quote(name)}"
    pytest.fail(f"e2e tests do not know how to share a {engine} database with a subprocess")


@pytest.fixture(scope="module")
def live_url(django_db_setup: Any, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of daphne, the real ASGI server (HTTP and WebSocket), on the test database."""
    from django.db import connection

    with django_db_blocker.unblock():
        database_url = _database_url(connection.settings_dict)
    port = _free_port()
    workdir = tmp_path_factory.mktemp("daphne")
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": database_url,
        "PROOFWORK_MEDIA_ROOT": str(workdir / "media"),
        "PROOFWORK_STATIC_ROOT": str(workdir / "static"),
        # As deployed: real error pages, static files collected and served by whitenoise.
        "DJANGO_DEBUG": "0",
        # No provider node runs here: scheduling messages go nowhere instead of piling up in var/.
        "CELERY_BROKER_URL": "memory://",
    }
    subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True
    )
    log_path = workdir / "daphne.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"daphne exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
            try:
                if httpx.get(url + "/accounts/login/", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"daphne did not answer within {START_TIMEOUT_S}s:\n{log_path.read_text()[-4000:]}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium for one test module.

    Playwright's sync API keeps an asyncio loop running in this thread, which makes
    Django refuse ORM calls "from an async context". The calls are synchronous, so the
    check is switched off, and only while the browser lives: module scope ends the loop
    before unrelated tests (WebSocket consumers, async_to_sync) run in this process.
    """
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is absent: install Debian's chromium (apt-get install chromium) to run e2e tests")
    from playwright.sync_api import sync_playwright

    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=str(CHROMIUM),
                args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"],
            )
            yield browser
            browser.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def page(browser: Any, live_url: str) -> Iterator[Any]:
    context = browser.new_context(base_url=live_url, viewport={"width": 1280, "height": 900})
    context.set_default_timeout(15_000)
    page = context.new_page()
    yield page
    context.close()
