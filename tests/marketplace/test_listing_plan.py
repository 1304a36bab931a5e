"""The public listing ordered by budget reads an index range, not every open task."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from rest_framework.settings import api_settings

from marketplace.models import Task, TaskStatus
from tests.factories import post_task
from tests.plans import nodes, plan_of

OPEN_TASKS = 5_000


@pytest.mark.django_db(transaction=True)  # VACUUM, as autovacuum would have: it runs outside a transaction
@pytest.mark.skipif(connection.vendor != "postgresql", reason="the plan is PostgreSQL's")
def test_the_listing_by_budget_reads_a_page_of_the_index(alice: Any, anon_client: Any) -> None:
    template = post_task(alice)
    fields = {f.attname: getattr(template, f.attname) for f in Task._meta.concrete_fields if not f.primary_key}
    statuses = [TaskStatus.OPEN, TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED]
    Task.objects.bulk_create(
        (
            Task(**{**fields, "budget": 1 + (i * 7919) % 100_000, "status": statuses[i % 4]})
            for i in range(4 * OPEN_TASKS)
        ),
        batch_size=2_000,
    )
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE marketplace_task")

    page_size = api_settings.PAGE_SIZE
    assert page_size is not None
    for ordering in ("-budget", "budget"):
        plan = plan_of(Task.objects.public().order_by(ordering)[:page_size])
        kinds = {n["Node Type"] for n in nodes(plan)}
        assert not kinds & {"Sort", "Seq Scan", "Bitmap Heap Scan"}, kinds
        read = sum(n["Actual Rows"] * n["Actual Loops"] for n in nodes(plan) if n.get("Relation Name"))
        assert read <= 2 * page_size
        page = anon_client.get("/api/v1/marketplace/tasks/", {"ordering": ordering})
        assert page.status_code == 200
        budgets = [float(t["budget"]) for t in page.json()["results"]]
        assert budgets == sorted(budgets, reverse=ordering.startswith("-"))
        assert len(budgets) == page_size
