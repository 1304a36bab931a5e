"""The market as its users meet it (docs/market.md): providers' asks and requesters' bids
matched by the rule through the real scheduler, the quote's view of the market, and
what a job pays its node."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from ledger import services as ledger
from ledger.models import Transaction
from ledger.units import UNITS_PER_CREDIT, credits_to_units
from marketplace import pricing
from marketplace.models import Task
from tests.conftest import funded
from tests.factories import UserFactory, post_task
from tests.workers.test_jobs import Provider
from workers.assignments import market_pass, scheduler
from workers.market.asks import set_ask
from workers.models import Assignment
from workers.tasks import verify_assignment

pytestmark = pytest.mark.django_db


def credits(text: str) -> int:
    return credits_to_units(Decimal(text))


def asking(owner: Any, name: str, minimum: str, per_tflop: str = "0") -> Provider:
    provider = Provider(owner, name)
    set_ask(provider.worker, "synthetic", credits(per_tflop), credits(minimum))
    return provider


@pytest.fixture
def dave(db: Any) -> Any:
    return funded(UserFactory(username="dave"))


def test_two_providers_and_two_requesters_get_the_matches_the_rule_says(
    alice: Any, carol: Any, bob: Any, dave: Any
) -> None:
    cheap = asking(alice, "cheap", "0.2")
    dear = asking(carol, "dear", "0.5")
    # Bob bids 0.3 and posted first; Dave bids 1 a little later: the higher bid goes first,
    # to the cheapest node, and pays that node's ask.
    low = post_task(bob, "synthetic", {"n": 64}, budget=credits("0.3"))
    high = post_task(dave, "synthetic", {"n": 64}, budget=credits("1"))
    assert market_pass.offer_waiting() == 1
    (job,) = Assignment.objects.filter(task=high)
    assert (job.worker, job.price) == (cheap.worker, credits("0.2"))
    # The dear node asks 0.5, 0.525 with the fee: more than Bob's 0.3. Bob's task waits
    # and says why; the dear node stays free.
    assert not Assignment.objects.filter(task=low).exists()
    assert scheduler.schedule(low.pk) == []
    low.refresh_from_db()
    assert "1 asks more than its bid" in low.status_reason
    assert "1 fits but is busy" in low.status_reason
    assert not Assignment.objects.filter(worker=dear.worker).exists()


def test_a_bid_under_every_ask_waits_and_names_the_bid_that_would_be_taken(alice: Any, bob: Any) -> None:
    asking(alice, "dear", "0.5")
    task = post_task(bob, "synthetic", {"n": 64}, budget=credits("0.3"))
    assert market_pass.offer_waiting() == 0
    assert scheduler.schedule(task.pk) == []
    task.refresh_from_db()
    assert "Its bid of 0.3 credits is under every fitting node's ask" in task.status_reason
    assert "the lowest asks 0.525 credits" in task.status_reason
    # Raising it (a new task at that bid) is taken at once.
    again = post_task(bob, "synthetic", {"n": 64}, budget=credits("0.525"))
    assert market_pass.offer_waiting() == 1
    assert Assignment.objects.get(task=again).price == credits("0.5")


def test_the_quote_shows_the_asks_the_nodes_at_the_bid_and_the_wait(alice: Any, carol: Any, bob: Any) -> None:
    asking(alice, "cheap", "0.2")
    asking(carol, "dear", "0.5")
    client = APIClient()
    client.force_authenticate(bob)
    body = {"kind": "synthetic", "spec": {"n": 64}, "budget": "2", "bid": "0.3"}
    response = client.post("/api/v1/tasks/quote/", body, format="json")
    assert response.status_code == 200, response.json()
    quote = response.json()
    assert quote["bid"] == "0.3"
    assert quote["market"] == {
        "lowest_asks": ["0.21", "0.525"],
        "nodes_at_bid": 1,
        "expected_wait_seconds": 0.0,
        "expected_run_seconds": None,  # no verified job of the kind to time yet
    }
    # At a bid no node takes, the quote says so and what bid would be.
    low = client.post("/api/v1/tasks/quote/", {**body, "bid": "0.15"}, format="json").json()
    assert low["market"]["nodes_at_bid"] == 0
    assert low["market"]["expected_wait_seconds"] is None
    assert "the lowest asks 0.21 credits" in low["waiting_reason"]


def test_a_bid_over_the_budget_or_under_the_floor_is_refused_naming_it(bob: Any) -> None:
    client = APIClient()
    client.force_authenticate(bob)
    base = {"kind": "synthetic", "spec": {"n": 64}, "budget": "1", "replication": 2}
    over = client.post("/api/v1/tasks/", {**base, "bid": "0.6"}, format="json")
    assert over.status_code == 400
    assert "more than the budget" in over.json()["bid"][0]
    under = client.post("/api/v1/tasks/", {**base, "bid": "0.01"}, format="json")
    assert under.status_code == 400
    assert "The least a job may cost" in under.json()["bid"][0]
    assert not Task.objects.exists()


def test_a_job_pays_the_ask_in_full_the_fee_on_top_the_rest_back(
    alice: Any, bob: Any, tmp_path: Path, settings: Any
) -> None:
    node = asking(alice, "cheap", "0.2")
    bob_before = ledger.balance(bob)
    task = post_task(bob, "synthetic", {"n": 64}, budget=credits("3"))
    market_pass.offer_waiting()
    job = Assignment.objects.get(task=task)
    # The provider raises its ask while the job runs: the job pays what it was offered at.
    set_ask(node.worker, "synthetic", 0, credits("2"))
    body = node.run_job(job, tmp_path)
    assert node.submit(job, body).status_code == 202
    assert verify_assignment(str(job.pk)) == "accepted"
    ask = credits("0.2")
    gas = Transaction.objects.get(type="SUBMIT_RESULT", sender=node.worker.address).fee
    earned = ledger.address_balance(node.worker.address)
    assert earned == ask - gas
    assert earned >= ask * 99 // 100  # a provider keeps at least 99 % of its ask after gas
    # Bob paid the ask plus the platform's fee; the rest of his 3-credit budget came back.
    assert ledger.escrowed(bob) == 0
    assert (
        bob_before - ledger.balance(bob)
        == pricing.charge(ask)
        == ask + ask * settings.LEDGER_PLATFORM_FEE_BPS // 10_000
    )


def test_a_node_is_never_offered_a_job_under_its_ask(alice: Any, bob: Any) -> None:
    node = asking(alice, "dear", "1", per_tflop="0")
    for _ in range(3):
        post_task(bob, "synthetic", {"n": 64}, budget=credits("1.04"))  # 1.05 would pay it
    assert market_pass.offer_waiting() == 0
    assert not Assignment.objects.filter(worker=node.worker).exists()


def test_asks_price_the_work_so_a_big_task_goes_to_the_node_cheap_per_tflop(alice: Any, carol: Any, bob: Any) -> None:
    flat = asking(alice, "flat", "0.3")  # 0.3 whatever the size
    per_work = asking(carol, "metered", "0.1", per_tflop="1")  # 1 credit a TFLOP, 0.1 at least
    small = post_task(bob, "synthetic", {"n": 64}, budget=credits("5"))
    assert market_pass.offer_waiting() == 1
    assert Assignment.objects.get(task=small).worker == per_work.worker  # tiny: 0.1 beats 0.3
    Assignment.objects.filter(task=small).update(state=Assignment.State.EXPIRED)
    big = post_task(bob, "synthetic", {"n": 4096, "count": 4}, budget=credits("5"))  # ~0.55 TFLOP
    Task.objects.filter(pk=small.pk).update(status="cancelled")
    assert market_pass.offer_waiting() == 1
    job = Assignment.objects.get(task=big)
    assert (job.worker, job.price) == (flat.worker, credits("0.3"))


def test_a_provider_cannot_ask_under_the_floor_or_for_a_kind_its_node_lacks(alice: Any) -> None:
    from rest_framework.exceptions import ValidationError

    node = Provider(alice, "n")
    with pytest.raises(ValidationError) as low:
        set_ask(node.worker, "synthetic", 0, 1)
    assert "minimum" in low.value.detail
    with pytest.raises(ValidationError) as other:
        set_ask(node.worker, "cube_training", 0, UNITS_PER_CREDIT)
    assert "kind" in other.value.detail


def test_passes_asked_for_while_one_runs_coalesce_into_one_more(alice: Any, bob: Any, monkeypatch: Any) -> None:
    """A burst of events costs a few passes, not one each: an event during a pass asks for
    one more after it; nothing asked for is dropped."""
    from workers import tasks

    runs: list[int] = []

    def one_pass() -> int:
        runs.append(1)
        if len(runs) == 1:  # two more events arrive while the first pass runs
            assert tasks._market_pass() == 0
            assert tasks._market_pass() == 0
        return 0

    monkeypatch.setattr(tasks.market, "offer_waiting", one_pass)
    tasks._market_pass()
    assert len(runs) == 2  # the first, and one more for both events
    tasks._market_pass()
    assert len(runs) == 3  # the lock was released
