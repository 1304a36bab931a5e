"""``python -m workers.agent run`` stopping, as a real process: told to stop (Ctrl-C, a
process manager's SIGTERM) while the platform is down, it stops within seconds and never
opens its socket on the way out; a Celery worker that dies of an unrecoverable error
exits non-zero, so a process manager restarts it.

The platform is down (nothing listens on its port) or a stand-in that only records what
the node asks for; the broker is the filesystem transport of embedded mode.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.workers.test_agent_startup import ROOT, Platform, free_port, platform, wait_for_text
from workers.agent.identity import Credentials, init_key

__all__ = ["platform"]  # the fixture, used by name


def start(tmp_path: Path, server: str, folder: Path) -> tuple[subprocess.Popen[bytes], Path]:
    key_path = tmp_path / "worker.pem"
    key = init_key(key_path)
    Credentials(server=server, worker_id="w1", address=key.address, token="pww_test", chain_id="c").save(
        key_path.with_name("worker.json")
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["PYTHONPATH"] = str(ROOT)
    log = tmp_path / "agent.log"
    args = [sys.executable, "-m", "workers.agent", "--key", str(key_path), "run", "--broker", "filesystem://"]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*args, "--broker-folder", str(folder)], cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    return proc, log


def stopped_within(proc: subprocess.Popen[bytes], seconds: float) -> int | None:
    try:
        return proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_node_told_to_stop_while_the_platform_is_down_stops_within_seconds(
    sig: signal.Signals, tmp_path: Path
) -> None:
    # Its start-up calls to the platform retried for about 91 s each before: 3 minutes
    # between Ctrl-C and the prompt, and a process manager's SIGKILL before that.
    folder = tmp_path / "broker" / "out"
    folder.mkdir(parents=True)
    proc, log = start(tmp_path, f"http://127.0.0.1:{free_port()}", folder)
    wait_for_text(log, "/api/v1/workers/me/capabilities/ failed", 60)
    proc.send_signal(sig)
    code = stopped_within(proc, 15)
    text = log.read_text(errors="replace")
    assert code is not None, text[-3000:]
    assert "WebSocket unavailable" not in text  # it did not try to look online on its way out
    assert "Traceback" not in text


@pytest.mark.slow
def test_a_node_whose_worker_cannot_start_exits_non_zero(platform: Platform, tmp_path: Path) -> None:
    folder = tmp_path / "broker" / "out"
    folder.mkdir(parents=True)
    (tmp_path / "broker" / "control").write_text("a file where the control folder goes")
    proc, log = start(tmp_path, platform.url, folder)
    code = stopped_within(proc, 60)
    text = log.read_text(errors="replace")
    assert "Unrecoverable error" in text
    assert code not in (None, 0), text[-3000:]
