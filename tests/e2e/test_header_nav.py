"""The header on a phone and on a desktop: at 375 px the links and the session fold behind
a Menu button (aria-expanded, keyboard and Escape), at 1280 px they sit in one row beside
the brand, signed in or out; without scripts the links stay reachable on a phone."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.browsing import expect, log_in
from tests.factories import UserFactory

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def context_page(browser: Any, live_url: str, width: int, **options: Any) -> Any:
    context = browser.new_context(base_url=live_url, viewport={"width": width, "height": 800}, **options)
    context.set_default_timeout(15_000)
    return context, context.new_page()


@pytest.fixture
def phone(browser: Any, live_url: str) -> Iterator[Any]:
    context, page = context_page(browser, live_url, 375)
    yield page
    context.close()


def fits(page: Any) -> bool:
    return bool(page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"))


def test_on_a_phone_the_menu_button_shows_and_hides_the_links(phone: Any) -> None:
    UserFactory(username="alice")
    log_in(phone, "alice")
    menu = phone.get_by_role("button", name="Menu")
    nav = phone.get_by_role("navigation", name="Main")
    expect()(menu).to_have_attribute("aria-expanded", "false")
    expect()(nav).to_be_hidden()
    expect()(phone.get_by_role("button", name="Log out")).to_be_hidden()
    header = phone.locator(".site-header").bounding_box()
    assert header is not None
    assert header["height"] <= 80, header  # one row: the brand and the button
    assert fits(phone)

    # Keyboard: Tab reaches the button past the skip link and the brand; Enter opens.
    menu.focus()
    phone.keyboard.press("Enter")
    expect()(menu).to_have_attribute("aria-expanded", "true")
    expect()(nav.get_by_role("link", name="Wallet")).to_be_visible()
    expect()(phone.get_by_role("button", name="Log out")).to_be_visible()
    assert fits(phone)
    phone.keyboard.press("Tab")
    expect()(nav.get_by_role("link", name="Marketplace")).to_be_focused()

    # Escape folds it and gives the focus back to the button.
    phone.keyboard.press("Escape")
    expect()(menu).to_have_attribute("aria-expanded", "false")
    expect()(nav).to_be_hidden()
    expect()(menu).to_be_focused()

    # A click opens it; a link leads on.
    menu.click()
    nav.get_by_role("link", name="Explorer").click()
    expect()(phone).to_have_url(f"{phone.url.split('/explorer')[0].rstrip('/')}/explorer/")
    expect()(phone.get_by_role("button", name="Menu")).to_have_attribute("aria-expanded", "false")


def test_signed_out_on_a_phone_log_in_and_sign_up_are_in_the_menu(phone: Any) -> None:
    phone.goto("/")
    sign_up = phone.locator(".site-header a", has_text="Sign up")
    expect()(sign_up).to_be_hidden()
    phone.get_by_role("button", name="Menu").click()
    expect()(sign_up).to_be_visible()
    expect()(phone.locator(".site-header").get_by_role("link", name="Log in", exact=True)).to_be_visible()
    assert fits(phone)


def test_without_scripts_a_phone_shows_every_link_and_no_button(browser: Any, live_url: str) -> None:
    context, page = context_page(browser, live_url, 375, java_script_enabled=False)
    try:
        page.goto("/")
        expect()(page.get_by_role("button", name="Menu")).to_be_hidden()
        expect()(page.get_by_role("navigation", name="Main").get_by_role("link", name="API docs")).to_be_visible()
        expect()(page.locator(".site-header a", has_text="Sign up")).to_be_visible()
        assert fits(page)
    finally:
        context.close()


@pytest.mark.parametrize("width", [1220, 1280])
@pytest.mark.parametrize("signed_in", [False, True], ids=["signed-out", "signed-in"])
def test_on_a_desktop_the_header_is_one_row_without_a_button(
    browser: Any, live_url: str, signed_in: bool, width: int
) -> None:
    # 1220 px is the narrowest width without the menu button (app.css).
    context, page = context_page(browser, live_url, width)
    try:
        if signed_in:
            UserFactory(username=f"a-long-username-{width}-of-30-letters")
            log_in(page, f"a-long-username-{width}-of-30-letters")
        page.goto("/")
        expect()(page.get_by_role("button", name="Menu")).to_be_hidden()
        expect()(page.get_by_role("navigation", name="Main").get_by_role("link", name="API docs")).to_be_visible()
        # One row: the brand, every link and the session share a top edge.
        tops = page.evaluate(
            "Array.from(document.querySelectorAll('.brand, .nav-list li, .session > *'))"
            ".map((el) => Math.round(el.getBoundingClientRect().top + el.getBoundingClientRect().height / 2))"
        )
        assert max(tops) - min(tops) <= 4, tops
        assert fits(page)
    finally:
        context.close()
