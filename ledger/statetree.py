"""The state tree: state_root kept up to date instead of rebuilt for every block.

state_root is the RFC 6962 root over the accounts a sealed transaction has touched,
sorted by address (``sealer.state_leaves``). Rebuilding it costs a leaf hash per account
and as many node hashes, for every block: with 100,000 accounts about 0.2 s a block in
the sealer and, since the audit checks every block's root, blocks × accounts hashes in
the audit. A block touches a few accounts, so this keeps the tree's levels and redoes
only what a change reaches:

- a changed balance or nonce: its leaf and the nodes above it, O(log n);
- an account added or dropped (the first transaction that touches it, a balance and
  nonce back to zero): the leaves after it move, so the nodes right of it are redone,
  from the leaf hashes kept (no leaf is hashed again).

Levels are built bottom-up, pairing left to right and carrying an odd last node up
unchanged, which is the RFC 6962 shape (``merkle.root_from_leaf_hashes``). Pure Python,
no Django.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from protocol import encoding, merkle


def _leaf(address: str, balance: int, nonce: int) -> bytes:
    return merkle.leaf_hash(encoding.state_leaf(address, balance, nonce))


def state_leaves(rows: Iterable[tuple[str, int, int]]) -> list[bytes]:
    """Leaf hashes of state_root from scratch: accounts sorted by address, those a
    sealed transaction has touched (balance or nonce non-zero), so replay can rebuild it
    exactly."""
    return [_leaf(a, b, n) for a, b, n in sorted(rows) if b or n]


class StateTree:
    """Accounts (address → balance, nonce) and the Merkle tree over them.

    ``update`` records changes; ``root`` applies them and returns state_root. An
    account whose balance and nonce are both zero is not in the tree, as in
    ``sealer.state_leaves``. Keeps addresses, leaf and node hashes: about 250 bytes an
    account.
    """

    def __init__(self, rows: Iterable[tuple[str, int, int]] = ()) -> None:
        accounts = sorted((a, b, n) for a, b, n in rows if b or n)
        self._addresses: list[str] = [a for a, _, _ in accounts]
        if len(set(self._addresses)) != len(self._addresses):
            raise ValueError("an address appears twice")
        self._levels: list[list[bytes]] = [[_leaf(a, b, n) for a, b, n in accounts]]
        self._pending: dict[str, tuple[int, int]] = {}
        self._rebuild(set(), 0)

    def __len__(self) -> int:
        """Accounts in the tree, pending changes included."""
        self.root()
        return len(self._addresses)

    def update(self, address: str, balance: int, nonce: int) -> None:
        """Set one account's sealed state (applied at the next ``root``)."""
        if balance < 0 or nonce < 0:
            raise ValueError(f"account {address}: balance and nonce cannot be negative")
        self._pending[address] = (balance, nonce)

    def root(self) -> bytes:
        if self._pending:
            self._apply()
        level = self._levels[-1]
        return level[0] if level else merkle.EMPTY_ROOT

    def _find(self, address: str) -> tuple[int, bool]:
        i = bisect.bisect_left(self._addresses, address)
        return i, i < len(self._addresses) and self._addresses[i] == address

    def _apply(self) -> None:
        pending, self._pending = self._pending, {}
        addresses, leaves = self._addresses, self._levels[0]
        # Accounts that join or leave the tree first: they move the leaves after them.
        tail: int | None = None
        changed: list[str] = []
        for address, (balance, nonce) in pending.items():
            i, present = self._find(address)
            if present and not (balance or nonce):
                del addresses[i], leaves[i]
            elif not present and (balance or nonce):
                addresses.insert(i, address)
                leaves.insert(i, _leaf(address, balance, nonce))
            else:
                if present:
                    changed.append(address)
                continue
            tail = i if tail is None else min(tail, i)
        dirty: set[int] = set()
        for address in changed:
            i, _ = self._find(address)
            leaf = _leaf(address, *pending[address])
            if leaves[i] != leaf:
                leaves[i] = leaf
                dirty.add(i)
        self._rebuild(dirty, tail)

    def _rebuild(self, dirty: set[int], tail: int | None) -> None:
        """Redo the nodes above the ``dirty`` leaves and every node from leaf ``tail``
        on (None: none), level by level up to the root."""
        levels = self._levels
        depth = 0
        while len(levels[depth]) > 1:
            below = levels[depth]
            if depth + 1 == len(levels):
                levels.append([])
            above = levels[depth + 1]
            if tail is not None:
                tail //= 2
                del above[tail:]
                above.extend(self._node(below, j) for j in range(tail, (len(below) + 1) // 2))
            dirty = {i // 2 for i in dirty if tail is None or i // 2 < tail}
            for j in dirty:
                above[j] = self._node(below, j)
            depth += 1
        del levels[depth + 1 :]

    @staticmethod
    def _node(below: list[bytes], j: int) -> bytes:
        left = 2 * j
        return merkle.node_hash(below[left], below[left + 1]) if left + 1 < len(below) else below[left]
