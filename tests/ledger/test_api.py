"""Ledger REST API: explorer reads, proofs verified offline, wallet, signed submissions."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from rest_framework.test import APIClient

from ledger import custody, encoding, services
from ledger.models import Transaction
from ledger.proofcheck import verify_proof
from ledger.sealer import seal_block
from tests.ledger.chain import build_chain
from tests.ledger.helpers import CREDIT, signed, worker_keys

pytestmark = pytest.mark.django_db


@pytest.fixture
def chain(assignments: set) -> dict[str, Any]:
    return build_chain(assignments)


def test_latest_blocks_are_public_newest_first(chain: dict[str, Any], anon_client: APIClient) -> None:
    res = anon_client.get("/api/v1/ledger/blocks/")
    assert res.status_code == 200
    heights = [b["height"] for b in res.json()["results"]]
    assert heights == [3, 2, 1, 0]
    detail = anon_client.get("/api/v1/ledger/blocks/2/").json()
    assert [t["type"] for t in detail["transactions"]] == ["ESCROW_LOCK", "ESCROW_RELEASE", "FEE", "SUBMIT_RESULT"]
    assert detail["transactions"][1]["to"] == chain["worker"].address
    assert anon_client.get("/api/v1/ledger/blocks/99/").status_code == 404


def test_proof_of_a_submit_result_verifies_offline(chain: dict[str, Any], anon_client: APIClient) -> None:
    res = anon_client.get(f"/api/v1/ledger/transactions/{chain['result_hash']}/proof")
    assert res.status_code == 200
    body = res.json()
    assert body["verified"] is True
    assert body["checks"] == {"header": True, "signature": True, "tx_inclusion": True, "compute_inclusion": True}
    proof = body["proof"]
    assert proof["block"]["height"] == 2
    assert proof["tx_inclusion"]["leaf_index"] == 3
    assert proof["compute_inclusion"]["compute_result"]["worker_address"] == chain["worker"].address
    # The offline check needs only the JSON and the validator's public key.
    validator = custody.validator_keys().public_key
    assert all(verify_proof(proof, validator).values())
    assert not all(verify_proof(proof, worker_keys(1).public_key).values())
    for path, value in [
        (("transaction", "hash"), "00" * 32),
        (("block", "tx_root"), "11" * 32),
        (("block", "compute_root"), "22" * 32),
        (("block", "timestamp_us"), 1),
        (("tx_inclusion", "leaf_index"), 2),
    ]:
        tampered = copy.deepcopy(proof)
        tampered[path[0]][path[1]] = value
        assert not all(verify_proof(tampered, validator).values()), path
    tampered = copy.deepcopy(proof)
    tampered["compute_inclusion"]["compute_result"]["result_hash"] = "ee" * 32
    assert verify_proof(tampered, validator)["compute_inclusion"] is False


def test_proof_of_a_pending_transaction_is_a_409(chain: dict[str, Any], anon_client: APIClient) -> None:
    pending = services.deposit(chain["bob"], CREDIT, "d-bob-2")
    res = anon_client.get(f"/api/v1/ledger/transactions/{pending.hash}/proof")
    assert res.status_code == 409
    assert res.json()["code"] == "pending"
    assert anon_client.get("/api/v1/ledger/transactions/nothing/proof").status_code == 404


def test_transaction_and_account_detail(chain: dict[str, Any], anon_client: APIClient) -> None:
    tx = anon_client.get(f"/api/v1/ledger/transactions/{chain['result_hash']}/").json()
    assert tx["status"] == "sealed"
    assert tx["block_height"] == 2
    assert tx["fee"] == 80_000_000
    worker = anon_client.get(f"/api/v1/ledger/accounts/{chain['worker'].address}/").json()
    assert worker["kind"] == "worker"
    assert worker["balance"] == 3 * CREDIT * 95 // 100 - 80_000_000
    assert {t["type"] for t in worker["transactions"]} == {"ESCROW_RELEASE", "SUBMIT_RESULT"}
    bad = anon_client.get("/api/v1/ledger/accounts/cpc1qqqqqqqq/")
    assert bad.status_code == 400
    assert "address" in bad.json()


def test_wallet_shows_balance_escrow_and_history(chain: dict[str, Any], anon_client: APIClient) -> None:
    client = APIClient()
    client.force_authenticate(chain["alice"])
    body = client.get("/api/v1/ledger/wallet/").json()
    assert body["balance"] == 20 * CREDIT - 3 * CREDIT
    assert body["escrowed"] == 0
    assert [t["type"] for t in body["transactions"]][:2] == ["ESCROW_RELEASE", "ESCROW_LOCK"]
    assert anon_client.get("/api/v1/ledger/wallet/").status_code in (401, 403)


def tx_body(sub: Any) -> dict[str, Any]:
    """A signed transaction as the submission endpoint takes it."""
    return {
        "chain_id": sub.tx.chain_id,
        "type": sub.tx.type,
        "from": sub.tx.sender,
        "to": sub.tx.recipient,
        "amount": sub.tx.amount,
        "fee": sub.tx.fee,
        "nonce": sub.tx.nonce,
        "gas_price": sub.tx.gas_price,
        "gas_limit": sub.tx.gas_limit,
        "payload": sub.tx.payload,
        "public_key": sub.tx.public_key.hex(),
        "signature": sub.signature.hex(),
    }


def test_submitting_a_signed_transfer(chain: dict[str, Any], alice_client: APIClient) -> None:
    worker = chain["worker"]
    sub = signed(worker, encoding.TRANSFER, worker_keys(77).address, 1000, 1, {})
    body = tx_body(sub)
    res = alice_client.post("/api/v1/ledger/transactions/", body, format="json")
    assert res.status_code == 202, res.json()
    assert res.json()["status"] == "pending"
    again = alice_client.post("/api/v1/ledger/transactions/", body, format="json")
    assert again.status_code == 202  # the same signed transaction: idempotent
    replay = alice_client.post("/api/v1/ledger/transactions/", {**body, "amount": 2000}, format="json")
    assert replay.status_code == 400
    assert replay.json()["code"] == "bad_signature"
    assert "signature" in replay.json()
    bad = alice_client.post("/api/v1/ledger/transactions/", {**body, "from": "cpc1xyz", "amount": -1}, format="json")
    assert bad.status_code == 400
    assert {"from", "amount"} <= set(bad.json())
    seal_block()


def test_the_offline_verifier_needs_no_django() -> None:
    import subprocess
    import sys

    code = "import sys, ledger.proofcheck; assert 'django' not in sys.modules, 'imports Django'"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def _body(sub: Any) -> dict[str, Any]:
    return {
        "chain_id": sub.tx.chain_id,
        "type": sub.tx.type,
        "from": sub.tx.sender,
        "to": sub.tx.recipient,
        "amount": sub.tx.amount,
        "fee": sub.tx.fee,
        "nonce": sub.tx.nonce,
        "gas_price": sub.tx.gas_price,
        "gas_limit": sub.tx.gas_limit,
        "payload": dict(sub.tx.payload),
        "public_key": sub.tx.public_key.hex(),
        "signature": sub.signature.hex(),
    }


PLATFORM_ONLY = [t for t in encoding.TX_TYPES if t != encoding.TRANSFER]


@pytest.mark.parametrize("tx_type", PLATFORM_ONLY)
def test_only_transfers_may_be_submitted(chain: dict[str, Any], alice_client: APIClient, tx_type: str) -> None:
    """Every other type has its own path, which checks what the ledger cannot (a paid
    invoice, an approved payout, a verified result): a signed one is refused here."""
    worker = chain["worker"]
    treasury = custody.treasury_keys()
    signer = treasury if tx_type == encoding.DEPOSIT else worker
    sub = signed(signer, tx_type, worker_keys(78).address, CREDIT, 0, {})
    before = list(Transaction.objects.values_list("hash", flat=True))
    res = alice_client.post("/api/v1/ledger/transactions/", _body(sub), format="json")
    assert res.status_code == 400
    message = res.json()["type"][0]
    assert message.startswith(f"A {tx_type} cannot be submitted here: ")
    assert message.endswith("Only TRANSFER can.")
    assert list(Transaction.objects.values_list("hash", flat=True)) == before


def test_a_platform_deposit_signed_by_the_treasury_is_refused_and_credits_nothing(
    chain: dict[str, Any], alice: Any, alice_client: APIClient
) -> None:
    """Even the treasury's own valid signature does not make this endpoint a mint."""
    me = services.ensure_user_account(alice)
    treasury = custody.treasury_keys()
    nonce = services.next_nonce(treasury.address)
    sub = signed(treasury, encoding.DEPOSIT, me.address, 1000 * CREDIT, nonce, {"reference": "x"})
    balance = services.balance(alice)
    res = alice_client.post("/api/v1/ledger/transactions/", _body(sub), format="json")
    assert res.status_code == 400
    assert "verified payment" in res.json()["type"][0]
    assert services.balance(alice) == balance
    assert services.next_nonce(treasury.address) == nonce


def test_an_unknown_type_is_named(chain: dict[str, Any], alice_client: APIClient) -> None:
    sub = signed(chain["worker"], encoding.TRANSFER, worker_keys(77).address, 1000, 1, {})
    res = alice_client.post("/api/v1/ledger/transactions/", {**_body(sub), "type": "MINT"}, format="json")
    assert res.status_code == 400
    assert "type" in res.json()


def test_every_platform_type_says_where_it_goes() -> None:
    from ledger.api.serializers import PLATFORM_PATHS, SUBMITTABLE_TYPES

    assert set(PLATFORM_PATHS) | SUBMITTABLE_TYPES == set(encoding.TX_TYPES)


@pytest.mark.parametrize("bad", ["%00", "a%00" + "b" * 62, "zz", "a" * 65])
def test_a_malformed_transaction_hash_is_a_404_without_a_lookup(anon_client: APIClient, client: Any, bad: str) -> None:
    # PostgreSQL refuses a NUL in a text parameter: the lookup itself was a 500.
    assert anon_client.get(f"/api/v1/ledger/transactions/{bad}/").status_code == 404
    assert anon_client.get(f"/api/v1/ledger/transactions/{bad}/proof").status_code == 404
    assert client.get(f"/explorer/tx/{bad}/").status_code == 404


def test_a_payload_no_column_can_hold_is_a_400_and_records_nothing(alice_client: APIClient) -> None:
    # The mempool keeps refused transactions as rows; a NUL in the payload made that
    # insert a 500 on PostgreSQL's jsonb.
    pair = worker_keys(5)
    sub = signed(pair, encoding.TRANSFER, worker_keys(6).address, 1, 0, {})
    body = {**tx_body(sub), "payload": {"memo": "a\x00b"}}
    before = Transaction.objects.count()
    response = alice_client.post("/api/v1/ledger/transactions/", body, format="json")
    assert response.status_code == 400
    assert response.json() == {"payload": {"memo": ["Null characters are not allowed."]}}
    assert Transaction.objects.count() == before


def test_a_client_looping_on_submissions_is_throttled(
    chain: dict[str, Any], alice_client: APIClient, settings: Any
) -> None:
    from django.core.cache import cache

    from ledger.models import Transaction

    cache.clear()  # throttle history lives in the cache
    try:
        worker = chain["worker"]
        body = tx_body(signed(worker, encoding.TRANSFER, worker_keys(77).address, 1000, 1, {}))
        bad = {**body, "amount": 2000}  # signature no longer matches: refused, and stored
        codes = [alice_client.post("/api/v1/ledger/transactions/", bad, format="json").status_code for _ in range(61)]
        assert codes[:60] == [400] * 60
        assert codes[60] == 429
        stored = Transaction.objects.filter(status="refused").count()
        assert alice_client.post("/api/v1/ledger/transactions/", body, format="json").status_code == 429
        assert Transaction.objects.filter(status="refused").count() == stored
    finally:
        cache.clear()
