"""Real-browser fixtures: daphne serving the app from a subprocess, headless Chromium.

The daphne subprocess uses the test database itself (the file SQLite test database,
or ``test_<name>`` on PostgreSQL), so a test can create rows, drive the browser, and
check the rows the pages changed. Tests here must use ``django_db(transaction=True)``:
rows have to be committed for the other process to see them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.browsing import new_page
from tests.workers import processes

CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="module")
def live_url(django_db_setup: Any, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of daphne, the real ASGI server (HTTP and WebSocket), on the test database."""
    with django_db_blocker.unblock(), processes.deployed_daphne(tmp_path_factory.mktemp("daphne")) as url:
        yield url


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
    with new_page(browser, live_url) as page:
        yield page
