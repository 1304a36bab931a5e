"""marketplace.lifecycle is the one module that locks a task's row and moves its status:
the other modules of the platform call it, and its moves carry their escrow effects."""

from __future__ import annotations

import ast
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction
from rest_framework.exceptions import NotFound

from ledger import services as ledger
from marketplace import lifecycle
from marketplace.models import IllegalTransition, Task, TaskStatus
from tests.factories import post_task

ROOT = Path(__file__).resolve().parents[2]
APPS = ("config", "ledger", "marketplace", "payments", "workers")
OWNER = Path("marketplace/lifecycle.py")


def _platform_modules() -> Iterator[tuple[Path, ast.Module]]:
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            relative = path.relative_to(ROOT)
            if "migrations" in relative.parts or relative.parts[:2] == ("workers", "agent"):
                continue
            yield relative, ast.parse(path.read_text(), str(relative))


def _chain_root(node: ast.expr) -> ast.expr:
    """The name a chain of calls and attributes starts from (``Task`` in ``Task.objects.x().y()``)."""
    while isinstance(node, ast.Attribute | ast.Call):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def _on_tasks(call: ast.Call) -> bool:
    root = _chain_root(call.func)
    return isinstance(root, ast.Name) and root.id == "Task"


def test_only_the_lifecycle_locks_a_task_row() -> None:
    lockers = {
        f"{path}:{node.lineno}"
        for path, tree in _platform_modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "select_for_update"
        and _on_tasks(node)
        and path != OWNER
    }
    assert not lockers, f"lock a task's row with marketplace.lifecycle.lock_task: {sorted(lockers)}"


def test_only_the_lifecycle_sets_a_task_status() -> None:
    writers = set()
    for path, tree in _platform_modules():
        if path == OWNER:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(
                isinstance(target, ast.Attribute)
                and target.attr == "status"
                and isinstance(target.value, ast.Name)
                and "task" in target.value.id.lower()
                for target in node.targets
            ):
                writers.add(f"{path}:{node.lineno}")
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "update"
                and any(keyword.arg == "status" for keyword in node.keywords)
                and _on_tasks(node)
            ):
                writers.add(f"{path}:{node.lineno}")
    assert not writers, f"move a task with marketplace.lifecycle: {sorted(writers)}"


@contextmanager
def locked(task: Task) -> Iterator[Task]:
    """The task's row, locked in a transaction of its own."""
    with transaction.atomic():
        row = lifecycle.lock_task(task.pk)
        assert row is not None
        yield row


@pytest.mark.django_db
def test_lock_task_is_none_for_no_task() -> None:
    with transaction.atomic():
        assert lifecycle.lock_task(uuid.uuid4()) is None


@pytest.mark.django_db
def test_lock_own_task_reports_anothers_task_missing(alice: Any, bob: Any) -> None:
    task = post_task(alice)
    with transaction.atomic(), pytest.raises(NotFound):
        lifecycle.lock_own_task(bob, task.pk)
    with transaction.atomic():
        assert lifecycle.lock_own_task(alice, task.pk) == task


@pytest.mark.django_db
def test_failing_refunds_the_escrow_and_a_failed_task_stays_failed(alice: Any) -> None:
    task = post_task(alice)
    before = ledger.balance(alice)
    with locked(task) as row:
        lifecycle.fail_locked(row, "Failed on purpose.", reason="A test failed it.")
    task.refresh_from_db()
    assert (task.status, task.status_reason) == (TaskStatus.FAILED, "A test failed it.")
    assert task.finished_at is not None
    assert ledger.balance(alice) == before + task.budget
    assert list(task.events.values_list("message", flat=True))[-1] == "Failed on purpose."

    with locked(task) as row, pytest.raises(IllegalTransition, match="failed cannot become failed"):
        lifecycle.fail_locked(row, "Again.", reason="")
    assert ledger.balance(alice) == before + task.budget


@pytest.mark.django_db
def test_completing_records_the_result_and_refunds_the_rest(alice: Any) -> None:
    task = post_task(alice)
    before = ledger.balance(alice)
    with locked(task) as row:
        lifecycle.complete_locked(row, {"result_hash": "ab" * 32})
    task = Task.objects.get(pk=task.pk)
    assert (task.status, task.progress, task.result_summary) == (
        TaskStatus.COMPLETED,
        100.0,
        {"result_hash": "ab" * 32},
    )
    assert ledger.balance(alice) == before + task.budget
