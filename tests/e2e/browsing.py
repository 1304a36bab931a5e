"""Steps every real-browser test takes: Playwright's ``expect`` and signing in."""

from __future__ import annotations

import re
from typing import Any

from tests.factories import PASSWORD


def expect() -> Any:
    """Playwright's ``expect``, imported only when a browser test runs (the suite runs
    without Playwright's import cost, and skips these tests without Chromium)."""
    from playwright.sync_api import expect

    return expect


def log_in(page: Any, username: str) -> None:
    """Sign in on the login page as ``username`` (the test factories' password); lands on
    My tasks."""
    page.goto("/accounts/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect()(page).to_have_url(re.compile(r"/tasks/$"))
