"""The node's ``--ask KIND=PER_TFLOP[/MIN]``: parsed on the node, sent to ``me/asks/``
(``ask`` at once, ``run`` before it takes a job), and a refusal is a one-line message and
exit 1, not a traceback nor a node that runs at prices it did not ask. The endpoint itself
against the real platform: test_market_asks_api.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.workers.stub_platform import StubPlatform as Platform
from workers.agent.cli import main
from workers.agent.identity import Credentials, credentials_path, load_key

ASKS = "/api/v1/workers/me/asks/"
REFUSAL = {"minimum": ["cube_training: The least a node may take for a job is 0.1 credits."]}


@pytest.fixture
def registered(platform: Platform, key_path: Path) -> Path:
    key = load_key(key_path)
    Credentials(server=platform.url, worker_id="w1", address=key.address, token="pww_test").save(
        credentials_path(key_path)
    )
    return key_path


def sent(platform: Platform) -> list[object]:
    return [body for method, path, body in platform.requests if method == "PUT" and path == ASKS]


def test_ask_sends_the_nodes_prices(platform: Platform, registered: Path, capsys: pytest.CaptureFixture[str]) -> None:
    platform.answers[f"PUT {ASKS}"] = (200, [])
    code = main(["--key", str(registered), "ask", "synthetic=0.5/0.2", "cube_training=0.01"])
    assert code == 0, capsys.readouterr().err
    assert sent(platform) == [
        [
            {"kind": "synthetic", "per_tflop": "0.5", "minimum": "0.2"},
            {"kind": "cube_training", "per_tflop": "0.01"},
        ]
    ]
    assert "Asks set: synthetic 0.5/TFLOP (min 0.2), cube_training 0.01/TFLOP." in capsys.readouterr().out


def test_a_refused_ask_is_one_line_and_exit_1(
    platform: Platform, registered: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    platform.answers[f"PUT {ASKS}"] = (400, REFUSAL)
    code = main(["--key", str(registered), "ask", "cube_training=1/0.000000001"])
    err = capsys.readouterr().err
    assert code == 1
    assert (
        "Asks not set: the platform refused this node's asks (HTTP 400): minimum: cube_training:"
        " The least a node may take for a job is 0.1 credits." in err
    )
    assert "Traceback" not in err


def test_run_with_a_refused_ask_does_not_start(
    platform: Platform, registered: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    platform.answers["POST /api/v1/workers/me/capabilities/"] = (200, {"capabilities": {}})
    platform.answers[f"PUT {ASKS}"] = (400, REFUSAL)
    folder = tmp_path / "queues"
    folder.mkdir()
    args = ["--key", str(registered), "run", "--broker", "filesystem://", "--broker-folder", str(folder)]
    code = main([*args, "--ask", "cube_training=1/0.000000001"])
    err = capsys.readouterr().err
    assert code == 1
    assert "error: the platform refused this node's asks (HTTP 400): minimum: cube_training:" in err
    # Capabilities first (an ask is taken only for a kind the node offers), then the asks; no job taken.
    assert platform.asked == ["POST /api/v1/workers/me/capabilities/", f"PUT {ASKS}"]


@pytest.mark.parametrize("bad", ["synthetic", "synthetic=", "synthetic=abc", "synthetic=1/-2", "Synth=1", "x=nan"])
def test_a_malformed_ask_is_refused_on_the_node(
    bad: str, platform: Platform, registered: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--key", str(registered), "ask", bad])
    assert exited.value.code == 2
    assert "KIND=PER_TFLOP[/MIN]" in capsys.readouterr().err
    assert platform.requests == []


def test_a_platform_without_asks_says_so(
    platform: Platform, registered: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--key", str(registered), "ask", "synthetic=1"]) == 1
    assert "takes no asks" in capsys.readouterr().err
