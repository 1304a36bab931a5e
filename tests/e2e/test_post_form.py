"""The post form in a real headless Chromium against daphne: at 1280×800 the estimate stays
in view while the form scrolls, a budget over the balance brings the warning with its link
to buy credits, a refused submit leads with an error summary that takes the focus, and at
375 px the page never scrolls sideways.

Screenshots go to ``var/e2e/`` (git-ignored with the rest of ``var/``) for a person to look at;
the assertions do not read them.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import funded
from tests.e2e.browsing import expect, log_in, new_page, screenshot
from tests.factories import UserFactory

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def shot(page: Any, name: str) -> None:
    screenshot(page, name.removesuffix(".png"))


def in_view(page: Any, selector: str) -> bool:
    """Whether the element's box lies wholly inside the window."""
    box = page.locator(selector).bounding_box()
    return box is not None and box["y"] >= 0 and box["y"] + box["height"] <= page.viewport_size["height"]


def test_the_estimate_stays_in_view_and_warns_of_a_budget_over_the_balance(browser: Any, live_url: str) -> None:
    funded(UserFactory(username="pia"), credits=97)
    with new_page(browser, live_url) as page:
        page.set_viewport_size({"width": 1280, "height": 800})
        log_in(page, "pia")
        page.goto("/tasks/new/cube_training/")
        expect()(page.locator("#estimate-price")).to_be_visible()
        expect()(page.locator("#estimate-run")).to_contain_text("Expected run time: unknown")
        expect()(page.locator("#quality-bar")).to_contain_text("Held-out loss at least 20% below")
        page.locator("#advanced > summary").click()
        expect()(page.get_by_label("Teacher dim")).to_be_visible()
        # A form longer than the window, scrolled to its end: the estimate is still in view.
        assert page.evaluate("document.documentElement.scrollHeight") > 800 * 2
        page.evaluate("window.scrollTo(0, document.documentElement.scrollHeight)")
        page.wait_for_function("window.scrollY > 800")
        assert in_view(page, "#estimate-price")
        assert in_view(page, "#estimate-balance")
        assert in_view(page, "#estimate-panel button[type=submit]")

        page.evaluate("window.scrollTo(0, 0)")
        page.get_by_label("Budget (credits)").fill("298763")
        warning = page.locator("#balance-warning")
        expect()(warning).to_contain_text("Not enough credits.")
        expect()(warning).to_contain_text("Posting this task holds 298763 credits in escrow")
        expect()(warning).to_contain_text("your available balance is 97 credits")
        expect()(warning.get_by_role("link", name="Buy credits")).to_have_attribute("href", "/payments/buy/")
        page.evaluate("window.scrollTo(0, document.documentElement.scrollHeight)")
        page.wait_for_function("window.scrollY > 800")
        assert in_view(page, "#balance-warning")
        assert in_view(page, "#estimate-panel button[type=submit]")
        shot(page, "post-form-1280.png")

        # The refused submit: the summary leads, takes the focus, and its link leads to the field.
        page.get_by_role("button", name="Post task").click()
        summary = page.locator("#error-summary")
        expect()(summary).to_be_focused()
        expect()(summary).to_contain_text("There is a problem: the task was not posted")
        link = summary.get_by_role("link", name="Budget (credits): Your available balance is 97 credits")
        link.click()
        expect()(page.get_by_label("Budget (credits)")).to_be_focused()


def test_an_advanced_field_refused_on_submit_is_shown_open(browser: Any, live_url: str) -> None:
    funded(UserFactory(username="quin"))
    with new_page(browser, live_url) as page:
        log_in(page, "quin")
        page.goto("/tasks/new/synthetic/")
        expect()(page.locator("#advanced")).not_to_have_attribute("open", "")
        page.locator("#advanced > summary").click()
        page.get_by_label("Max attempts").fill("99")
        # The live check opens nothing new (it is open); close it, submit, and it opens again.
        expect()(page.locator("#id_max_attempts_error")).to_contain_text("less than or equal to 10")
        page.locator("#advanced > summary").click()
        page.get_by_role("button", name="Post task").click()
        expect()(page.locator("#advanced")).to_have_attribute("open", "")
        expect()(page.get_by_label("Max attempts")).to_be_visible()
        expect()(page.get_by_label("Max attempts")).to_have_attribute("aria-invalid", "true")


def test_the_post_form_never_scrolls_sideways_on_a_phone(browser: Any, live_url: str) -> None:
    funded(UserFactory(username="rue"), credits=97)
    with new_page(browser, live_url) as page:
        page.set_viewport_size({"width": 375, "height": 740})
        log_in(page, "rue")
        for kind in ("cube_training", "synthetic", "asl_training"):
            page.goto(f"/tasks/new/{kind}/")
            page.locator("#advanced > summary").click()
            page.get_by_label("Budget (credits)").fill("298763123.123456789")
            expect()(page.locator("#balance-warning")).to_be_visible()
            page.get_by_role("button", name="Post task").click()
            expect()(page.locator("#error-summary")).to_be_visible()
            width = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
            assert width[0] <= width[1], f"{kind}: the page is {width[0]} px wide in a {width[1]} px window"
            # On a phone the estimate follows the form, after its last field.
            form_bottom = page.locator(".post-main").bounding_box()
            panel_top = page.locator("#estimate-panel").bounding_box()
            assert form_bottom is not None
            assert panel_top is not None
            assert panel_top["y"] >= form_bottom["y"] + form_bottom["height"] - 1
            shot(page, f"post-form-375-{kind}.png")
