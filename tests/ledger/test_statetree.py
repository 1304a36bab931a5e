"""The state tree kept between blocks gives the state_root a rebuild from scratch gives."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

from ledger import sealer, services
from ledger.models import Account, Block
from ledger.replay import verify_chain
from ledger.statetree import StateTree, state_leaves
from protocol import merkle
from tests.factories import UserFactory
from tests.ledger.helpers import CREDIT, worker_keys


def _from_scratch(state: dict[str, tuple[int, int]]) -> bytes:
    return merkle.root_from_leaf_hashes(state_leaves((a, b, n) for a, (b, n) in state.items()))


@pytest.mark.parametrize("seed", range(40))
def test_changes_joins_and_leaves_give_the_root_of_a_rebuild(seed: int) -> None:
    rng = random.Random(seed)
    pool = [f"cpc1{rng.randrange(16**8):08x}" for _ in range(rng.randrange(1, 80))]
    state = {a: (rng.randrange(3), rng.randrange(2)) for a in rng.sample(pool, rng.randrange(len(pool) + 1))}
    tree = StateTree((a, b, n) for a, (b, n) in state.items())
    assert tree.root() == _from_scratch(state)
    for _ in range(30):
        # A block: a few accounts change, join (first touched) or leave (back to zero).
        for _ in range(rng.randrange(6)):
            address = rng.choice(pool)
            state[address] = (rng.randrange(3), rng.randrange(2))
            tree.update(address, *state[address])
        assert tree.root() == _from_scratch(state)
        assert len(tree) == sum(1 for v in state.values() if any(v))


def test_every_size_across_powers_of_two_and_back_to_empty() -> None:
    tree = StateTree()
    state: dict[str, tuple[int, int]] = {}
    assert tree.root() == merkle.EMPTY_ROOT
    for i in range(70):  # each join lands in the middle, every size from 1 to 70
        address = f"cpc1{(i * 37) % 101:04d}"
        state[address] = (i + 1, 0)
        tree.update(address, i + 1, 0)
        assert tree.root() == _from_scratch(state)
    for address in sorted(state):
        state[address] = (0, 0)
        tree.update(address, 0, 0)
        assert tree.root() == _from_scratch(state)
    assert tree.root() == merkle.EMPTY_ROOT
    assert len(tree) == 0


def test_refuses_negative_amounts_and_duplicate_accounts() -> None:
    with pytest.raises(ValueError, match="negative"):
        StateTree().update("cpc1a", -1, 0)
    with pytest.raises(ValueError, match="twice"):
        StateTree([("cpc1a", 1, 0), ("cpc1a", 2, 0)])


def _sealed_root() -> str:
    rows = Account.objects.values_list("address", "balance", "nonce")
    return merkle.root_from_leaf_hashes(state_leaves(rows)).hex()


def _seal(capture: Any) -> Block:
    """Seal as the platform does: the block commits, so on_commit callbacks run."""
    with capture(execute=True):
        block = sealer.seal_block()
    assert block is not None
    return block


@pytest.fixture
def fresh_cache() -> Any:
    sealer._state_tree = None
    yield
    sealer._state_tree = None


def test_the_sealer_carries_its_tree_from_block_to_block(
    db: Any, fresh_cache: None, django_capture_on_commit_callbacks: Any
) -> None:
    alice: Any = UserFactory(username="alice")
    services.deposit(alice, 10 * CREDIT, "d")
    first = _seal(django_capture_on_commit_callbacks)
    assert first.state_root == _sealed_root()
    assert sealer._state_tree is not None
    assert sealer._state_tree[0] == first.hash
    # Next blocks: new accounts join (transfers to fresh workers), known ones change.
    for i in range(1, 6):
        services.transfer(alice, worker_keys(i).address, CREDIT // i, f"pay{i}")
        block = _seal(django_capture_on_commit_callbacks)
        assert block.state_root == _sealed_root()
        assert sealer._state_tree is not None
        assert sealer._state_tree[0] == block.hash
    assert verify_chain().blocks == 7


def test_a_tree_of_an_older_head_is_not_used(
    db: Any, fresh_cache: None, django_capture_on_commit_callbacks: Any
) -> None:
    alice: Any = UserFactory(username="alice")
    services.deposit(alice, 10 * CREDIT, "d")
    _seal(django_capture_on_commit_callbacks)
    stale = copy.deepcopy(sealer._state_tree)  # the tree itself moves on with the next block
    services.transfer(alice, worker_keys(1).address, CREDIT, "pay")
    _seal(django_capture_on_commit_callbacks)
    # As if another process sealed that last block: this process's tree is one block old.
    sealer._state_tree = stale
    services.transfer(alice, worker_keys(2).address, CREDIT, "pay2")
    block = _seal(django_capture_on_commit_callbacks)
    assert block.state_root == _sealed_root()
    assert verify_chain().blocks == 4


def test_a_block_that_fails_after_the_tree_moved_leaves_no_wrong_tree(
    db: Any, fresh_cache: None, django_capture_on_commit_callbacks: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    alice: Any = UserFactory(username="alice")
    services.deposit(alice, 10 * CREDIT, "d")
    _seal(django_capture_on_commit_callbacks)
    services.transfer(alice, worker_keys(1).address, CREDIT, "pay")

    def broken(*args: Any, **kwargs: Any) -> Block:
        raise RuntimeError("disk full")

    with monkeypatch.context() as patch:
        patch.setattr(sealer, "_save_block", broken)
        with pytest.raises(RuntimeError, match="disk full"):
            sealer.seal_block()
    assert sealer._state_tree is None
    # The transfer is still pending; sealed now, the root is that of the accounts.
    block = _seal(django_capture_on_commit_callbacks)
    assert block.height == 2
    assert block.state_root == _sealed_root()
    assert verify_chain().blocks == 3
