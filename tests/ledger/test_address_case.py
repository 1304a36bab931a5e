"""An address is accepted all in lower case or all in upper case, never mixed (BIP-173).

A mixed-case string is not another spelling of the address: BIP-173 decoders must refuse
it, so the explorer's search box, its address page and the API's address lookups do, with
a message saying why (and never a 500).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from tests.ledger.chain import build_chain
from tests.ledger.helpers import worker_keys

pytestmark = pytest.mark.django_db

MIXED_MESSAGE = "The address mixes upper and lower case; write it all in lower case (or all in upper)."


@pytest.fixture
def address(assignments: set) -> str:
    """A worker's address the ledger has seen (lower case, as the chain writes it)."""
    worker = build_chain(assignments)["worker"]
    return str(worker.address)


def mixed(address: str) -> list[str]:
    """Two mixed-case spellings of ``address``: an upper-case prefix on a lower-case body,
    and one capital letter in the body."""
    i = next(i for i, c in enumerate(address) if i > 4 and c.isalpha())
    out = ["CPC1" + address[4:], address[:i] + address[i].upper() + address[i + 1 :]]
    assert all(m.lower() == address and m not in (address, address.upper()) for m in out)
    return out


def test_search_opens_an_address_written_all_lower_or_all_upper(address: str, client: Client) -> None:
    for query in (address, address.upper(), f"  {address.upper()} "):
        response = client.get("/explorer/search/", {"q": query})
        assert response.status_code == 302, query
        assert response["Location"] == f"/explorer/address/{address}/"


def test_search_refuses_a_mixed_case_address_and_says_why(address: str, client: Client) -> None:
    for query in mixed(address):
        response = client.get("/explorer/search/", {"q": query})
        assert response.status_code == 200, query  # the search page, searching again; not a redirect
        text = response.content.decode()
        assert f"Not an address: {MIXED_MESSAGE.rstrip('.')}." in text
        assert f"/explorer/address/{address}/" not in text


def test_the_address_page_refuses_mixed_case(address: str, client: Client) -> None:
    assert client.get(f"/explorer/address/{address}/").status_code == 200
    assert client.get(f"/explorer/address/{address.upper()}/").status_code == 200
    for form in mixed(address):
        response = client.get(f"/explorer/address/{form}/")
        assert response.status_code == 400
        assert MIXED_MESSAGE in response.content.decode()


@pytest.mark.parametrize("suffix", ["", "transactions/"])
def test_the_api_address_lookups_refuse_mixed_case(address: str, anon_client: APIClient, suffix: str) -> None:
    for form in (address, address.upper()):
        response = anon_client.get(f"/api/v1/ledger/accounts/{form}/{suffix}")
        assert response.status_code == 200, (form, response.content)
    for form in mixed(address):
        response = anon_client.get(f"/api/v1/ledger/accounts/{form}/{suffix}")
        assert response.status_code == 400
        assert response.json() == {"address": [MIXED_MESSAGE]}


def test_a_transaction_to_a_mixed_case_address_is_refused_naming_the_field(
    address: str, alice_client: APIClient
) -> None:
    """Checked before the signature: whatever was signed, a mixed-case ``to`` is no address."""
    (form, *_) = mixed(worker_keys(93).address)
    body: dict[str, Any] = {
        "chain_id": "proofwork-dev-1",
        "type": "TRANSFER",
        "from": address,
        "to": form,
        "amount": 1,
        "fee": 21_000_000,
        "nonce": 1,
        "gas_price": 1_000,
        "gas_limit": 21_000,
        "payload": {},
        "public_key": "00" * 32,
        "signature": "00" * 64,
    }
    response = alice_client.post("/api/v1/ledger/transactions/", body, format="json")
    assert response.status_code == 400
    assert response.json() == {"to": [MIXED_MESSAGE]}
