"""The market page in a real headless Chromium against daphne: reached from the nav, with
no sign-in, it shows a kind's asks and bids as price levels with their counts."""

from __future__ import annotations

from typing import Any

import pytest

from ledger.units import format_credits
from marketplace import pricing
from tests.conftest import funded
from tests.e2e.browsing import expect, screenshot
from tests.e2e.test_task_page_text import off_the_loop
from tests.factories import UserFactory, make_worker, post_task
from workers.market.asks import set_ask

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

ASK = 200_000_000  # each node's minimum: the default synthetic job pays it
BID = 150_000_000  # over the floor charge, under every ask: the tasks wait in the book


def test_the_market_page_shows_asks_and_bids(page: Any) -> None:
    provider: Any = UserFactory(username="mara")
    for name in ("mara-1", "mara-2"):
        set_ask(make_worker(provider, name=name).worker, "synthetic", 0, ASK)
    requester: Any = funded(UserFactory(username="moss"))
    for _ in range(3):
        off_the_loop(lambda: post_task(requester, "synthetic", {"n": 64}, budget=BID, bid=BID))

    page.goto("/market/")
    page.get_by_role("link", name="Synthetic proof of compute").click()
    expect()(page.get_by_role("heading", name="Synthetic proof of compute")).to_be_visible()
    asks = page.locator("#market-asks tbody tr")
    expect()(asks).to_have_count(1)
    expect()(asks.first.locator("td")).to_have_text([format_credits(pricing.charge(ASK)), "2"])
    bids = page.locator("#market-bids tbody tr")
    expect()(bids).to_have_count(1)
    expect()(bids.first.locator("td")).to_have_text([format_credits(BID), "3"])
    expect()(page.locator("#market-online")).to_have_text("2")
    expect()(
        page.get_by_role("navigation", name="Main").get_by_role("link", name="Market", exact=True)
    ).to_have_attribute("aria-current", "page")
    screenshot(page, "market")
