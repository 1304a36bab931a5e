"""The explorer's front page in a real browser: latest blocks and latest transactions side
by side on a desktop and stacked on a phone, Copy buttons that copy the whole hash, and a
search for "#2" and for nothing, typed into the box every page shows."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from ledger import hooks
from ledger.models import Block
from tests.e2e.browsing import expect
from tests.ledger.chain import build_chain

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def chain() -> Iterator[dict[str, Any]]:
    known: set[tuple[uuid.UUID, str]] = set()
    previous = hooks.registered_assignment_checker()
    hooks.register_assignment_checker(lambda task, address: None if (task, address) in known else "no_assignment")
    yield build_chain(known)
    hooks.register_assignment_checker(previous)


def boxes(page: Any) -> tuple[dict[str, float], dict[str, float]]:
    blocks = page.locator("section[aria-labelledby=blocks-heading]").bounding_box()
    txs = page.locator("section[aria-labelledby=txs-heading]").bounding_box()
    assert blocks is not None
    assert txs is not None
    return blocks, txs


def test_columns_copy_buttons_and_search(browser: Any, live_url: str, chain: dict[str, Any]) -> None:
    context = browser.new_context(base_url=live_url, viewport={"width": 1280, "height": 900})
    context.grant_permissions(["clipboard-read", "clipboard-write"])
    context.set_default_timeout(15_000)
    page = context.new_page()
    try:
        page.goto("/explorer/")
        blocks, txs = boxes(page)
        assert txs["x"] > blocks["x"] + blocks["width"] - 1  # beside
        assert abs(txs["y"] - blocks["y"]) < 2
        expect()(page.locator("#stat-pending")).to_have_text("1")
        # Scripts show the Copy buttons; one copies the whole block hash.
        block = Block.objects.get(height=2)
        button = page.locator(f'#blocks-body button[data-copy-text="{block.hash}"]')
        expect()(button).to_be_visible()
        button.click()
        expect()(button).to_have_text("Copied")
        assert page.evaluate("navigator.clipboard.readText()") == block.hash
        # Search as the pages write a height, then for nothing.
        page.fill("#q", "#2")
        page.press("#q", "Enter")
        page.wait_for_url("**/explorer/blocks/2/")
        page.goto("/explorer/")
        page.fill("#q", "no-such-thing")
        page.press("#q", "Enter")
        expect()(page.locator("#no-match")).to_contain_text(
            "No block, transaction, address or task matches “no-such-thing”."
        )
        # On a phone the two lists are stacked.
        page.set_viewport_size({"width": 375, "height": 800})
        page.goto("/explorer/")
        blocks, txs = boxes(page)
        assert txs["y"] >= blocks["y"] + blocks["height"] - 1
        assert page.evaluate("document.documentElement.scrollWidth") <= 375
    finally:
        context.close()


def test_without_scripts_hashes_stay_plain_text(browser: Any, live_url: str, chain: dict[str, Any]) -> None:
    context = browser.new_context(base_url=live_url, java_script_enabled=False)
    page = context.new_page()
    try:
        page.goto("/explorer/")
        assert page.locator("button[data-copy-text]").count() > 0
        assert page.locator("button[data-copy-text]:visible").count() == 0
        expect()(page.locator("#latest-txs")).to_contain_text("Treasury")
    finally:
        context.close()
