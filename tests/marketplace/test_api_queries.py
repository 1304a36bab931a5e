"""Query counts pinned on every list endpoint: 3 rows and 30 rows cost the same, so an
N+1 regression fails here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from marketplace import services
from tests.factories import make_dataset, post_task

pytestmark = pytest.mark.django_db


# A small spec keeps each task's price (and escrow) at the floor, so 30 fit any balance.
SMALL_CUBE = {"epochs": 1, "lattice_edge": 2, "state_size": 4, "steps": 2}


def tasks(owner: Any, n: int) -> None:
    datasets = [make_dataset(owner) for _ in range(2)]
    for i in range(n):
        post_task(owner, kind="cube_training", spec=SMALL_CUBE, dataset=datasets[i % 2].pk, budget=10**9)


def datasets(owner: Any, n: int) -> None:
    for i in range(n):
        dataset = make_dataset(owner)
        if i % 3 == 0:
            post_task(owner, kind="cube_training", spec=SMALL_CUBE, dataset=dataset.pk, budget=10**9)


def tokens(owner: Any, n: int) -> None:
    for i in range(n):
        token, _ = services.create_api_token(owner, f"t{i}")
        if i % 2:
            services.revoke_api_token(owner, token.pk)


# (url, how to make n rows, queries: page count + page rows, or one query unpaginated)
ENDPOINTS: list[tuple[str, Callable[[Any, int], None], int]] = [
    ("/api/v1/tasks/", tasks, 2),
    ("/api/v1/tasks/?status=open&kind=cube_training&ordering=-budget", tasks, 2),
    ("/api/v1/marketplace/tasks/", tasks, 2),
    ("/api/v1/datasets/", datasets, 2),
    ("/api/v1/me/tokens/", tokens, 1),
]


@pytest.mark.parametrize(("url", "make", "queries"), ENDPOINTS, ids=[e[0] for e in ENDPOINTS])
@pytest.mark.parametrize("rows", [3, 30])
def test_list_query_count_does_not_grow_with_rows(
    alice: Any,
    alice_client: APIClient,
    django_assert_num_queries: Any,
    url: str,
    make: Callable[[Any, int], None],
    queries: int,
    rows: int,
) -> None:
    make(alice, rows)
    with django_assert_num_queries(queries):
        response = alice_client.get(url)
    assert response.status_code == 200
    body = response.json()
    if isinstance(body, list):  # tokens are few (at most 50 active) and not paginated
        assert len(body) == rows
    else:
        assert body["count"] == rows
        assert len(body["results"]) == min(rows, 20)


def test_task_detail_fetches_the_timeline_in_one_query(
    alice: Any, alice_client: APIClient, django_assert_num_queries: Any
) -> None:
    task = post_task(alice)
    services.cancel_task(alice, task.pk)
    # The task and its timeline, then the cost: the task's workers, its escrow account and
    # its transactions, one query each however many there are.
    with django_assert_num_queries(5):
        response = alice_client.get(f"/api/v1/tasks/{task.pk}/")
    assert len(response.json()["events"]) == 3


def test_token_authentication_adds_a_bounded_cost(
    alice: Any, alice_token_client: APIClient, django_assert_max_num_queries: Any
) -> None:
    tasks(alice, 5)
    # Token lookup (with its user) + at most one last_used_at write + count + rows.
    with django_assert_max_num_queries(4):
        assert alice_token_client.get("/api/v1/tasks/").status_code == 200
