"""The post page's estimate speaks the market: the lowest asks of the fitting nodes, how
many would take the task at its bid, and the wait to expect; the form has a bid field."""

from __future__ import annotations

import html as htmllib
import re
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from ledger.units import format_credits
from marketplace import pricing
from marketplace.views.tasks import wait_text
from tests.factories import make_worker
from workers.market.asks import set_ask

pytestmark = pytest.mark.django_db

FORM = {
    "title": "Matmul",
    "spec_n": "64",
    "spec_count": "1",
    "spec_entry_bound": "4",
    "budget": "1",
    "min_reputation": "0",
    "replication": "1",
    "max_attempts": "3",
}


def check(client: Client, **changes: str) -> str:
    url = reverse("task-check", args=["synthetic"])
    return client.post(url, {**FORM, **changes}, HTTP_HX_REQUEST="true").content.decode()


def words(html: str, element_id: str) -> str:
    match = re.search(rf'id="{element_id}"[^>]*>(.*?)</p>', html, re.S)
    assert match, f"no #{element_id}"
    return htmllib.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", match.group(1))).strip())


def test_the_bid_field_is_in_the_payment_group(alice_web: Client) -> None:
    html = alice_web.get(reverse("task-post", args=["synthetic"])).content.decode()
    group = html.split("<legend>Payment and workers</legend>", 1)[1].split("</fieldset>", 1)[0]
    assert 'name="bid"' in group
    assert "Bid per replica (credits)" in group


def test_the_estimate_shows_the_asks_the_takers_at_the_bid_and_the_wait(alice_web: Client, bob: Any) -> None:
    cheap = make_worker(bob, name="cheap").worker
    set_ask(cheap, "synthetic", 0, 200_000_000)
    dear = make_worker(bob, name="dear").worker
    set_ask(dear, "synthetic", 0, 900_000_000)
    html = check(alice_web, bid="0.5")
    asks = [format_credits(pricing.charge(200_000_000)), format_credits(pricing.charge(900_000_000))]
    assert (
        words(html, "estimate-asks")
        == f"Lowest asks of the workers that fit: {asks[0]}, {asks[1]} credits per replica, the platform's fee included (market)."
    )
    assert words(html, "estimate-at-bid") == "At a bid of 0.5 credits per replica: 1 worker would take it."
    assert words(html, "estimate-wait") == "Expected wait for a worker: now."
    assert 'id="estimate-replicas"' not in html

    under = check(alice_web, bid="0.15")
    assert words(under, "estimate-at-bid") == "At a bid of 0.15 credits per replica: 0 workers would take it."
    assert words(under, "estimate-wait") == "Expected wait for a worker: unknown."
    advice = words(under, "estimate-supply")
    assert f"Its bid of 0.15 credits is under every fitting node's ask: the lowest asks {asks[0]} credits" in advice


def test_without_a_bid_the_budgets_share_is_the_bid(alice_web: Client, bob: Any) -> None:
    make_worker(bob, name="reference")
    html = check(alice_web, budget="2", replication="1")
    assert words(html, "estimate-at-bid") == "At a bid of 2 credits per replica: 1 worker would take it."


@pytest.mark.parametrize(
    ("seconds", "said"),
    [
        (None, "unknown"),
        (0.0, "now"),
        (12.0, "under a minute"),
        (60.0, "about 1 minute"),
        (600.0, "about 10 minutes"),
        (5400.0, "about 2 hours"),
        (3 * 86400.0, "about 3 days"),
    ],
)
def test_a_wait_in_words(seconds: float | None, said: str) -> None:
    assert wait_text(seconds) == said
