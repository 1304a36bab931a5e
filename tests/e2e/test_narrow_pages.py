"""The wallet and the explorer's pages fit a phone's width: nothing makes the page itself
scroll sideways (wide tables scroll inside their own box), at 375 px and at 1280 px.

The chain is real: deposits, a task's escrow, a worker's reward and its signed
SUBMIT_RESULT (a long payload) sealed into blocks through the ledger's services.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from ledger import hooks, services
from ledger.models import Block, Transaction
from ledger.sealer import seal_all
from ledger.units import UNITS_PER_CREDIT
from tests.e2e.browsing import expect, log_in
from tests.factories import post_task
from tests.ledger.chain import build_chain

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

WIDTHS = (375, 1280)

# What sticks out past the viewport, for a failure message that says where to look.
OVERFLOWING = """() => {
  const width = window.innerWidth;
  const scrolls = (el) => getComputedStyle(el).overflowX !== "visible";
  const inScroller = (el) => {
    for (let up = el.parentElement; up && up !== document.body; up = up.parentElement) if (scrolls(up)) return true;
    return false;
  };
  // Boxes past the right edge, and boxes whose text runs out of them.
  return Array.from(document.querySelectorAll("body *"))
    .filter((el) => !inScroller(el))
    .filter((el) => el.getBoundingClientRect().right > width + 0.5 || (!scrolls(el) && el.scrollWidth > el.clientWidth + 1 && el.clientWidth > 0))
    .slice(-8)
    .map((el) => el.tagName.toLowerCase() + (el.id ? "#" + el.id : "") + (el.className ? "." + String(el.className).split(" ").join(".") : "") + " right=" + Math.round(el.getBoundingClientRect().right) + " scrollWidth=" + el.scrollWidth);
}"""


@pytest.fixture
def assignments() -> Iterator[set[tuple[uuid.UUID, str]]]:
    """Stands in for the workers app's assignment check, so a SUBMIT_RESULT is admitted."""
    known: set[tuple[uuid.UUID, str]] = set()
    previous = hooks.registered_assignment_checker()
    hooks.register_assignment_checker(lambda task, address: None if (task, address) in known else "no_assignment")
    yield known
    hooks.register_assignment_checker(previous)


@pytest.fixture
def chain(assignments: set[tuple[uuid.UUID, str]]) -> dict[str, Any]:
    chain = build_chain(assignments)
    # A large balance with every decimal place: the longest figure a stat card shows.
    services.deposit(chain["alice"], 123_456_789 * UNITS_PER_CREDIT + 123_456_789, "big-alice")
    task = post_task(chain["alice"], spec={"n": 512}, title="A task whose escrow is on the ledger")
    chain["escrow"] = Transaction.objects.filter(payload__task_id=str(task.pk)).order_by("pk").first()
    seal_all()
    return chain


def assert_fits(page: Any, path: str) -> None:
    response = page.goto(path)
    assert response is not None, path
    assert response.status == 200, path
    page.wait_for_load_state("load")
    scroll_width, inner_width = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert scroll_width <= inner_width, (
        f"{path} is {scroll_width} px wide in a {inner_width} px viewport: {page.evaluate(OVERFLOWING)}"
    )


@pytest.mark.parametrize("width", WIDTHS)
def test_wallet_and_explorer_pages_never_scroll_sideways(
    browser: Any, live_url: str, chain: dict[str, Any], width: int
) -> None:
    context = browser.new_context(base_url=live_url, viewport={"width": width, "height": 800})
    context.set_default_timeout(15_000)
    page = context.new_page()
    try:
        log_in(page, "alice")
        submit = Transaction.objects.get(hash=chain["result_hash"])
        assert submit.block is not None
        escrow = chain["escrow"]
        assert escrow is not None
        assert Transaction.objects.get(pk=escrow.pk).block_id is not None
        head = Block.objects.order_by("-height").first()
        assert head is not None
        paths = [
            "/wallet/",
            f"/explorer/address/{services.ensure_user_account(chain['alice']).address}/",
            f"/explorer/address/{chain['worker'].address}/",
            "/explorer/",
            f"/explorer/blocks/{submit.block.height}/",
            f"/explorer/blocks/{head.height}/",
            f"/explorer/tx/{submit.hash}/",
            f"/explorer/tx/{escrow.hash}/",
        ]
        for path in paths:
            assert_fits(page, path)
        # The header is one row: on a phone the brand and the Menu button (the links fold
        # behind it, tests/e2e/test_header_nav.py).
        header = page.locator(".site-header").bounding_box()
        assert header is not None
        assert header["height"] <= 80, header
        # The payload is indented JSON, not a Python dict.
        page.goto(f"/explorer/tx/{submit.hash}/")
        payload = page.locator("#tx-payload")
        expect()(payload).to_contain_text('"compute_result": {')
        expect()(payload).not_to_contain_text("'compute_result'")
    finally:
        context.close()
