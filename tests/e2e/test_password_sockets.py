"""A password change in a real Chromium: the live pages of the browser that changed it
come back live (their socket closes with 4000 and reconnects with the new cookie), and a
browser signed in elsewhere stops (its reconnect is refused with 4403 and not retried)."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from tests.e2e.browsing import expect, log_in
from tests.factories import PASSWORD, UserFactory

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

NEW_PASSWORD = "another-horse-battery-staple"


def follow_sockets(page: Any) -> list[Any]:
    sockets: list[Any] = []
    page.on("websocket", lambda socket: sockets.append(socket))
    return sockets


def wait_for(page: Any, condition: Any, timeout: float = 15.0) -> None:
    """Poll ``condition``, letting Playwright deliver the page's events meanwhile (its sync
    API dispatches them only inside its own calls, never during ``time.sleep``)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        page.wait_for_timeout(100)


def test_changing_the_password_keeps_this_browser_live_and_stops_the_others(
    browser: Any, page: Any, live_url: str
) -> None:
    UserFactory(username="pat")
    here = follow_sockets(page)
    log_in(page, "pat")  # lands on My tasks, whose socket is /ws/dashboard/
    expect()(page.locator("#dashboard-live")).to_have_text("Live updates on.")
    elsewhere_context = browser.new_context(base_url=live_url)
    try:
        elsewhere = elsewhere_context.new_page()
        there = follow_sockets(elsewhere)
        log_in(elsewhere, "pat")
        expect()(elsewhere.locator("#dashboard-live")).to_have_text("Live updates on.")

        settings_tab = page.context.new_page()
        settings_tab.goto("/accounts/password/")
        settings_tab.get_by_label("Old password").fill(PASSWORD)
        settings_tab.get_by_label("New password", exact=True).fill(NEW_PASSWORD)
        settings_tab.get_by_label("New password confirmation").fill(NEW_PASSWORD)
        settings_tab.get_by_role("button", name="Change password").click()
        expect()(settings_tab).to_have_url(re.compile(r"/accounts/password/done/$"))

        # This browser: the first socket closed, a second one is open and live.
        wait_for(page, lambda: len(here) == 2 and here[0].is_closed())
        expect()(page.locator("#dashboard-live")).to_have_text("Live updates on.")
        assert not here[1].is_closed()
        # The other browser: its reconnect was refused, and it stopped.
        wait_for(elsewhere, lambda: len(there) == 2 and all(socket.is_closed() for socket in there))
        expect()(elsewhere.locator("#dashboard-live")).to_have_text("")
        elsewhere.wait_for_timeout(3000)  # longer than the first retry's delay would be
        assert len(there) == 2
    finally:
        elsewhere_context.close()
