"""The demo's tasks (``manage.py demo``, run by ``make run``): small enough that the one
local agent is free again within a minute, and still honest work the platform verifies on
its own terms, through the real path (daphne, the platform worker, a registered agent)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from marketplace import services
from marketplace.kinds import KINDS
from marketplace.management.commands.demo import DEMO_TASKS
from tests.workers import processes as p
from tests.workers.live_tasks import accepted, paid_and_sealed, run_to_the_end

# The kinds' own work estimates (what asks are priced by): the cube demo task used to be
# about 15 TFLOP (3 epochs at the defaults: 1 h 45 min on two cores), the default synthetic
# task is 0.002. Every demo task stays under a hundredth of that old cube task.
MAX_DEMO_TFLOP = 0.15


@pytest.mark.parametrize(("title", "kind", "spec"), DEMO_TASKS, ids=[kind for _, kind, _ in DEMO_TASKS])
def test_each_demo_task_is_small_and_valid(title: str, kind: str, spec: dict[str, Any]) -> None:
    clean = KINDS[kind].validate_spec(spec)
    assert KINDS[kind].tflop(clean) <= MAX_DEMO_TFLOP, title


def test_the_demo_seeds_every_kind_of_its_tasks_once_per_kind_list() -> None:
    # The cube task is the one that kept the agent busy for hours: it must stay small too.
    assert {kind for _, kind, _ in DEMO_TASKS} == {"synthetic", "cube_training"}


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("shared_media")
def test_the_demo_tasks_run_to_an_accepted_result_on_a_real_agent(alice: Any, bob: Any, tmp_path: Path) -> None:
    from ledger.units import UNITS_PER_CREDIT

    with p.platform_and_node(tmp_path, alice, "demo-node") as node:
        tasks = []
        for title, kind, spec in DEMO_TASKS:
            started = time.monotonic()
            task = services.post_task(
                bob, services.TaskRequest(kind=kind, spec=spec, title=title, budget=5 * UNITS_PER_CREDIT)
            )
            tasks.append(run_to_the_end(task, tmp_path, timeout=300))
            # The wall time, posted to settled, that docs/pages.md records (not asserted).
            print(f"{title}: {time.monotonic() - started:.1f} s")
    for task in tasks:
        accepted(task)
    paid_and_sealed(node.worker, *tasks)
