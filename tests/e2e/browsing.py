"""Steps every real-browser test takes: a page of its own, Playwright's ``expect`` and
signing in."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.factories import PASSWORD

# Every browser test's screenshots, for a person to look at after a run (git-ignored).
SCREENSHOTS = Path(__file__).resolve().parents[2] / "var" / "test-artifacts" / "screenshots"


@contextmanager
def new_page(browser: Any, base_url: str) -> Iterator[Any]:
    """A page in a fresh browser context (no cookies of another test's) on ``base_url``, for
    the block; a step waits at most 15 s."""
    context = browser.new_context(base_url=base_url, viewport={"width": 1280, "height": 900})
    context.set_default_timeout(15_000)
    try:
        yield context.new_page()
    finally:
        context.close()


def expect() -> Any:
    """Playwright's ``expect``, imported only when a browser test runs (the suite runs
    without Playwright's import cost, and skips these tests without Chromium)."""
    from playwright.sync_api import expect

    return expect


def log_in(page: Any, username: str) -> None:
    """Sign in on the login page as ``username`` (the test factories' password); lands on
    My tasks, or My workers for a provider with nodes and no tasks."""
    page.goto("/accounts/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect()(page).to_have_url(re.compile(r"/(tasks|workers)/$"))


def screenshot(page: Any, name: str, *, full_page: bool = True) -> Path:
    """Save what the page shows as ``<name>.png`` among the suite's screenshots."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path
