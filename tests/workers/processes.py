"""Real processes for end-to-end tests: daphne, a platform Celery worker, a provider agent.

They share the test database (a file for SQLite, the test database on PostgreSQL) and
the brokers the settings name: the platform's (the filesystem broker under var/, or Redis
in CI) and the node broker (RabbitMQ in CI, else the filesystem broker under var/). Stale
broker messages from earlier runs are harmless: every task re-reads its rows and
returns quietly when they are gone.
"""

from __future__ import annotations

import os
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_database_url() -> str:
    """The URL of the database the test process is using, for child processes."""
    params = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{params['NAME']}"
    auth = params["USER"] + (f":{params['PASSWORD']}" if params.get("PASSWORD") else "")
    return f"postgres://{auth}@{params['HOST'] or '127.0.0.1'}:{params['PORT'] or 5432}/{params['NAME']}"


def child_env(**extra: str) -> dict[str, str]:
    # The checkout first; an existing PYTHONPATH (packages installed outside the venv) after it.
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "DATABASE_URL": test_database_url(), "PYTHONPATH": path, "PROOFWORK_LOG_LEVEL": "INFO"}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    env.update(extra)
    return env


@contextmanager
def serving(server: socketserver.BaseServer) -> Iterator[None]:
    """Run a stand-in server (http.server and friends) on a thread for the block."""
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def spawn(args: list[str], log: Path, env: dict[str, str], cwd: Path = ROOT) -> Iterator[subprocess.Popen[bytes]]:
    """Run a child process for the block, its output in ``log``; terminated (then killed) after."""
    with log.open("wb") as out:
        proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextmanager
def daphne(tmp: Path) -> Iterator[str]:
    port = free_port()
    args = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"]
    with spawn(args, tmp / "daphne.log", child_env(DJANGO_SETTINGS_MODULE="config.settings")) as proc:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _up(url), 30, f"daphne did not start: {(tmp / 'daphne.log').read_text()[-2000:]}")
        assert proc.poll() is None
        yield url


def _up(url: str) -> bool:
    try:
        return httpx.get(f"{url}/api/v1/kinds/", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def platform_worker(tmp: Path, queues: str = "platform,control") -> Iterator[subprocess.Popen[bytes]]:
    """A trusted Celery worker; by default one process for both queues (make run has one each)."""
    args = [sys.executable, "-m", "celery", "-A", "config", "worker", "-Q", queues, "--pool", "solo"]
    name = queues.replace(",", "-")
    args += ["-n", f"{name}-{os.getpid()}@%h", "--loglevel", "INFO"]
    log = tmp / f"{queues.split(',')[0]}.log"  # platform.log for the default
    with spawn(args, log, child_env(DJANGO_SETTINGS_MODULE="config.settings")) as proc:
        yield proc


def agent_cmd(key: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "workers.agent", "--key", str(key), *args]


def broker_args() -> list[str]:
    """``run``'s broker arguments: none on a node broker (the agent logs in with what its
    registration gave it), else the filesystem broker's folder of node queues."""
    from django.conf import settings

    if settings.NODE_BROKER_URL:
        return []
    return ["--broker", "filesystem://", "--broker-folder", str(settings.NODE_QUEUE_DIR)]


def wait_for(
    condition: Callable[[], bool],
    timeout: float,
    message: str,
    interval: float = 0.2,
    explain: Callable[[], str] | None = None,
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval)
    raise AssertionError(message + ("\n" + explain() if explain else ""))


def register_agent(tmp: Path, url: str, owner: Any, name: str) -> Path:
    """``init`` and ``register`` a node with the real CLI; returns its key path."""
    from workers.identity import services

    key = tmp / name / "worker.pem"
    env = child_env()
    init = subprocess.run(agent_cmd(key, "init"), env=env, capture_output=True, text=True, timeout=120)
    assert init.returncode == 0, init.stderr
    _, raw = services.create_registration_token(owner)
    args = agent_cmd(key, "register", "--server", url, "--token", raw, "--name", name)
    reg = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    assert reg.returncode == 0, reg.stderr
    return key
