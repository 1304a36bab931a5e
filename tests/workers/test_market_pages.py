"""The market's pages: a node's prices on its page (set, refused on the field, cleared,
the owner's only) and the public market of each kind (asks, bids, recent prices paid)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from ledger.units import UNITS_PER_CREDIT, format_credits
from marketplace import pricing
from tests.factories import CAPS, assign, make_worker, post_task
from workers.market.asks import set_ask
from workers.models import Ask, Assignment

pytestmark = pytest.mark.django_db

BOTH = {**CAPS, "kinds": ["synthetic", "cube_training"]}
BID = 150_000_000  # over the floor charge, under the asks of 0.2


@pytest.fixture
def rig(alice: Any) -> Any:
    return make_worker(alice, name="rig", caps=BOTH).worker


def test_the_node_page_shows_a_form_per_offered_kind(alice_web: Client, rig: Any) -> None:
    html = alice_web.get(f"/workers/{rig.pk}/").content.decode()
    assert 'id="ask-synthetic"' in html
    assert 'id="ask-cube_training"' in html
    assert 'id="ask-asl_training"' not in html
    reference = pricing.reference_ask()
    assert f'value="{format_credits(reference.per_tflop)}"' in html  # the reference, in the field
    assert "platform reference" in html
    assert f"{format_credits(pricing.floor_price())} credits: the least a minimum may be" in html
    assert f"paid {format_credits(reference.minimum)} credits for the 0.0021 TFLOP" in html


def test_the_owner_sets_an_ask_on_the_page_and_goes_back_to_the_reference(alice_web: Client, rig: Any) -> None:
    url = f"/workers/{rig.pk}/"
    body = {
        "ask_kind": "synthetic",
        "ask_action": "set",
        "ask-synthetic-per_tflop": "2",
        "ask-synthetic-minimum": "0.5",
    }
    response = alice_web.post(url, body, follow=True)
    assert response.status_code == 200
    html = response.content.decode()
    assert "synthetic: ask set." in html
    assert "2 credits per TFLOP, at least 0.5 per job" in html
    assert "own ask" in html
    assert Ask.objects.get(worker=rig, kind="synthetic").minimum == UNITS_PER_CREDIT // 2

    response = alice_web.post(url, {"ask_kind": "synthetic", "ask_action": "clear"}, follow=True)
    assert "back to the platform&#x27;s reference price" in response.content.decode()
    assert not Ask.objects.exists()


def test_a_minimum_under_the_floor_is_shown_on_its_field(alice_web: Client, rig: Any) -> None:
    body = {
        "ask_kind": "cube_training",
        "ask_action": "set",
        "ask-cube_training-per_tflop": "1",
        "ask-cube_training-minimum": "0.000000001",
    }
    response = alice_web.post(f"/workers/{rig.pk}/", body)
    assert response.status_code == 400
    html = response.content.decode()
    floor = format_credits(pricing.floor_price())
    error_slot = 'id="id_ask-cube_training-minimum_error" aria-live="polite"><p>'
    assert f"{error_slot}The least a node may take for a job is {floor} credits.</p>" in html
    assert 'value="0.000000001"' in html  # what was typed stays
    assert not Ask.objects.exists()

    bad = alice_web.post(f"/workers/{rig.pk}/", {**body, "ask-cube_training-per_tflop": "-1"})
    assert 'id="id_ask-cube_training-per_tflop_error" aria-live="polite"><p>Must be 0 credits or more.' in (
        bad.content.decode()
    )


def test_only_the_owner_may_set_a_nodes_ask(bob_web: Client, rig: Any) -> None:
    body = {"ask_kind": "synthetic", "ask-synthetic-per_tflop": "0", "ask-synthetic-minimum": "1"}
    assert bob_web.post(f"/workers/{rig.pk}/", body).status_code == 404
    assert Client().post(f"/workers/{rig.pk}/", body).status_code == 302  # to the login page
    assert not Ask.objects.exists()


def test_a_kind_the_node_does_not_offer_changes_nothing(alice_web: Client, rig: Any) -> None:
    body = {"ask_kind": "asl_training", "ask-asl_training-per_tflop": "0", "ask-asl_training-minimum": "1"}
    response = alice_web.post(f"/workers/{rig.pk}/", body, follow=True)
    assert "does not offer that kind" in response.content.decode()
    assert not Ask.objects.exists()


def test_the_market_page_shows_the_book_to_anyone(alice: Any, bob: Any) -> None:
    cheap = make_worker(alice, name="cheap").worker
    set_ask(cheap, "synthetic", 0, 200_000_000)
    twin = make_worker(alice, name="twin").worker
    set_ask(twin, "synthetic", 0, 200_000_000)
    make_worker(bob, name="reference")  # no ask of its own: the reference
    make_worker(bob, name="asleep", online=False)
    post_task(bob, "synthetic", {"n": 64}, budget=BID, bid=BID)
    post_task(bob, "synthetic", {"n": 64}, budget=BID, bid=BID)

    response = Client().get("/market/synthetic/")  # no sign-in needed
    assert response.status_code == 200
    book = response.context["book"]
    assert [(level.charge, level.count) for level in book.asks] == [
        (pricing.charge(pricing.floor_price()), 1),
        (pricing.charge(200_000_000), 2),
    ]
    assert [(level.charge, level.count) for level in book.bids] == [(BID, 2)]
    html = response.content.decode()
    assert f'<td class="num">{format_credits(pricing.charge(200_000_000))}</td><td class="num">2</td>' in html
    assert f'<td class="num">{format_credits(BID)}</td><td class="num">2</td>' in html
    assert '<dd id="market-online">3</dd>' in html
    assert '<dd id="market-free">3</dd>' in html
    assert '<dd id="market-waiting">2</dd>' in html
    assert "No verified job this week." in html

    index = Client().get("/market/").content.decode()
    assert 'href="/market/cube_training/"' in index
    assert 'href="/market/"' in index  # the nav links it


def test_the_market_page_lists_recent_prices_paid(alice: Any, bob: Any) -> None:
    make_worker(alice, name="rig")
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    job = assign(task)
    Assignment.objects.filter(pk=job.pk).update(
        state=Assignment.State.ACCEPTED, price=300_000_000, settled_at=timezone.now()
    )
    html = Client().get("/market/synthetic/").content.decode()
    assert f'<td class="num">0.3</td><td class="num">{format_credits(pricing.charge(300_000_000))}</td>' in html
    index = Client().get("/market/").content.decode()
    assert format_credits(pricing.charge(300_000_000)) in index


def test_an_unknown_kind_has_no_market() -> None:
    assert Client().get("/market/nosuch/").status_code == 404
