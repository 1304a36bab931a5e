"""Asks through the API: a provider sets its nodes' asks (owner only), a node sets its own
(worker token), every refusal names its field, and another provider's node is a 404."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from ledger.units import format_credits
from marketplace import pricing
from tests.factories import CAPS, make_worker
from workers.models import Ask

pytestmark = pytest.mark.django_db

BOTH = {**CAPS, "kinds": ["synthetic", "cube_training"]}


@pytest.fixture
def rig(alice: Any) -> Any:
    return make_worker(alice, name="rig", caps=BOTH)


def node_client(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Worker {token}")
    return client


def test_a_node_with_no_ask_lists_the_reference_for_each_kind_it_offers(alice_client: APIClient, rig: Any) -> None:
    response = alice_client.get(f"/api/v1/workers/{rig.worker.pk}/asks/")
    assert response.status_code == 200
    rows = response.json()
    assert [row["kind"] for row in rows] == ["synthetic", "cube_training"]
    reference = pricing.reference_ask()
    assert rows[0]["reference"] is True
    assert rows[0]["per_tflop"] == format_credits(reference.per_tflop)
    assert rows[0]["minimum"] == format_credits(reference.minimum)
    assert rows[0]["floor"] == format_credits(pricing.floor_price())


def test_the_owner_sets_an_ask_and_deletes_it_back_to_the_reference(alice_client: APIClient, rig: Any) -> None:
    url = f"/api/v1/workers/{rig.worker.pk}/asks/synthetic/"
    response = alice_client.put(url, {"per_tflop": "2", "minimum": "0.5"}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["reference"] is False
    assert (body["per_tflop"], body["minimum"]) == ("2", "0.5")
    assert body["paid_for_default_job"] == "0.5"  # the default synthetic job is 0.002 TFLOP
    assert body["charged_for_default_job"] == format_credits(pricing.charge(500_000_000))
    ask = Ask.objects.get(worker=rig.worker, kind="synthetic")
    assert (ask.per_tflop, ask.minimum) == (2 * 10**9, 5 * 10**8)

    rows = alice_client.get(f"/api/v1/workers/{rig.worker.pk}/asks/").json()
    assert [row["reference"] for row in rows] == [False, True]

    assert alice_client.delete(url).status_code == 204
    assert not Ask.objects.filter(worker=rig.worker).exists()


@pytest.mark.parametrize(
    ("kind", "body", "field"),
    [
        ("synthetic", {"per_tflop": "-1", "minimum": "1"}, "per_tflop"),
        ("synthetic", {"per_tflop": "one", "minimum": "1"}, "per_tflop"),
        ("synthetic", {"per_tflop": "1", "minimum": "0.000000001"}, "minimum"),
        ("synthetic", {"minimum": "1"}, "per_tflop"),
        ("synthetic", {"per_tflop": "1", "minimum": "1", "worker": "x"}, "worker"),
        ("asl_training", {"per_tflop": "1", "minimum": "1"}, "kind"),
        ("nosuchkind", {"per_tflop": "1", "minimum": "1"}, "kind"),
    ],
)
def test_a_bad_ask_is_a_400_naming_the_field(
    alice_client: APIClient, rig: Any, kind: str, body: dict[str, str], field: str
) -> None:
    response = alice_client.put(f"/api/v1/workers/{rig.worker.pk}/asks/{kind}/", body, format="json")
    assert response.status_code == 400
    assert field in response.json()
    assert not Ask.objects.exists()


def test_another_providers_node_is_a_404(bob_client: APIClient, anon_client: APIClient, rig: Any) -> None:
    url = f"/api/v1/workers/{rig.worker.pk}/asks/"
    assert bob_client.get(url).status_code == 404
    assert bob_client.put(f"{url}synthetic/", {"per_tflop": "0", "minimum": "1"}, format="json").status_code == 404
    assert bob_client.delete(f"{url}synthetic/").status_code == 404
    assert anon_client.get(url).status_code in (401, 403)
    assert not Ask.objects.exists()


def test_a_node_sets_its_own_asks_all_or_none(rig: Any) -> None:
    node = node_client(rig.token)
    response = node.put(
        "/api/v1/workers/me/asks/",
        [
            {"kind": "synthetic", "per_tflop": "1", "minimum": "0.2"},
            {"kind": "cube_training", "per_tflop": "0.01", "minimum": "0.3"},
        ],
        format="json",
    )
    assert response.status_code == 200, response.content
    assert [row["reference"] for row in response.json()] == [False, False]

    one = node.put("/api/v1/workers/me/asks/", {"kind": "synthetic", "per_tflop": "3", "minimum": "1"}, format="json")
    assert one.status_code == 200
    assert Ask.objects.get(kind="synthetic").per_tflop == 3 * 10**9

    refused = node.put(
        "/api/v1/workers/me/asks/",
        [
            {"kind": "synthetic", "per_tflop": "9", "minimum": "1"},
            {"kind": "cube_training", "per_tflop": "1", "minimum": "0.000000001"},
        ],
        format="json",
    )
    assert refused.status_code == 400
    assert "cube_training:" in refused.json()["minimum"][0]
    assert Ask.objects.get(kind="synthetic").per_tflop == 3 * 10**9  # the first of the list was not kept

    floor = node.put("/api/v1/workers/me/asks/", {"kind": "cube_training", "per_tflop": "0.01"}, format="json")
    assert floor.status_code == 200
    assert Ask.objects.get(kind="cube_training").minimum == pricing.floor_price()

    bad = node.put("/api/v1/workers/me/asks/", [{"kind": "synthetic", "per_tflop": "x", "minimum": "1"}], format="json")
    assert bad.status_code == 400
    assert bad.json()["per_tflop"][0].startswith("item 0: ")
    assert node.put("/api/v1/workers/me/asks/", [], format="json").status_code == 400


def test_a_users_token_cannot_set_a_nodes_asks_as_the_node(alice_client: APIClient, rig: Any) -> None:
    body = {"kind": "synthetic", "per_tflop": "1", "minimum": "1"}
    assert alice_client.put("/api/v1/workers/me/asks/", body, format="json").status_code in (401, 403)
    assert not Ask.objects.exists()
