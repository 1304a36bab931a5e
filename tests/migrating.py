"""Migrations run for real inside a test: back to an old state, where rows are written as
the old code did, then forward; the rest of the suite runs on the latest state."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connection
from django.db.migrations.executor import MigrationExecutor

Targets = list[tuple[str, str]]


def migrate(targets: Targets) -> Any:
    """Migrate to ``targets``; the historical apps of that state (for its models)."""
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


@contextmanager
def migrated_back(targets: Targets) -> Iterator[Any]:
    """The historical apps at ``targets``; every app is migrated to its latest afterwards."""
    try:
        yield migrate(targets)
    finally:
        migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())
