"""Every way the node's command line can fail, as the provider meets it: one line on
stderr and a non-zero exit, never a traceback, and nothing lost on the way (the key
file, the token the platform answered with).

The platform is a stand-in on 127.0.0.1 that answers each path with the status, content
type and bytes a test gives it: what a login page, a proxy's error page or a broken
server would send, which the real platform (test_registration.py, test_sweep.py) never
does. ``run`` is tested only where it must refuse before Celery starts; how it starts
and stops as a process is in test_agent_startup.py and test_agent_shutdown.py.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from protocol import keys
from tests.workers.stub_platform import CHAIN, HTML, register_template
from tests.workers.stub_platform import StubPlatform as Platform
from workers.agent.cli import main
from workers.agent.identity import Credentials, init_key, load_key
from workers.agent.reporter import RECONNECT_MAX_SECONDS, reconnect_delay

CHALLENGE = "/api/v1/workers/challenge/"
REGISTER = "/api/v1/workers/register/"
SWEEP = "/api/v1/workers/me/sweep/"


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if not line.startswith("warning: ")]
    assert len(lines) == 1, err
    return lines[0]


# --- init ------------------------------------------------------------------------------------


def test_init_where_no_file_can_be_written_is_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "keys").write_text("a file, not a folder")
    assert main(["--key", str(tmp_path / "keys" / "worker.pem"), "init"]) == 2
    assert one_line_error(capsys).startswith(f"error: Cannot write the key file {tmp_path / 'keys' / 'worker.pem'}: ")


def test_init_refuses_a_dangling_link_where_the_key_would_go(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "worker.pem").symlink_to(tmp_path / "elsewhere.pem")
    assert main(["--key", str(tmp_path / "worker.pem"), "init"]) == 2
    assert "already exists; one key per node" in one_line_error(capsys)
    assert not (tmp_path / "elsewhere.pem").exists()


# --- register --------------------------------------------------------------------------------


def register(platform: Platform, key_path: Path, server: str | None = None) -> int:
    return main(["--key", str(key_path), "register", "--server", server or platform.url, "--token", "pwr_x"])


def answer_registration(platform: Platform, key_path: Path) -> None:
    """What the real platform answers to both steps."""
    address = load_key(key_path).address
    template = register_template(address)
    platform.answers[CHALLENGE] = (200, "application/json", {"challenge": "ab" * 32, "register_tx": template})
    platform.answers[REGISTER] = (
        201,
        "application/json",
        {"id": "w1", "name": "rig", "address": address, "token": "pww_test", "created": True},
    )


@pytest.mark.parametrize(
    ("path", "answer", "words"),
    [
        (CHALLENGE, (200, HTML, b"<html>Sign in</html>"), "answered HTTP 200 with text/html, not the platform's API"),
        (CHALLENGE, (200, "application/json", []), "answered HTTP 200 with application/json, not the platform's API"),
        (CHALLENGE, (200, "application/json", {"detail": "hello"}), "Could not get a challenge: the platform's answer"),
        (REGISTER, (201, HTML, b"<html>ok</html>"), "Registration: "),
        (REGISTER, (201, "application/json", {"id": "w1"}), "Registration answered without the worker's id"),
    ],
)
def test_register_against_something_that_is_not_the_platform_is_a_message(
    path: str,
    answer: tuple[int, str, Any],
    words: str,
    platform: Platform,
    key_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    answer_registration(platform, key_path)
    platform.answers[path] = answer
    assert register(platform, key_path) == 1
    assert words in one_line_error(capsys)
    assert not key_path.with_name("worker.json").exists()


def test_register_keeps_the_nodes_broker_login_private_beside_its_key(platform: Platform, key_path: Path) -> None:
    answer_registration(platform, key_path)
    login = "amqps://cpc1node:s3cret@broker.example:5671/proofwork-nodes"
    platform.answers[REGISTER][2]["broker_url"] = login
    assert register(platform, key_path) == 0
    creds = key_path.with_name("worker.json")
    assert Credentials.load(creds).broker_url == login
    assert creds.stat().st_mode & 0o777 == 0o600


def test_register_refuses_a_broker_login_that_is_not_amqp(
    platform: Platform, key_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A platform (or someone in its place) handing out its Redis is not followed.
    answer_registration(platform, key_path)
    platform.answers[REGISTER][2]["broker_url"] = "redis://:s3cret@platform.example:6379/0"
    assert register(platform, key_path) == 1
    assert "not amqp:// or amqps://" in one_line_error(capsys)
    assert not key_path.with_name("worker.json").exists()


def test_register_keeps_no_credentials_for_another_address(
    platform: Platform, key_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    answer_registration(platform, key_path)
    other = keys.generate().address
    platform.answers[REGISTER] = (201, "application/json", {"id": "w1", "address": other, "token": "pww_test"})
    assert register(platform, key_path) == 1
    assert f"The platform registered {other}, not this key's address" in one_line_error(capsys)
    assert not key_path.with_name("worker.json").exists()


@pytest.mark.parametrize("server", ["http://[::1", "http://127.0.0.1:8000:80"])
def test_register_with_a_malformed_server_url_is_a_message(
    server: str, platform: Platform, key_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert register(platform, key_path, server) == 1
    assert f"{server} is not a valid server URL" in one_line_error(capsys)


def test_register_says_when_the_token_could_not_be_saved(
    platform: Platform, key_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    answer_registration(platform, key_path)
    key_path.with_name("worker.json").mkdir()  # in the way of the credentials file
    assert register(platform, key_path) == 1
    line = one_line_error(capsys)
    assert line.startswith("Registered, but the worker's token was not saved (Cannot write the credentials file")
    assert "register again with a new token" in line


def test_registering_a_key_named_tmp_keeps_the_key(platform: Platform, tmp_path: Path) -> None:
    key_path = tmp_path / "node.tmp"  # its credentials go to node.json
    address = init_key(key_path).address
    answer_registration(platform, key_path)
    assert register(platform, key_path) == 0
    assert load_key(key_path).address == address  # the credentials' temporary file was the key itself
    assert Credentials.load(tmp_path / "node.json").address == address


def test_a_key_named_like_its_credentials_is_refused_before_the_token_is_spent(
    platform: Platform, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key_path = tmp_path / "worker.json"
    address = init_key(key_path).address
    answer_registration(platform, key_path)
    assert register(platform, key_path) == 2
    assert "ends in .json, the name of its credentials file" in one_line_error(capsys)
    assert platform.asked == []
    assert load_key(key_path).address == address


# --- sweep -----------------------------------------------------------------------------------


def sweep_template(address: str, **changes: Any) -> dict[str, Any]:
    template = {
        "chain_id": CHAIN,
        "type": "TRANSFER",
        "from": address,
        "to": keys.generate().address,
        "amount": 2 * 10**9,
        "fee": 21_000_000,
        "nonce": 1,
        "gas_price": 1000,
        "gas_limit": 21_000,
        "payload": {"memo": "sweep"},
    }
    return {**template, **changes}


def sweepable(platform: Platform, key_path: Path) -> str:
    address = load_key(key_path).address
    Credentials(server=platform.url, worker_id="w1", address=address, token="pww_test", chain_id=CHAIN).save(
        key_path.with_name("worker.json")
    )
    platform.answers[f"GET {SWEEP}"] = (200, "application/json", sweep_template(address))
    return address


@pytest.mark.parametrize(
    ("answer", "words"),
    [
        ((200, HTML, b"<html>Sign in</html>"), "Nothing swept: http://"),
        ((200, "application/json", ["TRANSFER"]), "not the platform's API"),
        ((200, "application/json", {"amount": "all"}), "Nothing swept: the platform sent an unexpected transaction"),
    ],
)
def test_sweep_of_an_answer_that_is_not_a_transfer_is_a_message(
    answer: tuple[int, str, Any],
    words: str,
    platform: Platform,
    key_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sweepable(platform, key_path)
    platform.answers[f"GET {SWEEP}"] = answer
    assert main(["--key", str(key_path), "sweep", "--yes"]) == 1
    assert words in one_line_error(capsys)
    assert platform.asked == [f"GET {SWEEP}"]  # nothing signed went back


@pytest.mark.parametrize(
    "change",
    [{"amount": None}, {"fee": "21000000"}, {"chain_id": None}, {"nonce": -1}, {"chain_id": "proofwork-main-1"}],
)
def test_sweep_signs_no_transfer_with_missing_fields_or_for_another_chain(
    change: dict[str, Any], platform: Platform, key_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    address = sweepable(platform, key_path)
    platform.answers[f"GET {SWEEP}"] = (200, "application/json", sweep_template(address, **change))
    assert main(["--key", str(key_path), "sweep", "--yes"]) == 1
    assert "Nothing swept: the platform sent an unexpected transaction" in one_line_error(capsys)
    assert platform.asked == [f"GET {SWEEP}"]


def test_a_sweep_whose_answer_is_unreadable_says_it_was_sent(
    platform: Platform, key_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sweepable(platform, key_path)
    platform.answers[f"POST {SWEEP}"] = (202, HTML, b"<html>Accepted</html>")
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert main(["--key", str(key_path), "sweep", "--yes"]) == 1
    assert one_line_error(capsys).startswith("The sweep was sent, but its answer is unreadable: ")


def test_sweep_with_a_malformed_server_url_is_a_message(
    platform: Platform, key_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweepable(platform, key_path)
    assert main(["--key", str(key_path), "sweep", "--server", "http://[::1"]) == 1
    assert "http://[::1 is not a valid server URL" in one_line_error(capsys)


def test_ctrl_c_at_a_question_is_a_message(
    platform: Platform, key_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sweepable(platform, key_path)

    def interrupted(prompt: str) -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr("builtins.input", interrupted)
    try:
        code = main(["--key", str(key_path), "sweep"])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C left the command line as a traceback")
    assert code == 130
    assert one_line_error(capsys) == "Interrupted."
    assert platform.asked == [f"GET {SWEEP}"]


# --- run: what it refuses before Celery starts ------------------------------------------------


@pytest.mark.parametrize(
    ("broker", "words"),
    [
        ("foo://broker", "there is no foo:// broker transport"),
        ("127.0.0.1:6379", "is not a broker URL"),
        ("filesystem://", "the broker folder"),
    ],
)
def test_run_with_a_broker_it_cannot_use_is_a_message(
    broker: str, words: str, platform: Platform, key_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweepable(platform, key_path)  # registered
    args = ["--key", str(key_path), "run", "--broker", broker, "--broker-folder", str(tmp_path / "nowhere" / "out")]
    assert main(args) == 2
    line = one_line_error(capsys)
    assert line.startswith("error: ")
    assert words in line
    assert platform.asked == []


def test_run_without_a_broker_login_or_a_broker_says_what_to_pass(
    platform: Platform, key_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweepable(platform, key_path)  # registered with an embedded platform: no broker login
    assert main(["--key", str(key_path), "run"]) == 2
    line = one_line_error(capsys)
    assert "holds no broker login" in line
    assert "--broker filesystem://" in line
    assert platform.asked == []


def test_run_with_a_broker_ca_that_is_not_a_file_is_a_message(
    platform: Platform, key_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweepable(platform, key_path)
    args = ["--key", str(key_path), "run", "--broker", "amqps://n:p@broker.example/nodes"]
    assert main([*args, "--broker-ca", str(tmp_path / "ca.pem")]) == 2
    assert "--broker-ca" in one_line_error(capsys)
    assert platform.asked == []


def test_run_with_a_malformed_server_url_is_a_message(
    platform: Platform, key_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweepable(platform, key_path)
    args = ["--key", str(key_path), "run", "--server", "http://[::1", "--broker", "filesystem://"]
    assert main([*args, "--broker-folder", str(tmp_path)]) == 2
    assert "http://[::1 is not a valid server URL" in one_line_error(capsys)


# --- the reporter's backoff -----------------------------------------------------------------


def test_reconnecting_after_hours_of_failures_still_waits_at_most_the_cap() -> None:
    # The 1,025th failure in a row (about 85 minutes of a platform down) raised
    # OverflowError in the reporter's thread, which ended it: the node never beat again.
    for failures in (1, 5, 1024, 1025, 10**6):
        assert 0 < reconnect_delay(failures) <= RECONNECT_MAX_SECONDS
