"""The operations dashboard: staff only, every figure one query (the count does not grow
with the rows), each figure what the rows say."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from ledger import services as ledger
from ledger.models import Transaction
from ledger.sealer import seal_all
from ledger.units import UNITS_PER_CREDIT
from marketplace.models import Task
from tests.factories import UserFactory, make_worker, post_task
from workers.assignments import scheduler
from workers.models import Assignment, Worker
from workers.operations import figures

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff() -> Client:
    root: Any = UserFactory(username="root", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(root)
    return client


def platform(alice: Any, bob: Any, n: int) -> dict[str, Any]:
    """n nodes online, one of them busy, one silent and one suspended; n tasks posted (one
    given to the busy node), one failed with a rejected job, and a sealed block."""
    workers = [make_worker(alice, name=f"node-{i}").worker for i in range(n)]
    make_worker(alice, name="silent", online=False)
    make_worker(alice, name="held", state=Worker.State.SUSPENDED, held_by_platform=True)
    tasks = [post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT, title=f"t{i}") for i in range(n)]
    (job,) = scheduler.schedule(tasks[0].pk)
    failed = tasks[-1]
    Task.objects.filter(pk=failed.pk).update(status="failed", status_reason="No worker took it.")
    rejected = Assignment.objects.create(
        task=failed,
        worker=workers[-1],
        state=Assignment.State.REJECTED,
        deadline=failed.created_at,
        reason="Bad proof.",
    )
    seal_all()
    ledger.deposit(bob, UNITS_PER_CREDIT, "pending-one")  # in the mempool, not sealed
    return {"job": job, "failed": failed, "rejected": rejected}


def test_every_figure_is_one_query(alice: Any, bob: Any, django_assert_num_queries: Any) -> None:
    platform(alice, bob, 3)
    # Tasks waiting, nodes, verification, the chain's height, its transactions, the failed
    # tasks and the failed jobs.
    with django_assert_num_queries(7):
        figures()


@pytest.mark.parametrize("rows", [3, 12])
def test_the_page_costs_the_same_for_more_rows(staff: Client, alice: Any, bob: Any, rows: int) -> None:
    platform(alice, bob, rows)
    with CaptureQueriesContext(connection) as queries:
        assert staff.get("/admin/operations/").status_code == 200
    # The session, the staff user and the admin's app list, plus the seven figures.
    assert len(queries) == 9


def test_the_figures_say_what_the_rows_say(staff: Client, alice: Any, bob: Any) -> None:
    made = platform(alice, bob, 4)
    got = figures()
    assert [(row["kind"], row["tasks"]) for row in got["waiting"]] == [("synthetic", 2)]  # 4 − assigned − failed
    assert got["nodes"] == {"online": 4, "busy": 1, "free": 3, "suspended": 1, "held": 1}
    assert got["verification"]["results"] == 0
    assert got["height"]["height"] is not None
    assert got["ledger"]["pending"] == Transaction.objects.filter(status="pending").count() >= 1

    page = staff.get("/admin/operations/").content.decode()
    assert f"/admin/marketplace/task/{made['failed'].pk}/change/" in page
    assert "No worker took it." in page
    assert f"/admin/workers/assignment/{made['rejected'].pk}/change/" in page
    assert "Bad proof." in page
    assert "/admin/operations/" in staff.get("/admin/").content.decode()


def test_only_staff_see_the_dashboard(client: Client, alice: Any) -> None:
    response = client.get("/admin/operations/")
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")
    client.force_login(alice)
    response = client.get("/admin/operations/")
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")
    assert "Tasks waiting" not in client.get("/admin/operations/", follow=True).content.decode()
