"""Reloading the page that showed a secret, in a real headless Chromium against daphne.

The reload re-sends the form's POST; it must create nothing and say so, not make a second
token that nobody sees.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from marketplace.models import ApiToken
from tests.e2e.browsing import expect, log_in
from tests.factories import UserFactory
from workers.models import RegistrationToken

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def page_without_js(browser: Any, live_url: str) -> Iterator[Any]:
    """A page whose forms post as plain HTML forms (htmx swaps the token form otherwise)."""
    context = browser.new_context(base_url=live_url, java_script_enabled=False)
    context.set_default_timeout(15_000)
    page = context.new_page()
    yield page
    context.close()


def test_reloading_the_registration_token_creates_no_second_one(page: Any) -> None:
    UserFactory(username="petra")
    log_in(page, "petra")
    page.goto("/workers/register")
    page.get_by_role("button", name="Create registration token").click()
    token = page.locator("#registration-token").inner_text()
    assert token.startswith("pwr_")
    assert RegistrationToken.objects.count() == 1

    page.reload()
    expect()(page).to_have_url(re.compile(r"/workers/register$"))
    expect()(page.locator("#messages")).to_contain_text("This form was already submitted")
    expect()(page.locator("#registration-token")).to_have_count(0)
    assert RegistrationToken.objects.count() == 1
    # The page it lands on still creates one.
    page.get_by_role("button", name="Create registration token").click()
    expect()(page.locator("#registration-token")).to_have_text(re.compile(r"^pwr_"))
    assert RegistrationToken.objects.count() == 2


def test_reloading_the_api_token_creates_no_second_one(page_without_js: Any) -> None:
    page = page_without_js
    UserFactory(username="dora")
    log_in(page, "dora")
    page.goto("/account/")
    page.get_by_label("Token name").fill("laptop CLI")
    page.get_by_role("button", name="Create token").click()
    expect()(page.locator("#new-token")).to_have_text(re.compile(r"^pw_"))
    assert ApiToken.objects.count() == 1

    page.reload()
    expect()(page.locator("#messages")).to_contain_text("This form was already submitted")
    expect()(page.locator("#new-token")).to_have_count(0)
    expect()(page.get_by_role("cell", name="laptop CLI", exact=True)).to_be_visible()
    assert ApiToken.objects.count() == 1
