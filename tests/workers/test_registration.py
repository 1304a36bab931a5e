"""Worker identity: one-time tokens, proof of key possession, idempotence, ownership."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from ledger.models import Transaction
from protocol import keys
from protocol.wire import registration_message, sign_template
from tests.form_nonces import submit
from workers.identity import services
from workers.models import RegistrationToken, Worker

CAPS = {"cpu_cores": 2, "ram_bytes": 8 * 2**30, "kinds": ["synthetic"], "agent_version": "test"}


def register(
    client, raw_token: str, key: keys.KeyPair, *, caps=CAPS, sign_with: keys.KeyPair | None = None, fmt: str = "json"
):
    """Register ``key`` with the token, as the agent does (``fmt="multipart"``: as a form
    would, with the capabilities as JSON text; non-ASCII is escaped as ``json.dumps`` does)."""
    pub = key.public_key.hex()
    response = client.post("/api/v1/workers/challenge/", {"registration_token": raw_token, "public_key": pub})
    assert response.status_code == 200, response.json()
    signer = sign_with or key
    signature = signer.sign(registration_message(response.json()["challenge"], pub)).hex()
    tx_signature = sign_template(response.json()["register_tx"], key).hex()
    return client.post(
        "/api/v1/workers/register/",
        {
            "registration_token": raw_token,
            "public_key": pub,
            "signature": signature,
            "capabilities": caps if fmt == "json" else json.dumps(caps),
            "register_tx_signature": tx_signature,
        },
        format=fmt,
    )


@pytest.fixture
def alice_reg_token(alice_client) -> str:
    response = alice_client.post("/api/v1/workers/registration-tokens/")
    assert response.status_code == 201
    return response.json()["token"]


@pytest.mark.django_db
def test_a_provider_registers_a_node_by_signing_the_challenge(alice, alice_reg_token, anon_client) -> None:
    key = keys.generate()
    response = register(anon_client, alice_reg_token, key)
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["address"] == key.address
    assert body["created"] is True
    assert body["token"].startswith("pww_")
    worker = Worker.objects.get(address=key.address)
    assert worker.owner == alice
    assert worker.capabilities["kinds"] == ["synthetic"]
    assert worker.token_hash != body["token"]  # only the hash is stored
    assert services.authenticate_worker(body["token"]) == worker
    # The node's own signed REGISTER_WORKER is in the mempool, waiting for a block.
    tx = Transaction.objects.get(type="REGISTER_WORKER", sender=key.address)
    assert tx.status == "pending"
    assert tx.public_key == key.public_key.hex()
    # The node's own signed REGISTER_WORKER is in the mempool, waiting for a block.
    tx = Transaction.objects.get(type="REGISTER_WORKER", sender=key.address)
    assert tx.status == "pending"
    assert tx.public_key == key.public_key.hex()


@pytest.mark.django_db
def test_a_registration_token_is_stored_hashed_and_works_once(alice, alice_reg_token, anon_client) -> None:
    assert not RegistrationToken.objects.filter(token_hash=alice_reg_token).exists()
    assert register(anon_client, alice_reg_token, keys.generate()).status_code == 201
    response = anon_client.post(
        "/api/v1/workers/challenge/", {"registration_token": alice_reg_token, "public_key": "ab" * 32}
    )
    assert response.status_code == 400
    assert "already used" in response.json()["registration_token"][0]


@pytest.mark.django_db
def test_an_expired_token_is_refused(alice, alice_reg_token, anon_client) -> None:
    RegistrationToken.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    response = anon_client.post(
        "/api/v1/workers/challenge/", {"registration_token": alice_reg_token, "public_key": "ab" * 32}
    )
    assert response.status_code == 400
    assert "expired" in response.json()["registration_token"][0]


@pytest.mark.django_db
def test_a_signature_by_another_key_is_refused(alice, alice_reg_token, anon_client) -> None:
    response = register(anon_client, alice_reg_token, keys.generate(), sign_with=keys.generate())
    assert response.status_code == 400
    assert "signature" in response.json()
    assert not Worker.objects.exists()


@pytest.mark.django_db
def test_registering_the_same_key_again_is_idempotent(alice, alice_client, alice_reg_token, anon_client) -> None:
    key = keys.generate()
    first = register(anon_client, alice_reg_token, key).json()
    second_token = alice_client.post("/api/v1/workers/registration-tokens/").json()["token"]
    response = register(anon_client, second_token, key)
    assert response.status_code == 200
    assert response.json()["id"] == first["id"]
    assert response.json()["created"] is False
    assert Worker.objects.count() == 1
    # The new API token replaces the old one.
    assert services.authenticate_worker(first["token"]) is None
    assert services.authenticate_worker(response.json()["token"]) is not None


@pytest.mark.django_db
def test_an_agent_that_lists_no_features_runs_what_old_agents_ran(
    alice, alice_client, alice_reg_token, anon_client
) -> None:
    # Agents before 0.2.0 sent no "features": they draw synthetic matrices with SHAKE128.
    key = keys.generate()
    register(anon_client, alice_reg_token, key)
    assert Worker.objects.get().capabilities["features"] == ["poc:shake128"]
    # The upgraded agent registers the same key again and lists what it offers now.
    again = alice_client.post("/api/v1/workers/registration-tokens/").json()["token"]
    register(anon_client, again, key, caps={**CAPS, "features": ["poc:shake128", "poc:aes256ctr"]})
    assert Worker.objects.get().capabilities["features"] == ["poc:aes256ctr", "poc:shake128"]


@pytest.mark.django_db
def test_a_running_node_reports_what_its_upgraded_agent_offers(alice_reg_token, anon_client) -> None:
    # Registered by an agent from before features: offered SHAKE128 tasks only.
    body = register(anon_client, alice_reg_token, keys.generate()).json()
    worker = Worker.objects.get()
    assert worker.capabilities["features"] == ["poc:shake128"]
    node = APIClient()
    node.credentials(HTTP_AUTHORIZATION=f"Worker {body['token']}")
    # The upgraded agent, starting up, reports its capabilities without registering again.
    response = node.post(
        "/api/v1/workers/me/capabilities/", {**CAPS, "features": ["poc:aes256ctr", "poc:shake128"]}, format="json"
    )
    assert response.status_code == 200, response.json()
    worker.refresh_from_db()
    assert worker.capabilities["features"] == ["poc:aes256ctr", "poc:shake128"]
    # A bad report names the field and changes nothing.
    bad = node.post("/api/v1/workers/me/capabilities/", {**CAPS, "features": "poc:aes256ctr"}, format="json")
    assert bad.status_code == 400
    assert "features" in str(bad.json())
    worker.refresh_from_db()
    assert worker.capabilities["features"] == ["poc:aes256ctr", "poc:shake128"]
    # Only a worker's own token may report.
    assert anon_client.post("/api/v1/workers/me/capabilities/", CAPS, format="json").status_code in (401, 403)


@pytest.mark.django_db
def test_another_account_cannot_claim_a_registered_key(alice_reg_token, bob_client, anon_client) -> None:
    key = keys.generate()
    register(anon_client, alice_reg_token, key)
    bob_token = bob_client.post("/api/v1/workers/registration-tokens/").json()["token"]
    response = register(anon_client, bob_token, key)
    assert response.status_code == 403
    assert Worker.objects.get().owner.username == "alice"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("caps", "field"),
    [
        ("nope", "capabilities"),
        ({"cpu_cores": -1}, "cpu_cores"),
        ({"kinds": "synthetic"}, "kinds"),
        ({"features": "poc:aes256ctr"}, "features"),
        ({"features": [""]}, "features"),
        ({"features": ["x" * 65]}, "features"),
    ],
)
def test_bad_capabilities_are_named(alice_reg_token, anon_client, caps, field) -> None:
    response = register(anon_client, alice_reg_token, keys.generate(), caps=caps)
    assert response.status_code == 400
    assert field in str(response.json())


@pytest.mark.django_db
def test_suspended_and_retired_workers_lose_their_token(alice_client, alice_reg_token, anon_client, bob_client) -> None:
    body = register(anon_client, alice_reg_token, keys.generate()).json()
    wid = body["id"]
    assert bob_client.post(f"/api/v1/workers/{wid}/suspend/").status_code == 404
    assert alice_client.post(f"/api/v1/workers/{wid}/suspend/").json()["state"] == "suspended"
    assert services.authenticate_worker(body["token"]) is None
    assert alice_client.post(f"/api/v1/workers/{wid}/resume/").json()["state"] == "active"
    assert services.authenticate_worker(body["token"]) is not None
    assert alice_client.post(f"/api/v1/workers/{wid}/retire/").json()["state"] == "retired"
    response = alice_client.post(f"/api/v1/workers/{wid}/resume/")
    assert response.status_code == 400
    assert "state" in response.json()
    assert services.authenticate_worker(body["token"]) is None


def run_agent(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    return subprocess.run(
        [sys.executable, "-m", "workers.agent", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


def test_init_writes_a_private_key_file_and_refuses_to_overwrite(tmp_path: Path) -> None:
    result = run_agent("init", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    pem = tmp_path / "worker.pem"
    assert stat.S_IMODE(pem.stat().st_mode) == 0o600
    address = result.stdout.split("Worker address: ")[1].strip()
    assert address.startswith("cpc1")
    again = run_agent("init", cwd=tmp_path)
    assert again.returncode == 2
    assert "already exists" in again.stderr


@pytest.mark.django_db(transaction=True)
def test_the_cli_registers_against_a_live_server(live_server, alice, tmp_path: Path) -> None:
    _, raw = services.create_registration_token(alice)
    assert run_agent("init", cwd=tmp_path).returncode == 0
    result = run_agent("register", "--server", live_server.url, "--token", raw, "--name", "rig-1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Registered worker rig-1" in result.stdout
    worker = Worker.objects.get(name="rig-1")
    assert worker.owner == alice
    assert worker.capabilities["cpu_cores"] >= 1
    # The agent lists the generators it draws the synthetic matrices with, that it takes
    # verification jobs, its download in shards, and that its trainer replays as the platform's.
    assert worker.capabilities["features"] == [
        "dataset:shards",
        "poc:aes256ctr",
        "poc:shake128",
        "training:replay/2",
        "verify_segments",
    ]
    creds = tmp_path / "worker.json"
    assert stat.S_IMODE(creds.stat().st_mode) == 0o600
    # A spent token gives a clear message, not a traceback.
    again = run_agent("register", "--server", live_server.url, "--token", raw, cwd=tmp_path)
    assert again.returncode == 1
    assert "already used" in again.stderr


@pytest.mark.django_db
def test_open_registration_tokens_are_capped_and_old_expired_ones_deleted(alice, alice_client) -> None:
    from workers.identity.services import MAX_OPEN_REGISTRATION_TOKENS

    for _ in range(MAX_OPEN_REGISTRATION_TOKENS):
        assert alice_client.post("/api/v1/workers/registration-tokens/").status_code == 201
    refused = alice_client.post("/api/v1/workers/registration-tokens/")
    assert refused.status_code == 429
    assert "unused registration tokens" in refused.json()["detail"]
    # The page says the same, without a token.
    browser = Client()
    browser.force_login(alice)
    page = submit(browser, reverse("worker-register-page"), reverse("worker-register-page"))
    assert page.status_code == 200
    assert "unused registration tokens" in page.content.decode()
    assert RegistrationToken.objects.filter(owner=alice).count() == MAX_OPEN_REGISTRATION_TOKENS
    # Expired ones do not count; those expired over a day ago are deleted.
    RegistrationToken.objects.update(expires_at=timezone.now() - timedelta(days=2))
    assert alice_client.post("/api/v1/workers/registration-tokens/").status_code == 201
    assert RegistrationToken.objects.filter(owner=alice).count() == 1
