"""Task endpoints, happy paths: post each creatable kind, list, filter, order, page,
retrieve with the timeline, publish a draft, cancel."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from ledger.units import UNITS_PER_CREDIT
from marketplace.models import Task, TaskEvent
from tests.factories import islr_zip_bytes, make_dataset, post_task, zip_bytes

pytestmark = pytest.mark.django_db

TASKS = "/api/v1/tasks/"


def test_post_a_synthetic_task(alice: Any, alice_client: APIClient) -> None:
    body = {"kind": "synthetic", "title": " matmul ", "spec": {"n": 256, "count": 2}, "budget": "1.5"}
    response = alice_client.post(TASKS, body, format="json")
    assert response.status_code == 201, response.json()
    data = response.json()
    assert data["kind"] == "synthetic"
    assert data["title"] == "matmul"
    assert data["status"] == "open"
    # Omitted spec fields take the serializer's defaults.
    assert data["spec"] == {"n": 256, "count": 2, "entry_bound": 8, "generator": "aes256ctr"}
    assert data["budget"] == "1.5"
    assert [e["status"] for e in data["events"]] == ["draft", "open"]
    task = Task.objects.get(pk=data["id"])
    assert task.owner == alice
    assert task.budget == 1_500_000_000
    assert task.price_estimate > 0
    assert data["price_estimate"] == str(task.price_estimate / UNITS_PER_CREDIT).rstrip("0").rstrip(".")


def test_the_synthetic_generator_is_one_the_platform_verifies(alice_client: APIClient) -> None:
    bad = alice_client.post(TASKS, {"kind": "synthetic", "budget": 1, "spec": {"generator": "mt19937"}}, format="json")
    assert bad.status_code == 400
    assert bad.json() == {"spec": {"generator": ['"mt19937" is not a valid choice.']}}
    assert not Task.objects.exists()
    legacy = alice_client.post(
        TASKS, {"kind": "synthetic", "budget": 1, "spec": {"generator": "shake128"}}, format="json"
    )
    assert legacy.status_code == 201
    assert legacy.json()["spec"]["generator"] == "shake128"


def test_a_task_without_a_title_is_named_after_its_kind(alice_client: APIClient) -> None:
    response = alice_client.post(TASKS, {"kind": "synthetic", "budget": 1}, format="json")
    assert response.status_code == 201
    assert response.json()["title"] == "Synthetic proof of compute"


def test_post_cube_training_on_synthetic_data(alice_client: APIClient) -> None:
    body = {"kind": "cube_training", "spec": {"epochs": 2, "lattice_edge": 4, "synthetic_samples": 64}, "budget": 10}
    response = alice_client.post(TASKS, body, format="json")
    assert response.status_code == 201, response.json()
    data = response.json()
    assert data["dataset"] is None
    assert data["spec"]["epochs"] == 2
    assert data["spec"]["mode"] == "autoencoder"
    assert data["status"] == "open"
    assert data["kind_available"] is True


def test_a_kind_no_provider_runs_yet_stays_open_and_says_why(
    alice_client: APIClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dataclasses import replace

    from marketplace.kinds import KINDS

    monkeypatch.setitem(KINDS, "cube_training", replace(KINDS["cube_training"], verifier=None))
    body = {"kind": "cube_training", "spec": {"epochs": 2, "lattice_edge": 4, "synthetic_samples": 64}, "budget": 10}
    data = alice_client.post(TASKS, body, format="json").json()
    assert data["status"] == "open"
    assert data["kind_available"] is False
    assert "No provider runs Cube training tasks yet; if none does by " in data["status_reason"]
    assert data["status_reason"].endswith(" UTC, the task fails with a full refund.")


def test_post_cube_training_on_an_uploaded_array(alice: Any, alice_client: APIClient) -> None:
    dataset = make_dataset(alice)
    body = {"kind": "cube_training", "spec": {"synthetic_samples": 0}, "dataset": str(dataset.pk), "budget": 100}
    response = alice_client.post(TASKS, body, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["dataset"] == str(dataset.pk)


def test_post_asl_training_with_an_uploaded_zip(alice: Any, alice_client: APIClient) -> None:
    upload = alice_client.post(
        "/api/v1/datasets/",
        {"file": _file(islr_zip_bytes(), "islr.zip"), "name": "islr"},
        format="multipart",
    )
    assert upload.status_code == 201, upload.json()
    assert upload.json()["format"] == "zip"
    body = {"kind": "asl_training", "spec": {"epochs": 1, "dim": 384}, "dataset": upload.json()["id"], "budget": 100}
    response = alice_client.post(TASKS, body, format="json")
    assert response.status_code == 201, response.json()
    # A zip whose train.csv lists nothing is refused at posting, naming the dataset.
    empty = alice_client.post(
        "/api/v1/datasets/", {"file": _file(zip_bytes(), "empty.zip"), "name": "empty"}, format="multipart"
    )
    refused = alice_client.post(TASKS, {**body, "dataset": empty.json()["id"]}, format="json")
    assert refused.status_code == 400
    assert refused.json() == {"dataset": ["empty: train.csv: lists no sequences."]}
    assert response.json()["spec"]["dim"] == 384
    assert Task.objects.get(pk=response.json()["id"]).dataset_id is not None


def _file(content: bytes, name: str) -> Any:
    from tests.factories import upload

    return upload(content, name)


def test_post_a_draft_then_publish_it(alice_client: APIClient) -> None:
    response = alice_client.post(TASKS, {"kind": "synthetic", "budget": 1, "draft": True}, format="json")
    assert response.status_code == 201
    assert response.json()["status"] == "draft"
    task_id = response.json()["id"]
    published = alice_client.post(f"{TASKS}{task_id}/publish/")
    assert published.status_code == 200
    assert published.json()["status"] == "open"
    assert published.json()["opened_at"] is not None
    assert [e["status"] for e in published.json()["events"]] == ["draft", "open"]


def test_cancel_an_open_task(alice: Any, alice_client: APIClient) -> None:
    task = post_task(alice)
    response = alice_client.post(f"{TASKS}{task.pk}/cancel/")
    assert response.status_code == 200
    assert response.json()["status"] == "cancelled"
    assert response.json()["finished_at"] is not None
    assert [e["status"] for e in response.json()["events"]] == ["draft", "open", "cancelled"]
    task.refresh_from_db()
    assert task.status == "cancelled"


def test_retrieve_shows_the_spec_and_the_timeline(alice: Any, alice_client: APIClient) -> None:
    task = post_task(alice, spec={"n": 128}, title="tiny")
    response = alice_client.get(f"{TASKS}{task.pk}/")
    assert response.status_code == 200
    data = response.json()
    assert data["id"] == str(task.pk)
    assert data["spec"]["n"] == 128
    assert data["budget"] == "5"
    events = data["events"]
    assert [e["status"] for e in events] == ["draft", "open"]
    assert events[0]["message"] == "Task created."
    assert events[1]["message"].startswith("Task opened for workers")
    assert events[0]["at"] <= events[1]["at"]


def test_list_shows_own_tasks_newest_first(alice: Any, bob: Any, alice_client: APIClient) -> None:
    first = post_task(alice, title="first")
    second = post_task(alice, title="second")
    post_task(bob, title="bob's")
    response = alice_client.get(TASKS)
    assert response.status_code == 200
    data = response.json()
    assert data["count"] == 2
    assert [t["id"] for t in data["results"]] == [str(second.pk), str(first.pk)]
    assert "events" not in data["results"][0]


def test_list_filters_by_status_kind_and_creation_time(alice: Any, alice_client: APIClient) -> None:
    synthetic = post_task(alice)
    cube = post_task(alice, kind="cube_training", budget=100 * UNITS_PER_CREDIT)
    draft = post_task(alice, draft=True)
    old = post_task(alice)
    Task.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=10))

    def ids(query: str) -> set[str]:
        response = alice_client.get(f"{TASKS}?{query}")
        assert response.status_code == 200, response.json()
        return {t["id"] for t in response.json()["results"]}

    assert ids("status=draft") == {str(draft.pk)}
    assert ids("status=draft&status=open") == {str(t.pk) for t in (synthetic, cube, draft, old)}
    assert ids("kind=cube_training") == {str(cube.pk)}
    cutoff = (timezone.now() - timedelta(days=1)).isoformat()
    assert ids(f"created_after={cutoff.replace('+', '%2B')}") == {str(t.pk) for t in (synthetic, cube, draft)}
    assert ids(f"created_before={cutoff.replace('+', '%2B')}") == {str(old.pk)}


def test_list_orders_by_budget(alice: Any, alice_client: APIClient) -> None:
    budgets = [3, 1, 2]
    for credits in budgets:
        post_task(alice, budget=credits * UNITS_PER_CREDIT)
    ascending = alice_client.get(f"{TASKS}?ordering=budget").json()["results"]
    assert [t["budget"] for t in ascending] == ["1", "2", "3"]
    descending = alice_client.get(f"{TASKS}?ordering=-budget").json()["results"]
    assert [t["budget"] for t in descending] == ["3", "2", "1"]


def test_list_is_paginated(alice: Any, alice_client: APIClient) -> None:
    for i in range(23):
        post_task(alice, title=f"t{i}")
    first = alice_client.get(TASKS).json()
    assert first["count"] == 23
    assert len(first["results"]) == 20
    assert first["previous"] is None
    second = alice_client.get(first["next"]).json()
    assert len(second["results"]) == 3
    assert second["next"] is None
    seen = {t["id"] for t in first["results"]} | {t["id"] for t in second["results"]}
    assert len(seen) == 23
    assert alice_client.get(f"{TASKS}?page=9").status_code == 404


def test_public_marketplace_lists_open_tasks_with_public_fields_only(
    alice: Any, bob: Any, anon_client: APIClient
) -> None:
    open_task = post_task(alice, title="open one")
    post_task(alice, draft=True)
    cancelled = post_task(bob)
    from marketplace import services

    services.cancel_task(bob, cancelled.pk)
    response = anon_client.get("/api/v1/marketplace/tasks/")
    assert response.status_code == 200
    results = response.json()["results"]
    assert [t["id"] for t in results] == [str(open_task.pk)]
    assert set(results[0]) == {"id", "title", "kind", "budget", "min_reputation", "replication", "created_at"}
    assert results[0]["budget"] == "5"


def test_public_marketplace_filters_by_kind(alice: Any, anon_client: APIClient) -> None:
    post_task(alice)
    cube = post_task(alice, kind="cube_training", budget=100 * UNITS_PER_CREDIT)
    results = anon_client.get("/api/v1/marketplace/tasks/?kind=cube_training").json()["results"]
    assert [t["id"] for t in results] == [str(cube.pk)]


def test_token_authentication_can_post(alice: Any, alice_token_client: APIClient) -> None:
    response = alice_token_client.post(TASKS, {"kind": "synthetic", "budget": "2"}, format="json")
    assert response.status_code == 201
    assert Task.objects.get(pk=response.json()["id"]).owner == alice
    assert TaskEvent.objects.filter(task_id=response.json()["id"]).count() == 2


def test_quote_prices_a_task_and_says_who_could_take_it_without_posting(
    alice: Any, bob: Any, alice_client: APIClient
) -> None:
    from ledger.units import format_credits
    from marketplace.kinds import KINDS
    from tests.factories import make_worker

    quote = alice_client.post(
        TASKS + "quote/", {"kind": "synthetic", "spec": {"n": 512}, "replication": 2}, format="json"
    )
    assert quote.status_code == 200, quote.json()
    data = quote.json()
    price = KINDS["synthetic"].estimate_price(KINDS["synthetic"].validate_spec({"n": 512}))
    assert data["spec"] == {"n": 512, "count": 1, "entry_bound": 8, "generator": "aes256ctr"}
    assert data["price_estimate"] == format_credits(price)
    assert data["budget_needed"] == format_credits(2 * price)
    assert data["workers"] == {"online": 0, "fitting": 0, "free": 0}
    assert data["waiting_reason"].startswith("No worker can take this task now: no worker is online.")
    assert not Task.objects.exists()  # nothing posted, nothing held

    make_worker(bob, name="one", reputation=70)
    make_worker(bob, name="two", reputation=30)
    both = alice_client.post(TASKS + "quote/", {"kind": "synthetic", "min_reputation": 50}, format="json").json()
    assert both["workers"] == {"online": 2, "fitting": 1, "free": 1}
    assert both["waiting_reason"] == ""
    # Two replicas go to two providers: bob's two fitting nodes count once.
    pair = {"kind": "synthetic", "replication": 2}
    one_provider = alice_client.post(TASKS + "quote/", pair, format="json").json()
    assert one_provider["workers"] == {"online": 2, "fitting": 2, "free": 2}
    assert one_provider["waiting_reason"] == (
        "Only 1 provider has fitting workers online, and its 2 replicas must go to 2 different providers."
    )
    make_worker(alice, name="three", reputation=50)
    assert alice_client.post(TASKS + "quote/", pair, format="json").json()["waiting_reason"] == ""
    # The errors posting would give, the budget included when it is given.
    short = alice_client.post(TASKS + "quote/", {"kind": "synthetic", "budget": "0.000000001"}, format="json")
    assert short.status_code == 400
    assert short.json()["budget"][0].startswith("The least a job may cost is ")
    bad = alice_client.post(TASKS + "quote/", {"kind": "synthetic", "spec": {"n": 0}, "colour": 1}, format="json")
    assert bad.status_code == 400
    assert bad.json() == {"colour": ["Unknown field."]}
    assert (
        alice_client.post(TASKS + "quote/", {"kind": "synthetic", "spec": {"n": 0}}, format="json").status_code == 400
    )
    assert not Task.objects.exists()


def test_quotes_within_the_snapshot_age_share_one_read_of_the_online_workers(
    alice_client: APIClient, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from workers.assignments import supply

    settings.SUPPLY_SNAPSHOT_SECONDS = 60
    monkeypatch.setattr(supply, "_recent", None)
    with CaptureQueriesContext(connection) as queries:
        for n in (64, 128, 256):
            body = {"kind": "synthetic", "spec": {"n": n}}
            assert alice_client.post(TASKS + "quote/", body, format="json").status_code == 200
    assert len([q for q in queries.captured_queries if 'AS "busy"' in q["sql"]]) == 1
