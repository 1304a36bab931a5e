"""``?ordering`` on the REST API: a view orders by the fields it names and nothing else,
and a term it does not take is a 400 naming ``ordering`` and the allowed fields."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from ledger import services as ledger
from ledger.sealer import ensure_genesis, seal_block
from tests.factories import post_task

pytestmark = pytest.mark.django_db

BLOCKS = "/api/v1/ledger/blocks/"
TASKS = "/api/v1/tasks/"


@pytest.fixture
def blocks(alice: Any) -> list[int]:
    """Heights of three blocks: genesis and two with alice's deposits."""
    ensure_genesis()
    seal_block()
    ledger.deposit(alice, 10, "ordering-2")
    seal_block()
    return [0, 1, 2]


def heights(client: APIClient, url: str) -> list[int]:
    response = client.get(url)
    assert response.status_code == 200, response.content
    return [b["height"] for b in response.json()["results"]]


def test_an_allowed_ordering_orders_the_list(blocks: list[int], anon_client: APIClient) -> None:
    assert heights(anon_client, BLOCKS) == blocks[::-1]  # the view's own: newest first
    assert heights(anon_client, f"{BLOCKS}?ordering=height") == blocks
    assert heights(anon_client, f"{BLOCKS}?ordering=-height") == blocks[::-1]
    assert heights(anon_client, f"{BLOCKS}?ordering=") == blocks[::-1]  # none asked: the default


def test_an_allowed_ordering_of_ones_own_rows(alice: Any, alice_client: APIClient) -> None:
    cheap, dear = post_task(alice, budget=3 * 10**9), post_task(alice, budget=7 * 10**9)
    response = alice_client.get(f"{TASKS}?ordering=-budget,created_at")
    assert response.status_code == 200
    assert [t["id"] for t in response.json()["results"]] == [str(dear.pk), str(cheap.pk)]


@pytest.mark.parametrize("term", ["hash", "tx_root", "-timestamp", "height,hash", "--height", "height__gt", "pk"])
def test_a_column_the_list_does_not_take_is_a_400_naming_the_allowed_ones(
    blocks: list[int], anon_client: APIClient, term: str
) -> None:
    response = anon_client.get(BLOCKS, {"ordering": term})
    assert response.status_code == 400
    body = response.json()
    assert list(body) == ["ordering"]
    (message,) = body["ordering"]
    refused = [t for t in term.split(",") if t.removeprefix("-") != "height"]
    assert (
        message
        == f"Not an ordering of this list: {', '.join(refused)}; allowed: height (a leading '-' for descending)."
    )


def test_an_unknown_ordering_of_ones_own_rows_is_a_400_too(alice: Any, alice_client: APIClient) -> None:
    post_task(alice)
    response = alice_client.get(f"{TASKS}?ordering=owner__password")
    assert response.status_code == 400
    (message,) = response.json()["ordering"]
    assert "owner__password" in message
    assert "allowed: created_at, budget, status, progress" in message


@pytest.mark.parametrize(
    "url", ["/api/v1/ledger/blocks/{height}/transactions/", "/api/v1/ledger/accounts/{address}/transactions/"]
)
def test_a_list_that_names_no_ordering_fields_takes_no_ordering(
    blocks: list[int], alice: Any, anon_client: APIClient, url: str
) -> None:
    address = ledger.ensure_user_account(alice).address
    url = url.format(height=blocks[-1], address=address)
    assert anon_client.get(url).status_code == 200
    for term in ("id", "-id", "amount"):
        response = anon_client.get(url, {"ordering": term})
        assert response.status_code == 400, (term, response.content)
        assert response.json() == {"ordering": [f"This list takes no ordering ({term}); allowed: none."]}


def test_the_schema_lists_each_lists_orderings() -> None:
    from drf_spectacular.generators import SchemaGenerator

    paths = SchemaGenerator().get_schema(request=None, public=True)["paths"]

    def ordering(path: str) -> dict[str, Any] | None:
        found = [p for p in paths[path]["get"]["parameters"] if p["name"] == "ordering"]
        return found[0] if found else None

    blocks = ordering("/api/v1/ledger/blocks/")
    assert blocks is not None
    assert blocks["schema"]["items"]["enum"] == ["height", "-height"]
    assert ordering("/api/v1/tasks/") is not None
    assert ordering("/api/v1/ledger/accounts/{address}/transactions/") is None
