"""The transaction API takes a signed integer only as a JSON integer.

The signed bytes hold an integer, and the JSON a client sends is what the explorer shows
as signed: ``"1000"``, ``1000.0`` or ``1e3`` for a transaction signed over 1000 was
admitted (DRF's IntegerField reads them all as 1000). Each is now a 400 naming the field,
and nothing is recorded.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from rest_framework.test import APIClient

from ledger.models import Transaction
from protocol import encoding
from tests.ledger.chain import build_chain
from tests.ledger.helpers import signed, submission_json, worker_keys

pytestmark = pytest.mark.django_db

SUBMIT = "/api/v1/ledger/transactions/"
INTEGER_FIELDS = ("amount", "fee", "nonce", "gas_price", "gas_limit")


@pytest.fixture
def transfer(assignments: set) -> dict[str, Any]:
    """A TRANSFER of 1000 base units, validly signed by a funded worker, as the API takes it."""
    chain = build_chain(assignments)
    sub = signed(chain["worker"], encoding.TRANSFER, worker_keys(91).address, 1000, 1, {})
    return submission_json(sub)


def post_raw(client: APIClient, body: dict[str, Any], field: str, json_text: str) -> Any:
    """POST ``body`` with ``field`` written as the JSON text given (``1e3`` has no Python
    form that json.dumps writes back as such)."""
    text = json.dumps({**body, field: "@@"}).replace('"@@"', json_text)
    return client.post(SUBMIT, text, content_type="application/json")


def as_string(value: int) -> str:
    return json.dumps(str(value))


def as_float(value: int) -> str:
    return f"{value}.0"


def as_exponent(value: int) -> str:
    # The same number in exponent notation: 21000 → 2.1e4, 0 → 0e0.
    digits = str(value).rstrip("0") or "0"
    return f"{digits[0]}.{digits[1:] or '0'}e{len(str(value)) - 1}" if value else "0e0"


@pytest.mark.parametrize("field", INTEGER_FIELDS)
@pytest.mark.parametrize("write", [as_string, as_float, as_exponent], ids=["string", "float", "exponent"])
def test_the_signed_value_written_as_another_json_type_is_refused(
    transfer: dict[str, Any], alice_client: APIClient, field: str, write: Any
) -> None:
    """The very value that was signed, as a string, a float or in exponent notation: a
    400 naming the field, and no transaction recorded."""
    value = transfer[field]
    decoded = json.loads(write(value))
    assert decoded == value or decoded == str(value)  # the signed value, another JSON type
    response = post_raw(alice_client, transfer, field, write(value))
    assert response.status_code == 400, response.content
    assert response.json() == {field: ["Expected a JSON integer (not a string, a decimal number, a boolean or null)."]}
    assert not Transaction.objects.filter(recipient=transfer["to"]).exists()


@pytest.mark.parametrize("field", INTEGER_FIELDS)
@pytest.mark.parametrize("json_text", ["true", "false", "null", "-1", "18446744073709551616", "9223372036854775808"])
def test_other_non_uint_values_are_refused(
    transfer: dict[str, Any], alice_client: APIClient, field: str, json_text: str
) -> None:
    """A boolean, null, a negative number or one past a signed 64-bit integer (the encoding's
    range, 0 … 2^63 − 1) is a 400 naming the field, never a 500."""
    response = post_raw(alice_client, transfer, field, json_text)
    assert response.status_code == 400, response.content
    assert list(response.json()) == [field]
    assert not Transaction.objects.filter(recipient=transfer["to"]).exists()


def test_the_same_transfer_as_json_integers_is_admitted(transfer: dict[str, Any], alice_client: APIClient) -> None:
    """What the refusals above leave open: the transfer as signed, every integer an integer."""
    response = alice_client.post(SUBMIT, transfer, format="json")
    assert response.status_code == 202, response.content
    assert response.json()["amount"] == 1000
    assert Transaction.objects.filter(recipient=transfer["to"], status="pending").count() == 1
