"""The market attacked with what the platform gives each side (docs/market.md): a node's
capabilities or a task's stored needs that no honest agent sends, asks and bids at the
edges of what the fields hold, and the money a completed task moved."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from rest_framework.exceptions import ValidationError
from rest_framework.test import APIClient

from ledger import services as ledger
from ledger.costs import task_costs
from ledger.replay import verify_chain
from ledger.sealer import seal_all
from ledger.units import credits_to_units
from marketplace import pricing
from marketplace.models import Task
from tests.conftest import funded
from tests.factories import CAPS, UserFactory, make_worker, post_task
from tests.workers.test_jobs import Provider
from workers.assignments import market_pass, scheduler
from workers.market import matching
from workers.market.asks import set_ask
from workers.market.matching import Node, Order, match, match_reference
from workers.models import Assignment, Worker
from workers.tasks import verify_assignment

pytestmark = pytest.mark.django_db

SYNTHETIC = frozenset({"synthetic"})


def credits(text: str) -> int:
    return credits_to_units(Decimal(text))


@pytest.fixture
def dave(db: Any) -> Any:
    return funded(UserFactory(username="dave"))


# --- one malformed row must not stop the pass for everyone ------------------------------

MALFORMED_CAPS = {
    "kinds not a list": {**CAPS, "kinds": "synthetic"},
    "kinds of other types": {**CAPS, "kinds": [5, None, {"a": 1}, "synthetic"]},
    "an unknown kind": {**CAPS, "kinds": ["synthetic", "no_such_kind"]},
    "a hundred features": {**CAPS, "features": [f"f{i}" for i in range(100)]},
    "features not a list": {**CAPS, "features": "poc:shake128"},
    "features of other types": {**CAPS, "features": [["x"], {"a": 1}, 5, *CAPS["features"]]},
    "memory past int64": {**CAPS, "gpu_memory_bytes": 10**30},
    "memory a huge float": {**CAPS, "ram_bytes": 1e30},
    "memory negative": {**CAPS, "ram_bytes": -(10**30)},
    "not an object": ["synthetic"],
}


@pytest.mark.parametrize("caps", MALFORMED_CAPS.values(), ids=MALFORMED_CAPS.keys())
def test_a_node_with_capabilities_no_agent_sends_does_not_stop_the_pass(
    alice: Any, carol: Any, bob: Any, caps: Any
) -> None:
    # Rows written before the capabilities were checked, or by hand: the pass reads them all.
    odd, *_ = make_worker(carol, name="odd", reputation=100)
    Worker.objects.filter(pk=odd.pk).update(capabilities=caps)
    honest = Provider(alice, "honest")
    task = post_task(bob, "synthetic", {"n": 64}, budget=credits("1"))
    Assignment.objects.filter(task=task).delete()  # as if it were still waiting
    assert market_pass.offer_waiting() == 1
    assert Assignment.objects.get(task=task).worker in (honest.worker, odd)
    # The task's own scheduling, and the reason a task waits, read the row too.
    other = post_task(bob, "synthetic", {"n": 64}, budget=credits("1"))
    scheduler.schedule(other.pk)
    other.refresh_from_db()
    assert Assignment.objects.filter(task=other).exists() or other.status_reason


def test_a_task_whose_stored_needs_are_malformed_waits_and_the_others_are_matched(
    alice: Any, carol: Any, bob: Any, dave: Any
) -> None:
    Provider(alice, "a")
    Provider(carol, "c")
    odd = post_task(dave, "synthetic", {"n": 64}, budget=credits("2"))
    fine = post_task(bob, "synthetic", {"n": 64}, budget=credits("1"))
    Assignment.objects.all().delete()
    Task.objects.filter(pk=odd.pk).update(features=5)  # not a list: no node is known to fit
    assert market_pass.offer_waiting() == 1
    assert Assignment.objects.filter(task=fine).exists()
    assert not Assignment.objects.filter(task=odd).exists()


# --- the fast matcher and the rule agree at the edges of the numbers ----------------------


def _node(name: str, minimum: int, reputation: int = 50, memory: int = 2**30, per_tflop: int = 0) -> Node:
    ask = pricing.Ask(per_tflop, minimum)
    return Node(name, name, reputation, 0.0, memory, SYNTHETIC, frozenset(), {"synthetic": ask})


def _order(bid: int, tflop: float = 1.0, memory: int = 0) -> Order:
    return Order("t", "synthetic", bid, 0.0, 1, tflop, memory, frozenset(), 0)


def _exact(bid: int) -> int:
    return bid


def test_the_fast_matcher_never_offers_a_node_over_the_bid_when_floats_round() -> None:
    # 2**53 + 1 units (9 million credits) rounds to 2**53 as a float: it must not pass for it.
    big = 2**53
    nodes = [_node("dear", big + 1), _node("unfit", 5, memory=10)]
    orders = [_order(big, memory=1000)]
    assert match_reference(orders, nodes, _exact) == []
    assert match(orders, nodes, _exact) == []


def test_the_fast_matcher_takes_the_cheaper_node_when_floats_would_tie() -> None:
    big = 2**53
    nodes = [_node("dear", big + 1, reputation=90), _node("cheap", big, reputation=10)]
    orders = [_order(big + 1)]
    expected = [matching.Match("t", "cheap", big)]
    assert match_reference(orders, nodes, _exact) == expected
    assert match(orders, nodes, _exact) == expected


def test_the_largest_asks_the_fields_hold_are_matched_alike() -> None:
    top = 2**63 - 1  # a BigIntegerField's largest value
    nodes = [_node("huge", 1, per_tflop=top), _node("min", top), _node("fair", 10, per_tflop=10)]
    for tflop in (0.0, 1e-9, 0.5, 3.0, 1e6):
        for bid in (1, 10, 10**6, 2**62, top):
            orders = [_order(bid, tflop=tflop)]
            assert match(orders, nodes, _exact) == match_reference(orders, nodes, _exact), (tflop, bid)


def test_nodes_reporting_many_features_keep_the_pass_vectorised(monkeypatch: pytest.MonkeyPatch) -> None:
    # Providers cannot push every pass onto the plain rule (one Python loop per task and
    # node) by reporting features no task asks for.
    nodes = [
        Node(
            f"n{i}",
            i,
            50,
            0.0,
            2**30,
            SYNTHETIC,
            frozenset(f"junk{i}:{j}" for j in range(32)),
            {"synthetic": pricing.Ask(0, 1)},
        )
        for i in range(4)
    ]
    orders = [_order(10)]
    expected = match_reference(orders, nodes, _exact)

    def refuse(*args: Any) -> Any:
        raise AssertionError("the plain rule ran")

    monkeypatch.setattr(matching, "match_reference", refuse)
    assert match(orders, nodes, _exact) == expected != []


# --- asks and bids at the edges, through the API and the pages --------------------------


@pytest.mark.parametrize("bid", ["-1", "0", "abc", "1e30", "NaN", "Infinity", True, [], {"a": 1}, None])
def test_a_bid_that_is_no_amount_is_a_400_naming_it(bob: Any, bid: Any) -> None:
    client = APIClient()
    client.force_authenticate(bob)
    body = {"kind": "synthetic", "spec": {"n": 64}, "budget": "1", "bid": bid}
    response = client.post("/api/v1/tasks/", body, format="json")
    if bid is None:  # null: no bid, the budget's share
        assert response.status_code == 201, response.content
        return
    assert response.status_code == 400, response.content
    assert "bid" in response.json()
    assert not Task.objects.exists()


@pytest.mark.parametrize("bid", ["-1", "0", "abc", "1e30", "NaN", "Infinity", "1" * 40, "0.01"])
def test_a_bid_that_is_no_amount_is_refused_on_the_post_page(bob: Any, client: Any, bid: str) -> None:
    client.force_login(bob)
    form = {"title": "t", "spec_n": "64", "spec_count": "1", "spec_entry_bound": "4", "budget": "1"}
    form |= {"min_reputation": "0", "replication": "1", "max_attempts": "3"}
    assert client.post("/tasks/new/synthetic/", {**form, "bid": bid}).status_code == 400
    assert not Task.objects.exists()
    assert client.post("/tasks/new/synthetic/", {**form, "bid": "0.5"}).status_code == 302
    assert Task.objects.get().bid == credits("0.5")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("per_tflop", "-1"),
        ("per_tflop", "1e30"),
        ("per_tflop", "NaN"),
        ("per_tflop", True),
        ("minimum", "0"),
        ("minimum", "-5"),
        ("minimum", "Infinity"),
        ("minimum", "99999999999"),
    ],
)
def test_an_ask_out_of_bounds_is_a_400_naming_its_field(alice: Any, field: str, value: Any) -> None:
    node = Provider(alice, "n")
    body = {"kind": "synthetic", "per_tflop": "1", "minimum": "1", field: value}
    response = node.client.put("/api/v1/workers/me/asks/", body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()
    assert not node.worker.asks.exists()


def test_a_provider_cannot_set_another_providers_node_ask(alice: Any, carol: Any, client: Any) -> None:
    theirs = Provider(carol, "theirs")
    api = APIClient()
    api.force_authenticate(alice)
    url = f"/api/v1/workers/{theirs.worker.pk}/asks/synthetic/"
    assert api.put(url, {"per_tflop": "0", "minimum": "100"}, format="json").status_code == 404
    assert api.delete(url).status_code == 404
    client.force_login(alice)
    page = client.post(
        f"/workers/{theirs.worker.pk}/",
        {"ask_kind": "synthetic", "ask-synthetic-per_tflop": "0", "ask-synthetic-minimum": "100"},
    )
    assert page.status_code == 404
    assert not theirs.worker.asks.exists()


def test_a_bool_is_no_ask(alice: Any) -> None:
    node = Provider(alice, "n")
    with pytest.raises(ValidationError) as refused:
        set_ask(node.worker, "synthetic", True, pricing.floor_price())
    assert "per_tflop" in refused.value.detail


# --- the money a completed task moved -----------------------------------------------------


def test_a_completed_task_escrowed_what_it_paid_its_nodes_the_fee_and_the_refund(
    alice: Any, carol: Any, bob: Any, tmp_path: Path
) -> None:
    first = Provider(alice, "first")
    second = Provider(carol, "second")
    set_ask(first.worker, "synthetic", 0, credits("0.2"))
    set_ask(second.worker, "synthetic", 0, credits("0.35"))
    before = ledger.balance(bob)
    task = post_task(bob, "synthetic", {"n": 64}, budget=credits("2"), replication=2, bid=credits("0.5"))
    assert market_pass.offer_waiting() == 2
    jobs = list(Assignment.objects.filter(task=task))
    assert sorted(j.price or 0 for j in jobs) == [credits("0.2"), credits("0.35")]
    for job in jobs:
        node = first if job.worker_id == first.worker.pk else second
        body = node.run_job(job, tmp_path / node.worker.name)
        assert node.submit(job, body).status_code == 202
        assert verify_assignment(str(job.pk)) == "accepted"
    task.refresh_from_db()
    assert task.status == "completed"
    costs = task_costs(ledger.task_transactions(task.pk, [first.worker.address, second.worker.address]))
    prices = [credits("0.2"), credits("0.35")]
    assert costs.escrowed == credits("2")
    assert costs.paid_to_workers == sum(prices)
    assert costs.platform_fee == sum(pricing.fee_on(p) for p in prices)
    assert costs.escrowed == costs.paid_to_workers + costs.platform_fee + costs.refunded
    assert costs.held == 0
    assert before - ledger.balance(bob) == sum(pricing.charge(p) for p in prices)
    for job in jobs:  # each replica cost no more than the bid
        assert job.price is not None
        assert pricing.charge(job.price) <= task.bid
    seal_all()
    verify_chain()


def test_a_draft_posted_before_a_debt_cannot_be_published_while_it_is_owed(bob: Any, client: Any) -> None:
    api = APIClient()
    api.force_authenticate(bob)
    body = {"kind": "synthetic", "spec": {"n": 64}, "budget": "1", "draft": True}
    draft = api.post("/api/v1/tasks/", body, format="json").json()
    # A disputed purchase burns all Bob holds and leaves one credit owed.
    ledger.reverse_deposit(bob, ledger.balance(bob) + credits("1"), "dispute:test", "disputed")
    assert ledger.owed(bob) == credits("1")
    response = api.post(f"/api/v1/tasks/{draft['id']}/publish/", format="json")
    assert response.status_code == 400
    assert "owes 1 credits" in " ".join(response.json()["budget"])
    client.force_login(bob)
    client.post(f"/tasks/{draft['id']}/publish/")
    assert Task.objects.get().status == "draft"
    assert ledger.escrowed(bob) == 0


def test_a_node_cannot_send_thousands_of_asks_in_one_request(alice: Any) -> None:
    node = Provider(alice, "n")
    ask = {"kind": "synthetic", "per_tflop": "0", "minimum": "1"}
    response = node.client.put("/api/v1/workers/me/asks/", [ask] * 1000, format="json")
    assert response.status_code == 400
    assert "At most" in response.json()["non_field_errors"][0]
    assert node.client.put("/api/v1/workers/me/asks/", [ask], format="json").status_code == 200


def test_the_largest_ask_the_api_takes_renders_everywhere_and_matches_nothing(alice: Any, bob: Any) -> None:
    node = Provider(alice, "dear")
    most = "9000000000"
    response = node.client.put(
        "/api/v1/workers/me/asks/", {"kind": "synthetic", "per_tflop": most, "minimum": most}, format="json"
    )
    assert response.status_code == 200, response.content
    post_task(bob, "synthetic", {"n": 4096, "count": 4}, budget=credits("5"))
    Assignment.objects.all().delete()
    assert market_pass.offer_waiting() == 0
    client = APIClient()
    client.force_login(alice)
    assert client.get("/market/synthetic/").status_code == 200
    assert client.get("/market/").status_code == 200
    assert client.get(f"/workers/{node.worker.pk}/").status_code == 200
    assert client.get(f"/api/v1/workers/{node.worker.pk}/asks/").status_code == 200
    quote = {"kind": "synthetic", "spec": {"n": 64}, "budget": "1"}
    assert client.post("/api/v1/tasks/quote/", quote, format="json").status_code == 200


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(
    __import__("django.db").db.connection.vendor != "postgresql",
    reason="row locks need PostgreSQL (set DATABASE_URL); SQLite serialises every writer",
)
def test_two_passes_at_once_never_offer_one_node_two_jobs(
    alice: Any, bob: Any, dave: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two passes that read the book at different moments (each saw another task waiting)
    decide the one free node for different tasks, and both offer it at the same moment."""
    import threading

    from django.db import connections

    node = Provider(alice, "only")
    tasks = [post_task(who, "synthetic", {"n": 64}, budget=credits("1")) for who in (bob, dave)]
    Assignment.objects.all().delete()
    Task.objects.filter(pk__in=[t.pk for t in tasks]).update(status="open")
    both_priced = threading.Barrier(2)
    read = market_pass.read_book
    price = scheduler.priced_workers
    seen = threading.local()

    def read_one_task() -> market_pass.Book:
        book = read()
        return market_pass.Book([o for o in book.orders if o.id == seen.task], book.nodes)

    def price_then_wait(*args: Any, **kwargs: Any) -> Any:
        priced = price(*args, **kwargs)  # each offer re-checks the node free under the task's lock
        both_priced.wait(timeout=30)
        return priced

    monkeypatch.setattr(market_pass, "read_book", read_one_task)
    monkeypatch.setattr(scheduler, "priced_workers", price_then_wait)
    offered: list[int] = []
    errors: list[BaseException] = []

    def run(task_id: Any) -> None:
        seen.task = task_id
        try:
            offered.append(market_pass.offer_waiting())
        except BaseException as exc:  # collected and asserted on below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(t.pk,)) for t in tasks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(offered) == [0, 1]
    assert Assignment.objects.filter(worker=node.worker).count() == 1


@pytest.mark.parametrize(
    ("per_tflop", "minimum"),
    [("-1", "1"), ("NaN", "1"), ("1e30", "1"), ("abc", "1"), ("0", "0"), ("0", "-1"), ("0", "Infinity"), ("0", "")],
)
def test_an_ask_out_of_bounds_is_refused_on_the_node_page(
    alice: Any, client: Any, per_tflop: str, minimum: str
) -> None:
    node = Provider(alice, "n")
    client.force_login(alice)
    form = {"ask_kind": "synthetic", "ask-synthetic-per_tflop": per_tflop, "ask-synthetic-minimum": minimum}
    assert client.post(f"/workers/{node.worker.pk}/", form).status_code == 400
    assert not node.worker.asks.exists()


def test_a_debtor_provider_cannot_move_its_nodes_earnings_to_another_account(alice: Any, bob: Any, carol: Any) -> None:
    from protocol.wire import sign_template
    from tests.workers.test_sweep import SWEEP, pay

    node = Provider(alice, "earner")
    pay(node.worker, bob, credits("2"))
    ledger.reverse_deposit(alice, ledger.balance(alice) + credits("1"), "dispute:test", "disputed")
    assert ledger.owed(alice) == credits("1")
    template = node.client.get(SWEEP).json()
    moved = {**template, "to": ledger.ensure_user_account(carol).address, "amount": credits("1.5")}
    body = {**moved, "public_key": node.key.public_key.hex(), "signature": sign_template(moved, node.key).hex()}
    before = ledger.balance(carol)
    api = APIClient()
    api.force_authenticate(carol)
    response = api.post("/api/v1/ledger/transactions/", body, format="json")
    assert response.status_code == 400
    assert response.json()["code"] == "owes_debt"
    assert "owes 1 credits" in response.json()["from"][0]
    assert ledger.balance(carol) == before
    # The sweep to Alice's own account goes through, and pays the debt first.
    assert (
        node.client.post(
            SWEEP,
            {**template, "public_key": body["public_key"], "signature": sign_template(template, node.key).hex()},
            format="json",
        ).status_code
        == 202
    )
    assert ledger.owed(alice) == 0


def test_a_task_whose_requester_came_to_owe_is_offered_no_job_until_the_debt_is_paid(
    alice: Any, carol: Any, bob: Any
) -> None:
    # Bob buys credits, posts, then disputes the purchase: the escrow is all that is left
    # of them. A node of a second account of his (Carol's, here) asking the whole bid
    # would turn the disputed credits into earnings it sweeps and is paid out.
    node = Provider(carol, "accomplice")
    set_ask(node.worker, "synthetic", 0, credits("0.95"))
    task = post_task(bob, "synthetic", {"n": 64}, budget=credits("1"))
    Assignment.objects.all().delete()
    ledger.reverse_deposit(bob, ledger.balance(bob) + credits("1"), "dispute:test", "disputed")
    assert market_pass.offer_waiting() == 0
    assert scheduler.schedule(task.pk) == []
    task.refresh_from_db()
    assert "owes 1 credits" in task.status_reason
    assert not Assignment.objects.exists()
    # Paid (a purchase pays the debt first), the task is offered again.
    ledger.deposit(bob, credits("1"), reference="purchase:test")
    assert ledger.owed(bob) == 0
    assert market_pass.offer_waiting() == 1
    assert Assignment.objects.get(task=task).worker == node.worker
