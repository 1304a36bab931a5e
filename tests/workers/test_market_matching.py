"""The matching rule (workers/market/matching.py): the cases docs/market.md states, and
the fast matcher held to the plain reference on random books."""

from __future__ import annotations

import random

import pytest

from marketplace.pricing import Ask
from workers.market.matching import Match, Node, Order, match, match_reference

FEE_BPS = 500


def cap(bid: int) -> int:
    """Highest node price whose charge (price plus a 5 % fee, rounded down) fits ``bid``."""
    price = bid * 10_000 // (10_000 + FEE_BPS)
    while (price + 1) + (price + 1) * FEE_BPS // 10_000 <= bid:
        price += 1
    return price


def node(name: str, owner: str, per_tflop: int = 0, minimum: int = 100, **extra: object) -> Node:
    fields: dict[str, object] = {
        "reputation": 50,
        "benchmark": 0.0,
        "memory_bytes": 16 << 30,
        "kinds": frozenset({"k"}),
        "features": frozenset(),
    }
    fields.update(extra)
    asks = {kind: Ask(per_tflop, minimum) for kind in fields["kinds"]}  # type: ignore[attr-defined]
    return Node(id=name, owner=owner, asks=asks, **fields)  # type: ignore[arg-type]


def order(name: str, bid: int, opened: float = 0.0, **extra: object) -> Order:
    fields: dict[str, object] = {
        "kind": "k",
        "slots": 1,
        "tflop": 1.0,
        "memory_bytes": 1 << 30,
        "features": frozenset(),
        "min_reputation": 0,
    }
    fields.update(extra)
    return Order(id=name, bid=bid, opened=opened, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("matcher", [match, match_reference])
def test_two_providers_two_requesters_match_as_the_rule_says(matcher):
    # Provider A asks 100 a job, provider B 200. Requester X bids 300, Y bids 150 and
    # posted first: X goes first and takes the cheapest node, A; Y's bid cannot pay B.
    nodes = [node("b", "B", minimum=200), node("a", "A", minimum=100)]
    orders = [order("y", cap_inverse(150), opened=1.0), order("x", cap_inverse(300), opened=2.0)]
    assert matcher(orders, nodes, cap) == [Match("x", "a", 100)]
    # With Y's bid raised over B's ask, Y gets B at B's ask, not at its own bid.
    orders = [order("y", cap_inverse(250), opened=1.0), order("x", cap_inverse(300), opened=2.0)]
    assert matcher(orders, nodes, cap) == [Match("x", "a", 100), Match("y", "b", 200)]


def cap_inverse(price: int) -> int:
    """The bid that exactly pays a node ``price`` with the fee."""
    return price + price * FEE_BPS // 10_000


@pytest.mark.parametrize("matcher", [match, match_reference])
def test_equal_bids_go_oldest_first_and_equal_asks_to_the_better_node(matcher):
    nodes = [
        node("low", "A", reputation=40),
        node("high", "B", reputation=90),
        node("fast", "C", reputation=90, benchmark=5.0),
    ]
    orders = [order("new", 500, opened=2.0), order("old", 500, opened=1.0)]
    assert matcher(orders, nodes, cap) == [Match("old", "fast", 100), Match("new", "high", 100)]


@pytest.mark.parametrize("matcher", [match, match_reference])
def test_price_follows_the_work_measure(matcher):
    # 2 TFLOP: A (50/TFLOP, min 100) prices it 100, B (10/TFLOP, min 120) 120; 10 TFLOP: A 500, B 120.
    nodes = [node("a", "A", per_tflop=50, minimum=100), node("b", "B", per_tflop=10, minimum=120)]
    assert matcher([order("small", 10_000, tflop=2.0)], nodes, cap) == [Match("small", "a", 100)]
    assert matcher([order("big", 10_000, tflop=10.0)], nodes, cap) == [Match("big", "b", 120)]


@pytest.mark.parametrize("matcher", [match, match_reference])
def test_replicas_go_to_different_providers_and_exclusions_hold(matcher):
    nodes = [node("a1", "A", minimum=100), node("a2", "A", minimum=101), node("b", "B", minimum=150)]
    assert matcher([order("t", 1000, slots=3)], nodes, cap) == [Match("t", "a1", 100), Match("t", "b", 150)]
    barred = order("t", 1000, owners=frozenset({"A"}))
    assert matcher([barred], nodes, cap) == [Match("t", "b", 150)]
    excluded = order("t", 1000, exclude=frozenset({"a1"}))
    assert matcher([excluded], nodes, cap) == [Match("t", "a2", 101)]
    # A node that lost the task is offered it only when no fresher node fits.
    retake = order("t", 1000, retakers={"a1": 2, "a2": 1})
    assert matcher([retake], nodes, cap) == [Match("t", "b", 150)]


@pytest.mark.parametrize("matcher", [match, match_reference])
def test_needs_are_met(matcher):
    nodes = [
        node("small", "A", memory_bytes=1 << 30),
        node("nofeat", "B", memory_bytes=64 << 30),
        node("lowrep", "C", memory_bytes=64 << 30, features=frozenset({"f"}), reputation=10),
        node("ok", "D", memory_bytes=64 << 30, features=frozenset({"f"}), reputation=60, minimum=300),
    ]
    wanted = order("t", 1000, memory_bytes=8 << 30, features=frozenset({"f"}), min_reputation=50)
    assert matcher([wanted], nodes, cap) == [Match("t", "ok", 300)]
    assert matcher([order("t", 1000, kind="other")], nodes, cap) == []


def random_book(rng: random.Random, tasks: int, nodes: int) -> tuple[list[Order], list[Node]]:
    kinds = ["a", "b", "c"]
    features = ["f1", "f2", "f3"]
    owners = [f"p{i}" for i in range(max(1, nodes // 3))]
    book_nodes = []
    for i in range(nodes):
        offered = frozenset(rng.sample(kinds, rng.randint(1, 3)))
        book_nodes.append(
            Node(
                id=f"n{i}",
                owner=rng.choice(owners),
                reputation=rng.choice([0, 20, 50, 80, 100]),
                benchmark=rng.choice([0.0, 1.0, 2.5]),
                memory_bytes=rng.choice([4, 8, 16, 80]) << 30,
                kinds=offered,
                features=frozenset(rng.sample(features, rng.randint(0, 3))),
                asks={k: Ask(rng.choice([0, 10, 50, 200]), rng.choice([100, 150, 300, 1000])) for k in offered},
            )
        )
    book_orders = []
    for i in range(tasks):
        restricted = rng.random() < 0.2
        book_orders.append(
            Order(
                id=f"t{i}",
                kind=rng.choice(kinds),
                bid=rng.choice([100, 160, 320, 700, 2000, 5000]),
                opened=float(rng.randint(0, 50)),
                slots=rng.choice([1, 1, 1, 2, 3]),
                tflop=rng.choice([0.5, 1.0, 3.0, 10.0, 40.0]),
                memory_bytes=rng.choice([1, 8, 32]) << 30,
                features=frozenset(rng.sample(features, rng.randint(0, 2))),
                min_reputation=rng.choice([0, 0, 50, 90]),
                exclude=frozenset(rng.sample([n.id for n in book_nodes], min(2, len(book_nodes))))
                if restricted
                else frozenset(),
                owners=frozenset(rng.sample(owners, 1)) if restricted and rng.random() < 0.5 else frozenset(),
                retakers={rng.choice(book_nodes).id: 1} if restricted and rng.random() < 0.5 else {},
            )
        )
    return book_orders, book_nodes


@pytest.mark.parametrize("seed", range(60))
def test_the_fast_matcher_decides_as_the_reference(seed):
    rng = random.Random(seed)
    orders, nodes = random_book(rng, tasks=rng.randint(1, 120), nodes=rng.randint(1, 40))
    assert match(orders, nodes, cap) == match_reference(orders, nodes, cap)
