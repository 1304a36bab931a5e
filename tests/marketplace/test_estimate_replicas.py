"""The post page's live estimate quotes what the budget must cover: every replica is paid,
so with replication r the figure is r times the price of one, the same sum
services.check_task_request asks of the budget (and the quote API calls budget_needed)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from ledger.units import format_credits
from marketplace.kinds import KINDS
from marketplace.models import Task

pytestmark = pytest.mark.django_db

SPEC = {"n": 2048, "count": 2, "entry_bound": 4}
PRICE = KINDS["synthetic"].estimate_price(KINDS["synthetic"].validate_spec(dict(SPEC)))


def form(**overrides: str) -> dict[str, str]:
    data = {
        "title": "Replicated matmul",
        "spec_n": str(SPEC["n"]),
        "spec_count": str(SPEC["count"]),
        "spec_entry_bound": str(SPEC["entry_bound"]),
        "budget": format_credits(PRICE),
        "min_reputation": "0",
        "replication": "1",
        "max_attempts": "3",
    }
    data.update(overrides)
    return data


def check(client: Client, **overrides: str) -> str:
    response = client.post(reverse("task-check", args=["synthetic"]), form(**overrides), HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    return response.content.decode()


def estimate_figure(body: str) -> str:
    match = re.search(r'<strong id="estimate-price">([^<]*)</strong>\s*<span>([^<]*)</span>', body)
    assert match, body
    return f"{match.group(1)} {match.group(2)}"


def budget_error(body: str) -> str:
    match = re.search(r'<div id="id_budget_error" hx-swap-oob="innerHTML">(.*?)</div>', body, re.S)
    assert match, body
    return match.group(1)


def test_one_replica_quotes_its_price(alice_web: Client) -> None:
    body = check(alice_web)
    assert estimate_figure(body) == f"{format_credits(PRICE)} credits"
    assert 'id="estimate-per-replica"' not in body
    assert budget_error(body) == ""


def test_replicas_quote_the_total_the_budget_must_cover(alice_web: Client) -> None:
    # The budget left at one replica's price, as the form pre-fills it.
    body = check(alice_web, replication="2")
    total = format_credits(2 * PRICE)
    assert estimate_figure(body) == f"{total} credits for 2 replicas"
    assert (
        f"{format_credits(PRICE)} credits per replica × 2 replicas: each verified replica is paid, "
        f"so the budget must cover {total}." in body
    )
    # The service's own check names the same sum.
    assert f"the budget must cover {total}." in budget_error(body)

    # A budget of that total passes the check, and the post goes through.
    covered = check(alice_web, replication="3", budget=format_credits(3 * PRICE))
    assert estimate_figure(covered) == f"{format_credits(3 * PRICE)} credits for 3 replicas"
    assert budget_error(covered) == ""
    response = alice_web.post(
        reverse("task-post", args=["synthetic"]), form(replication="3", budget=format_credits(3 * PRICE))
    )
    assert response.status_code == 302
    task = Task.objects.get(title="Replicated matmul")
    assert (task.replication, task.budget) == (3, 3 * PRICE)


def test_a_replication_that_does_not_parse_quotes_one_replica_and_says_so(alice_web: Client) -> None:
    body = check(alice_web, replication="9")
    assert estimate_figure(body) == f"{format_credits(PRICE)} credits per replica"
    assert "The budget must cover this times the replication." in body


def test_the_page_quotes_the_total_after_a_refused_post(alice_web: Client, alice: Any) -> None:
    response = alice_web.post(reverse("task-post", args=["synthetic"]), form(replication="2"))
    assert response.status_code == 400
    body = response.content.decode()
    assert estimate_figure(body) == f"{format_credits(2 * PRICE)} credits for 2 replicas"
    assert not Task.objects.filter(owner=alice).exists()
