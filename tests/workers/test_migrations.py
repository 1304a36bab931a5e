"""Data migrations, run for real: migrate back to the state before, write rows as the old
code did, migrate forward, and look at what a user's page would show."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from ledger.units import UNITS_PER_CREDIT
from tests.factories import post_task
from tests.migrating import migrate, migrated_back
from workers.assignments import scheduler
from workers.models import Worker

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("workers", "0005_reset_self_reported_benchmarks")]
AFTER = [("workers", "0006_relabel_self_reported_summary_figures")]


@pytest.fixture
def old_state() -> Any:
    with migrated_back(BEFORE) as apps:
        yield apps


def test_summaries_from_before_platform_timing_keep_their_figure_as_the_nodes(old_state: Any) -> None:
    user_model = old_state.get_model("marketplace", "User")
    task_model = old_state.get_model("marketplace", "Task")
    owner = user_model.objects.create(username="old-requester")
    long_ago = timezone.now() - timedelta(days=30)

    def task(summary: dict[str, Any], kind: str = "synthetic", finished: Any = long_ago) -> Any:
        return task_model.objects.create(
            owner=owner,
            title="old",
            kind=kind,
            spec={"n": 64},
            budget=1,
            price_estimate=1,
            status="completed" if finished else "running",
            finished_at=finished,
            result_summary=summary,
        )

    old = task({"result_hash": "ab" * 32, "gflops": 55.4})  # the node's own figure, labelled platform-timed
    new = task({"result_hash": "cd" * 32, "gflops": 0.9, "reported_gflops": 55.4})  # already split
    other = task({"gflops": 1.0}, kind="cube")  # no such figure to relabel
    running = task({}, finished=None)

    apps = migrate(AFTER)
    rows = {t.pk: t.result_summary for t in apps.get_model("marketplace", "Task").objects.all()}
    assert rows[old.pk] == {"result_hash": "ab" * 32, "reported_gflops": 55.4}
    assert rows[new.pk] == {"result_hash": "cd" * 32, "gflops": 0.9, "reported_gflops": 55.4}
    assert rows[other.pk] == {"gflops": 1.0}
    assert rows[running.pk] == {}


def test_workers_registered_before_features_are_offered_only_what_their_agent_runs(alice: Any, bob: Any) -> None:
    # Registered by an agent from before features; leaving the block applies 0007.
    with migrated_back([("workers", "0006_relabel_self_reported_summary_figures")]) as apps:
        owner = apps.get_model("marketplace", "User").objects.get(pk=alice.pk)
        caps = {"cpu_cores": 2, "ram_bytes": 8 * 2**30, "gpu_memory_bytes": 0, "kinds": ["synthetic"]}
        old = apps.get_model("workers", "Worker").objects.create(
            owner=owner, address="cpc1old", public_key="ab" * 32, token_hash="x" * 64, capabilities=caps, reputation=90
        )

    worker = Worker.objects.get(pk=old.pk)
    assert worker.capabilities == {**caps, "features": ["poc:shake128"]}
    Worker.objects.filter(pk=worker.pk).update(last_heartbeat_at=timezone.now())
    new_task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    assert scheduler.eligible_workers(new_task, exclude=set()) == []
    legacy = post_task(bob, "synthetic", {"n": 64, "generator": "shake128"}, budget=UNITS_PER_CREDIT)
    assert scheduler.eligible_workers(legacy, exclude=set()) == [worker]
