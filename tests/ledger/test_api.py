"""Ledger REST API: explorer reads, proofs verified offline, wallet, signed submissions."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import uuid
from typing import Any

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from ledger import custody, gas, services
from ledger.mempool import admit
from ledger.models import Block, Transaction
from ledger.proofcheck import verify_proof
from ledger.proofs import build_proof
from ledger.sealer import seal_block
from protocol import encoding
from tests.factories import UserFactory
from tests.ledger.chain import build_chain
from tests.ledger.helpers import CREDIT, signed, submission_json, submit_result, worker_keys

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
    assert body["checks"] == {
        "header": True,
        "signature": True,
        "tx_hash": True,
        "tx_signature": True,
        "tx_inclusion": True,
        "compute_inclusion": True,
        "compute_binding": True,
    }
    proof = body["proof"]
    assert proof["version"] == 2
    assert proof["transaction"]["from"] == chain["worker"].address
    assert proof["block"]["height"] == 2
    assert proof["tx_inclusion"]["leaf_index"] == 3
    assert proof["compute_inclusion"]["compute_result"]["worker_address"] == chain["worker"].address
    # The offline check needs only the JSON and the validator's public key.
    validator = custody.validator_keys().public_key
    assert all(verify_proof(proof, validator).values())
    assert not all(verify_proof(proof, worker_keys(1).public_key).values())
    # With a trailing slash, as every other ledger URL: sent on to the same proof.
    slashed = anon_client.get(f"/api/v1/ledger/transactions/{chain['result_hash']}/proof/", follow=True)
    assert slashed.json() == body
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


def test_a_proof_binds_the_transaction_and_its_own_compute_result(anon_client: APIClient, assignments: set) -> None:
    """The proof carries the signed fields, so what it says the transaction is, it is; and
    a SUBMIT_RESULT's ComputeResult must be the one in its payload: the leaf, position
    and path of another result sealed in the same block (all genuinely under
    compute_root) do not pass for this transaction's result."""
    workers = [worker_keys(200), worker_keys(201)]
    payer: Any = UserFactory(username="payer")
    services.deposit(payer, CREDIT, "d-payer")
    for i, worker in enumerate(workers):  # a worker's account exists once it was paid
        services.transfer(payer, worker.address, CREDIT // 4, f"t-payer-{i}")
    seal_block()
    hashes = []
    for worker in workers:
        task = uuid.uuid4()
        assignments.add((task, worker.address))
        (row,) = admit([submit_result(worker, 0, task)])
        assert row.status == "pending", row.reason_detail
        hashes.append(row.hash)
    seal_block()
    validator = custody.validator_keys().public_key
    mine, other = (anon_client.get(f"/api/v1/ledger/transactions/{h}/proof").json()["proof"] for h in hashes)
    assert all(verify_proof(mine, validator).values())
    assert mine["compute_inclusion"]["leaf_index"] != other["compute_inclusion"]["leaf_index"]

    swapped = copy.deepcopy(mine)
    swapped["compute_inclusion"] = other["compute_inclusion"]
    checks = verify_proof(swapped, validator)
    assert checks["compute_inclusion"] is True  # the other result is under the root...
    assert checks["compute_binding"] is False  # ...but it is not this transaction's

    for field, value in [("type", "TRANSFER"), ("amount", 5), ("to", workers[1].address), ("payload", {})]:
        tampered = copy.deepcopy(mine)
        tampered["transaction"][field] = value
        assert verify_proof(tampered, validator).get("tx_hash") is False, field
    # A transaction re-signed by another key under its hash's leaf: not the sender's.
    resigned = copy.deepcopy(mine)
    resigned["transaction"]["public_key"] = workers[1].public_key.hex()
    checks = verify_proof(resigned, validator)
    assert checks["tx_hash"] is False
    assert checks["tx_signature"] is False
    # A field of the wrong type is a malformed proof, not an exception.
    malformed = copy.deepcopy(mine)
    malformed["transaction"]["amount"] = "0"
    assert verify_proof(malformed, validator) == {"header": True, "signature": True, "well_formed": False}


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
    submit_fee = gas.fee_for(encoding.SUBMIT_RESULT, settings.LEDGER_GAS_PRICE)
    assert tx["fee"] == submit_fee
    worker = anon_client.get(f"/api/v1/ledger/accounts/{chain['worker'].address}/").json()
    assert worker["kind"] == "worker"
    assert worker["balance"] == 3 * CREDIT * 95 // 100 - submit_fee
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
    # The same in credits, as decimal strings like the rest of the API.
    assert (body["balance_credits"], body["escrowed_credits"]) == ("17", "0")
    assert body["sealed_balance_credits"] == str(body["sealed_balance"] // CREDIT)
    assert [t["type"] for t in body["transactions"]][:2] == ["ESCROW_RELEASE", "ESCROW_LOCK"]
    assert anon_client.get("/api/v1/ledger/wallet/").status_code in (401, 403)


def test_submitting_a_signed_transfer(chain: dict[str, Any], alice_client: APIClient) -> None:
    worker = chain["worker"]
    sub = signed(worker, encoding.TRANSFER, worker_keys(77).address, 1000, 1, {})
    body = submission_json(sub)
    memo = alice_client.post("/api/v1/ledger/transactions/", {**body, "memo": "for lunch"}, format="json")
    assert memo.status_code == 400  # not signed, not kept: refused, not dropped
    assert memo.json() == {"memo": ["Unknown field."]}
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


@pytest.mark.parametrize("fmt", ["multipart", "form"])
def test_a_transaction_is_submitted_as_json_only(chain: dict[str, Any], alice_client: APIClient, fmt: str) -> None:
    """A form cannot carry the payload object: DRF read a form's payload as absent, so a
    signed payload silently became {}. The answer says to send JSON."""
    worker = chain["worker"]
    body = submission_json(signed(worker, encoding.TRANSFER, worker_keys(78).address, 1000, 1, {}))
    del body["payload"]  # a form has no object to put there
    if fmt == "multipart":
        res = alice_client.post("/api/v1/ledger/transactions/", body, format="multipart")
    else:
        form = "&".join(f"{key}={value}" for key, value in body.items())
        res = alice_client.post("/api/v1/ledger/transactions/", form, content_type="application/x-www-form-urlencoded")
    assert res.status_code == 415
    assert "Unsupported media type" in res.json()["detail"]
    assert not Transaction.objects.filter(recipient=worker_keys(78).address).exists()


def test_the_offline_verifier_needs_no_django() -> None:
    import subprocess
    import sys

    code = "import sys, ledger.proofcheck; assert 'django' not in sys.modules, 'imports Django'"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


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
    res = alice_client.post("/api/v1/ledger/transactions/", submission_json(sub), format="json")
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
    res = alice_client.post("/api/v1/ledger/transactions/", submission_json(sub), format="json")
    assert res.status_code == 400
    assert "verified payment" in res.json()["type"][0]
    assert services.balance(alice) == balance
    assert services.next_nonce(treasury.address) == nonce


def test_an_unknown_type_is_named(chain: dict[str, Any], alice_client: APIClient) -> None:
    sub = signed(chain["worker"], encoding.TRANSFER, worker_keys(77).address, 1000, 1, {})
    res = alice_client.post("/api/v1/ledger/transactions/", {**submission_json(sub), "type": "MINT"}, format="json")
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
    body = {**submission_json(sub), "payload": {"memo": "a\x00b"}}
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
        body = submission_json(signed(worker, encoding.TRANSFER, worker_keys(77).address, 1000, 1, {}))
        bad = {**body, "amount": 2000}  # signature no longer matches: refused, and stored
        codes = [alice_client.post("/api/v1/ledger/transactions/", bad, format="json").status_code for _ in range(61)]
        assert codes[:60] == [400] * 60
        assert codes[60] == 429
        stored = Transaction.objects.filter(status="refused").count()
        assert alice_client.post("/api/v1/ledger/transactions/", body, format="json").status_code == 429
        assert Transaction.objects.filter(status="refused").count() == stored
    finally:
        cache.clear()


def _rfc6962_root(leaves: list[bytes]) -> bytes:
    """MTH(D[n]) exactly as RFC 6962 §2.1 writes it (recursive), independent of protocol.merkle."""
    if not leaves:
        return hashlib.sha256(b"").digest()
    if len(leaves) == 1:
        return hashlib.sha256(b"\x00" + leaves[0]).digest()
    k = 1 << ((len(leaves) - 1).bit_length() - 1)
    return hashlib.sha256(b"\x01" + _rfc6962_root(leaves[:k]) + _rfc6962_root(leaves[k:])).digest()


def _rfc6962_path(m: int, leaves: list[bytes]) -> list[bytes]:
    """PATH(m, D[n]) of RFC 6962 §2.1.1."""
    if len(leaves) == 1:
        return []
    k = 1 << ((len(leaves) - 1).bit_length() - 1)
    if m < k:
        return [*_rfc6962_path(m, leaves[:k]), _rfc6962_root(leaves[k:])]
    return [*_rfc6962_path(m - k, leaves[k:]), _rfc6962_root(leaves[:k])]


@pytest.mark.parametrize("n", [1, 3, 5, 6])
def test_served_proofs_match_an_independent_rfc6962_implementation(
    anon_client: APIClient, assignments: set, n: int
) -> None:
    """Blocks of 2n transfers and deposits, then n SUBMIT_RESULTs (a single-transaction
    block for n = 1, odd sizes otherwise): every leaf's served path, first and last
    included, is RFC 6962's, and both roots are the block's."""
    for i in range(n):
        user: Any = UserFactory(username=f"user{i}")
        services.deposit(user, CREDIT, f"d{i}")
        services.transfer(user, worker_keys(100 + i).address, CREDIT // 2, f"t{i}")
    seal_block()
    for i in range(n):
        worker, task = worker_keys(100 + i), uuid.uuid4()
        assignments.add((task, worker.address))
        (row,) = admit([submit_result(worker, 0, task)])
        assert row.status == "pending", row.reason_detail
    seal_block()
    for block in Block.objects.filter(height__gt=0):
        txs = list(block.transactions.order_by("index_in_block"))
        leaves = [bytes.fromhex(t.hash) + bytes.fromhex(t.signature) for t in txs]
        assert _rfc6962_root(leaves).hex() == block.tx_root
        results = [t for t in txs if t.type == encoding.SUBMIT_RESULT]
        for position, t in enumerate(txs):
            body = anon_client.get(f"/api/v1/ledger/transactions/{t.hash}/proof").json()
            assert body["verified"] is True, body["checks"]
            inclusion = body["proof"]["tx_inclusion"]
            assert (inclusion["leaf_index"], inclusion["tree_size"]) == (position, len(txs))
            assert inclusion["audit_path"] == [p.hex() for p in _rfc6962_path(position, leaves)]
            if t.type == encoding.SUBMIT_RESULT:
                compute = body["proof"]["compute_inclusion"]
                compute_leaves = [encoding.parse_compute_result(r.payload["compute_result"]).leaf() for r in results]
                assert compute["leaf"] == compute_leaves[results.index(t)].hex()
                assert _rfc6962_root(compute_leaves).hex() == block.compute_root
                expected = _rfc6962_path(results.index(t), compute_leaves)
                assert compute["audit_path"] == [p.hex() for p in expected]


def test_a_proof_of_a_block_the_platform_did_not_sign_is_not_shown_as_verified(
    chain: dict[str, Any], anon_client: APIClient, client: Any
) -> None:
    """A block re-signed with another key (its header otherwise intact) must not get
    the explorer's "proof verified": a client pins the validator's key, so must we."""
    forger = worker_keys(9)
    block = Block.objects.get(height=2)
    header = dataclasses.replace(block.header(), proposer=forger.address, proposer_key=forger.public_key)
    message = header.encode()
    Block.objects.filter(pk=block.pk).update(
        proposer=forger.address,
        proposer_key=forger.public_key.hex(),
        hash=hashlib.sha256(message).hexdigest(),
        signature=forger.sign(message).hex(),
    )
    body = anon_client.get(f"/api/v1/ledger/transactions/{chain['result_hash']}/proof").json()
    assert body["checks"]["signature"] is False
    assert body["verified"] is False
    page = client.get(f"/explorer/tx/{chain['result_hash']}/").content.decode()
    assert "Sealed · proof does NOT verify" in page


def test_the_offline_verifier_refuses_an_infinite_number_without_raising(chain: dict[str, Any]) -> None:
    """JSON parsers turn 1e999 into infinity: a hostile proof is "not verified", not a crash."""
    served = build_proof(Transaction.objects.get(hash=chain["result_hash"]))
    assert served is not None
    text = json.dumps(served).replace(f'"timestamp_us": {served["block"]["timestamp_us"]}', '"timestamp_us": 1e999')
    checks = verify_proof(json.loads(text), custody.validator_keys().public_key)
    assert checks == {"well_formed": False}


def _upper_sender(pair: Any, to: str) -> Any:
    """A transfer signed by ``pair`` whose ``from`` is its address in upper case."""
    sub = signed(pair, encoding.TRANSFER, to, 1000, 1, {})
    tx = dataclasses.replace(sub.tx, sender=pair.address.upper())
    return dataclasses.replace(sub, tx=tx, signature=pair.sign(tx.encode()))


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda w, to: signed(w, encoding.TRANSFER, to.upper(), 1000, 1, {}), "to"),
        (_upper_sender, "from"),
        (lambda w, to: signed(w, encoding.TRANSFER, to, 1000, 1, {}, gas_price=1), "gas_price"),
    ],
)
def test_a_refused_submission_names_the_field_at_fault(
    chain: dict[str, Any], alice_client: APIClient, build: Any, field: str
) -> None:
    """Addresses are signed in lower case and gas is priced at the chain's minimum: the
    400 names the field the sender must change, as every other refusal does."""
    sub = build(chain["worker"], worker_keys(77).address)
    res = alice_client.post("/api/v1/ledger/transactions/", submission_json(sub), format="json")
    assert res.status_code == 400
    body = res.json()
    assert set(body) == {field, "code"}, body
