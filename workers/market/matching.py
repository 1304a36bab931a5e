"""The matching rule: which free node each waiting task is offered (pure, no Django).

Tasks by bid, highest first, then by age; each is offered, for each replica it still
needs, the fitting free node asking least for it (its price for the task's work, which
the requester pays plus the platform's fee and which must fit in the bid), then the one
of higher reputation, then of higher verified benchmark. A node takes one job; replicas
of a task go to different providers. A node that lost the task before (``retakers``) is
offered it only when no fresher node fits. docs/market.md says why this rule.

``match`` is the scheduler's: vectorised over the free nodes, with the failures of
earlier, higher bids pruning later ones. ``match_reference`` is the rule written as
plainly as it reads, for tests and ``bench/market.py`` to hold the two to the same
decisions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple

import numpy as np

from marketplace.pricing import Ask

_NO_RETAKERS: Mapping[Hashable, int] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Node:
    """A free, online node as the market sees it."""

    id: Hashable
    owner: Hashable
    reputation: int
    benchmark: float  # verified GFLOP/s; 0 when unknown
    memory_bytes: int
    kinds: frozenset[str]
    features: frozenset[str]
    asks: Mapping[str, Ask]  # one per kind it offers (its own, or the reference ask)


class Order(NamedTuple):
    """A task waiting for ``slots`` more nodes (a tuple: a pass builds one per waiting task)."""

    id: Hashable
    kind: str
    bid: int  # per replica, the platform's fee included
    opened: float  # when it opened, or its place by age (any increasing figure): older first among equal bids
    slots: int
    tflop: float
    memory_bytes: int
    features: frozenset[str]
    min_reputation: int
    exclude: frozenset[Hashable] = frozenset()  # nodes never offered it again
    owners: frozenset[Hashable] = frozenset()  # providers barred from it
    retakers: Mapping[Hashable, int] = _NO_RETAKERS  # node -> tier (> 0: after fresher nodes)

    @property
    def restricted(self) -> bool:
        return bool(self.exclude or self.owners or self.retakers)


@dataclass(frozen=True, slots=True)
class Match:
    order: Hashable
    node: Hashable
    price: int  # what the job pays the node


def order_key(order: Order) -> tuple[int, float]:
    """Highest bid first, then oldest; a sort keeps the given order beyond that."""
    return (-order.bid, order.opened)


def node_rank_key(node: Node) -> tuple[int, float, str]:
    """Between nodes asking the same: higher reputation, then higher benchmark, then id."""
    return (-node.reputation, -node.benchmark, str(node.id))


def fits(node: Node, order: Order) -> bool:
    return (
        order.kind in node.kinds
        and order.features <= node.features
        and node.memory_bytes >= order.memory_bytes
        and node.reputation >= order.min_reputation
    )


def match_reference(orders: Sequence[Order], nodes: Sequence[Node], cap: Callable[[int], int]) -> list[Match]:
    """The rule, plainly. ``cap(bid)``: the highest node price whose charge fits the bid."""
    free = {node.id: node for node in nodes}
    out: list[Match] = []
    for order in sorted(orders, key=order_key):
        limit = cap(order.bid)
        owners = set(order.owners)
        for _ in range(order.slots):
            best: tuple[tuple[object, ...], Node, int] | None = None
            for node in free.values():
                if not fits(node, order) or node.id in order.exclude or node.owner in owners:
                    continue
                price = node.asks[order.kind].price(order.tflop)
                if price > limit:
                    continue
                key = (order.retakers.get(node.id, 0), price, *node_rank_key(node))
                if best is None or key < best[0]:
                    best = (key, node, price)
            if best is None:
                break
            _, node, price = best
            out.append(Match(order.id, node.id, price))
            owners.add(node.owner)
            del free[node.id]
    return out


class _KindBook:
    """The free nodes offering one kind, as arrays; ``alive`` marks those not yet taken."""

    def __init__(self, kind: str, nodes: list[tuple[int, Node]], bits: Mapping[str, int], owners: np.ndarray) -> None:
        self.index = np.array([i for i, _ in nodes], dtype=np.int64)
        self.position = {i: p for p, (i, _) in enumerate(nodes)}
        self.nodes = [n for _, n in nodes]
        self.per_tflop = np.array([n.asks[kind].per_tflop for _, n in nodes], dtype=np.float64)
        self.minimum = np.array([n.asks[kind].minimum for _, n in nodes], dtype=np.int64)
        self.minimum_float = self.minimum.astype(np.float64)
        self.memory = np.array([n.memory_bytes for _, n in nodes], dtype=np.int64)
        self.reputation = np.array([n.reputation for _, n in nodes], dtype=np.int64)
        self.features = np.array([_mask(n.features, bits) for _, n in nodes], dtype=np.int64)
        self.owner = owners[self.index] if len(nodes) else np.zeros(0, dtype=np.int64)
        self.alive = np.ones(len(nodes), dtype=bool)
        self.free = len(nodes)
        self.least_minimum = min((n.asks[kind].minimum for _, n in nodes), default=math.inf)
        self.fit_cache: dict[tuple[int, int, int], np.ndarray] = {}

    def take(self, i: int) -> None:
        position = self.position.get(i)
        if position is not None and self.alive[position]:
            self.alive[position] = False
            self.free -= 1

    def fit(self, order: Order, want: int) -> np.ndarray:
        key = (order.memory_bytes, want, order.min_reputation)
        mask = self.fit_cache.get(key)
        if mask is None:
            mask = (
                (self.memory >= order.memory_bytes)
                & (self.reputation >= order.min_reputation)
                & ((self.features & want) == want)
            )
            self.fit_cache[key] = mask
        return mask


def _mask(features: frozenset[str], bits: Mapping[str, int]) -> int:
    """The features among ``bits`` as an int (a feature no task needs is no bit)."""
    value = 0
    for name in features:
        bit = bits.get(name)
        if bit is not None:
            value |= 1 << bit
    return value


_EXACT = 2**53  # every whole number under it is a float


def _float_at_most(value: int) -> float:
    """The largest float not over ``value``: an integral float is at most ``value`` exactly
    when it is at most this (``float(value)`` may round up past 2**53)."""
    rounded = float(value)
    return rounded if int(rounded) <= value else math.nextafter(rounded, -math.inf)


def match(orders: Sequence[Order], nodes: Sequence[Node], cap: Callable[[int], int]) -> list[Match]:
    """The rule, fast: the same decisions as ``match_reference``."""
    # Only the features some task needs are bits: a node may report any it likes.
    needed = {f for o in orders for f in o.features}
    names = sorted({f for n in nodes for f in n.features if f in needed})
    if len(names) > 62:
        return match_reference(orders, nodes, cap)  # more features than an int64 mask holds
    bits = {name: i for i, name in enumerate(names)}
    ranked = sorted(range(len(nodes)), key=lambda i: node_rank_key(nodes[i]))
    rank = np.empty(len(nodes), dtype=np.int64)
    rank[ranked] = np.arange(len(nodes))
    codes: dict[Hashable, int] = {}
    owners = np.array([codes.setdefault(n.owner, len(codes)) for n in nodes], dtype=np.int64)
    books: dict[str, _KindBook] = {}
    for kind in {o.kind for o in orders}:
        books[kind] = _KindBook(kind, [(i, n) for i, n in enumerate(nodes) if kind in n.kinds], bits, owners)
    # Once a need finds no node at some price, no later order of that need finds one at a
    # higher price: bids only fall along the pass, prices only rise with the work, and
    # the free nodes only dwindle. need -> the least work that found none.
    failed: dict[tuple[str, int, frozenset[str], int], float] = {}
    out: list[Match] = []
    for order in sorted(orders, key=order_key):
        book = books[order.kind]
        need = (order.kind, order.memory_bytes, order.features, order.min_reputation)
        if not book.free or order.tflop >= failed.get(need, math.inf):
            continue
        limit = cap(order.bid)
        if limit < book.least_minimum:
            continue
        unknown = order.features - bits.keys()
        if unknown:
            continue
        want = _mask(order.features, bits)
        # Ask.price exactly: the per-TFLOP part rounds as math.ceil sees the same float
        # product. Under 2**53 a float holds every whole number, so prices compare as
        # floats; past it a minimum or the limit would round, so they stay whole numbers.
        metered = np.ceil(book.per_tflop * order.tflop)
        if limit < _EXACT:
            price = np.maximum(book.minimum_float, metered)
            ok = book.fit(order, want) & book.alive & (price <= limit)
        else:
            ok = book.fit(order, want) & book.alive & (book.minimum <= limit) & (metered <= _float_at_most(limit))
            price = np.maximum(book.minimum, np.where(ok, metered, 0.0).astype(np.int64))
        if order.restricted:
            ok = ok & np.array(
                [n.id not in order.exclude and n.owner not in order.owners for n in book.nodes], dtype=bool
            )
        chosen: list[int] = []
        while len(chosen) < order.slots:
            candidates = np.flatnonzero(ok)
            if candidates.size == 0:
                break
            if order.retakers:
                tiers = np.array([order.retakers.get(book.nodes[c].id, 0) for c in candidates], dtype=np.int64)
                candidates = candidates[tiers == tiers.min()]
            prices = price[candidates]
            cheapest = candidates[prices == prices.min()]
            best = int(cheapest[np.argmin(rank[book.index[cheapest]])])
            i = int(book.index[best])
            node = nodes[i]
            out.append(Match(order.id, node.id, node.asks[order.kind].price(order.tflop)))
            chosen.append(i)
            ok &= book.owner != owners[i]  # replicas go to different providers
            for kind in node.kinds:
                other = books.get(kind)
                if other is not None:
                    other.take(i)
        if not chosen and not order.restricted:
            failed[need] = min(order.tflop, failed.get(need, math.inf))
    return out
