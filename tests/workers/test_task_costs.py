"""What a completed task cost its requester, on the task page and in the API detail, on a
real synthetic job run by the agent's code: the parts add up to what was escrowed."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

import pytest
from rest_framework.test import APIClient

from ledger import services as ledger
from ledger.models import Transaction
from ledger.units import credits_to_units, format_credits
from marketplace.models import Task, TaskStatus
from protocol import encoding
from tests.workers.test_results import alpha, submitted, web  # noqa: F401 (fixtures)
from workers.models import Assignment
from workers.tasks import verify_assignment

pytestmark = pytest.mark.django_db


def _shown(html: str, dd_id: str) -> int:
    """The credits a <dd id=...> of the cost summary shows, in base units."""
    match = re.search(rf'<dd id="{dd_id}">([0-9.]+) credits', html)
    assert match, dd_id
    return credits_to_units(Decimal(match.group(1)))


def test_a_completed_task_shows_where_its_budget_went(
    submitted: tuple[Task, Assignment, bytes],  # noqa: F811
    bob: Any,
    bob_client: APIClient,
) -> None:
    task, assignment, _ = submitted
    assert verify_assignment(str(assignment.pk)) == "accepted"
    task.refresh_from_db()
    assert task.status == TaskStatus.COMPLETED
    before = ledger.balance(bob)

    html = web(bob).get(f"/tasks/{task.pk}/").content.decode()
    escrowed = _shown(html, "cost-escrowed")
    paid = _shown(html, "cost-paid")
    fee = _shown(html, "cost-fee")
    refunded = _shown(html, "cost-refunded")
    assert escrowed == task.budget
    assert paid + fee + refunded == escrowed  # nothing is left in escrow: no "still held" row
    assert 'id="cost-held"' not in html
    # Each number is the ledger's own: the FEE and release transactions, the result's gas.
    txs = ledger.task_transactions(task.pk, [assignment.worker.address])
    assert fee == sum(t.amount for t in txs if t.type == encoding.FEE)
    assert paid == sum(t.amount for t in txs if t.type == encoding.ESCROW_RELEASE and t.payload["kind"] == "reward")
    gas = Transaction.objects.get(type=encoding.SUBMIT_RESULT, sender=assignment.worker.address).fee
    assert gas > 0
    assert f"of which {format_credits(gas)} went back as gas" in html
    assert ledger.balance(bob) == before  # reading the page moves nothing

    cost = bob_client.get(f"/api/v1/tasks/{task.pk}/").json()["cost"]
    assert cost == {
        "escrowed": format_credits(escrowed),
        "paid_to_workers": format_credits(paid),
        "platform_fee": format_credits(fee),
        "worker_gas": format_credits(gas),
        "refunded": format_credits(refunded),
        "held": "0",
        "spent": format_credits(paid + fee),
    }


def test_an_open_task_shows_its_budget_held(bob: Any, bob_client: APIClient) -> None:
    from ledger.units import UNITS_PER_CREDIT
    from tests.factories import post_task

    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    html = web(bob).get(f"/tasks/{task.pk}/").content.decode()
    assert _shown(html, "cost-held") == UNITS_PER_CREDIT
    assert _shown(html, "cost-paid") == 0
    assert bob_client.get(f"/api/v1/tasks/{task.pk}/").json()["cost"]["held"] == "1"
