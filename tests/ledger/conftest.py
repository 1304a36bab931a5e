"""Ledger fixtures: an assignment checker standing in for the workers app."""

from __future__ import annotations

from collections.abc import Iterator
from uuid import UUID

import pytest

from ledger import hooks


@pytest.fixture
def assignments() -> Iterator[set[tuple[UUID, str]]]:
    """The (task, worker) pairs that have an open assignment. The workers app does not
    exist yet, so this set plays its part through the documented hook."""
    known: set[tuple[UUID, str]] = set()

    def checker(task_id: UUID, worker_address: str) -> str | None:
        return None if (task_id, worker_address) in known else "no_assignment"

    previous = hooks.registered_assignment_checker()  # the workers app's, when installed
    hooks.register_assignment_checker(checker)
    yield known
    hooks.register_assignment_checker(previous)


@pytest.fixture
def no_assignment_checker() -> Iterator[None]:
    """As if no app had plugged in a checker (the workers app installs one when loaded)."""
    previous = hooks.registered_assignment_checker()
    hooks.register_assignment_checker(None)
    yield
    hooks.register_assignment_checker(previous)
