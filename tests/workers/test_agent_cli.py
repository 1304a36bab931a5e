"""The node's command line where it must not trust the platform blindly: the
REGISTER_WORKER template is checked before it is signed and its chain remembered, a
sweep asks first, and plain http to another machine is warned about.

Register and sweep talk to a stand-in platform on 127.0.0.1 that answers with the
templates a compromised server (or a man in the middle on plain http) could send, which
the real one never does; registering and sweeping against the real platform are covered
by test_registration.py and test_sweep.py. The key file itself: test_agent_identity.py.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from protocol import keys
from tests.workers.stub_platform import CHAIN, register_template
from tests.workers.stub_platform import StubPlatform as Platform
from workers.agent.cli import main
from workers.agent.identity import Credentials, load_key
from workers.agent.trust import insecure_server


def register(platform: Platform, key_path: Path, template: dict[str, Any]) -> int:
    key = load_key(key_path)
    platform.answers["/api/v1/workers/challenge/"] = (200, {"challenge": "ab" * 32, "register_tx": template})
    platform.answers["/api/v1/workers/register/"] = (
        201,
        {"id": "w1", "name": "rig", "address": key.address, "token": "pww_test", "created": True},
    )
    return main(["--key", str(key_path), "register", "--server", platform.url, "--token", "pwr_x"])


# A fixed key: it names a test (below), and xdist workers must collect the same names.
THIEF = keys.from_seed(bytes(range(32))).address


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"type": "TRANSFER", "to": THIEF, "amount": 10**12, "fee": 21_000}, "type is 'TRANSFER'"),
        ({"to": THIEF}, f"to is '{THIEF}'"),
        ({"amount": 1}, "amount is 1, expected 0"),
        ({"fee": 21_000}, "fee is 21000, expected 0"),
        ({"payload": {"memo": "sweep"}}, "payload is {'memo': 'sweep'}, expected none"),
    ],
)
def test_register_refuses_to_sign_anything_but_its_own_registration(
    change: dict[str, Any], words: str, platform: Platform, key_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = load_key(key_path)
    code = register(platform, key_path, register_template(key.address, **change))
    err = capsys.readouterr().err
    assert code == 1
    assert "Not registered: the platform sent a REGISTER_WORKER transaction this node will not sign" in err
    assert words in err
    assert platform.posted("/api/v1/workers/register/") == []  # no signature left the node
    assert not key_path.with_name("worker.json").exists()


def test_register_remembers_the_chain_it_registered_on(platform: Platform, key_path: Path) -> None:
    key = load_key(key_path)
    assert register(platform, key_path, register_template(key.address)) == 0
    (sent,) = platform.posted("/api/v1/workers/register/")
    assert len(sent["register_tx_signature"]) == 128
    creds = Credentials.load(key_path.with_name("worker.json"))
    assert creds.chain_id == CHAIN


def test_credentials_written_before_the_chain_was_recorded_still_load(tmp_path: Path) -> None:
    path = tmp_path / "worker.json"
    path.write_text(json.dumps({"server": "http://x", "worker_id": "1", "address": "cpc1x", "token": "t"}))
    path.chmod(0o600)
    assert Credentials.load(path).chain_id == ""


# --- sweep asks before it signs ------------------------------------------------------------


@pytest.fixture
def sweepable(platform: Platform, key_path: Path) -> Platform:
    key = load_key(key_path)
    Credentials(server=platform.url, worker_id="w1", address=key.address, token="pww_test", chain_id=CHAIN).save(
        key_path.with_name("worker.json")
    )
    owner = keys.generate().address
    template = {
        "chain_id": CHAIN,
        "type": "TRANSFER",
        "from": key.address,
        "to": owner,
        "amount": 2 * 10**9,
        "fee": 21_000_000,
        "nonce": 1,
        "gas_price": 1000,
        "gas_limit": 21_000,
        "payload": {"memo": "sweep"},
    }
    platform.answers["/api/v1/workers/me/sweep/"] = (200, template)
    return platform


@pytest.mark.parametrize("answer", ["n\n", "\n", ""])
def test_sweep_sends_nothing_unless_confirmed(
    answer: str,
    sweepable: Platform,
    key_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(answer))  # "" is no terminal at all: end of input
    assert main(["--key", str(key_path), "sweep"]) == 1
    out, err = capsys.readouterr()
    assert "Sweep 2 credits (fee 0.021) from" in out
    assert "Sign and send this transfer? [y/N]" in out
    assert "Nothing swept: not confirmed (pass --yes to sweep without asking)." in err
    assert sweepable.posted("/api/v1/workers/me/sweep/") == []


@pytest.mark.parametrize(("answer", "flags"), [("y\n", []), ("", ["--yes"])])
def test_sweep_signs_once_confirmed(
    answer: str, flags: list[str], sweepable: Platform, key_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sweepable.answers["POST /api/v1/workers/me/sweep/"] = (202, {"hash": "ab" * 32, "status": "pending"})
    monkeypatch.setattr("sys.stdin", io.StringIO(answer))
    assert main(["--key", str(key_path), "sweep", *flags]) == 0
    (signed,) = sweepable.posted("/api/v1/workers/me/sweep/")
    assert len(signed["signature"]) == 128


def test_only_plain_http_off_this_machine_is_warned_about() -> None:
    assert insecure_server("http://127.0.0.1:8000") is None
    assert insecure_server("http://localhost:8000") is None
    assert insecure_server("https://proofwork.example") is None
    warning = insecure_server("http://proofwork.example")
    assert warning is not None
    assert "plain http" in warning


def test_the_agents_celery_app_is_json_only_and_waits_a_day_before_redelivering_on_redis() -> None:
    from workers.agent.app import make_app

    app = make_app("redis://127.0.0.1:6379/0", "w.cpc1example")
    assert app.conf.accept_content == ["json"]
    assert app.conf.task_acks_late
    assert app.conf.worker_prefetch_multiplier == 1
    # A job running past Redis's default hour must not be delivered to the node again.
    assert app.conf.broker_transport_options == {"visibility_timeout": 86400}
    assert make_app("amqp://guest@127.0.0.1//", "w.cpc1example").conf.broker_transport_options == {}


def test_on_rabbitmq_the_agent_declares_nothing_and_broadcasts_nothing() -> None:
    # A node's broker user may only read its own queue (docs/node-broker.md).
    from workers.agent.app import make_app

    app = make_app("amqp://cpc1example:pw@127.0.0.1:5672/nodes", "w.cpc1example")
    (queue,) = app.conf.task_queues
    assert queue.name == "w.cpc1example"
    assert queue.no_declare
    assert app.conf.worker_enable_remote_control is False
    assert app.conf.worker_send_task_events is False
    assert app.conf.task_send_sent_event is False
    assert app.conf.broker_use_ssl is None
    # amqps checks the broker's certificate and its name, against a private CA when given.
    tls = make_app("amqps://n:p@broker.example:5671/nodes", "w.cpc1example", broker_ca="/etc/ca.pem").conf
    assert tls.broker_use_ssl == {
        "context": {"check_hostname": True, "cafile": "/etc/ca.pem"},
        "server_hostname": "broker.example",
    }
