"""PostgreSQL query plans, for the tests that check a query reads an index range."""

from __future__ import annotations

import json
from typing import Any

from django.db import connection
from django.db.models import QuerySet


def plan_of(rows: QuerySet[Any]) -> dict[str, Any]:
    """The executed plan of ``rows`` (EXPLAIN ANALYZE, as JSON)."""
    sql, params = rows.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", params)
        found = cursor.fetchone()
    assert found is not None
    value = found[0]
    return (json.loads(value) if isinstance(value, str) else value)[0]["Plan"]


def nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """The plan's nodes, the root first."""
    return [plan, *(n for child in plan.get("Plans", []) for n in nodes(child))]
