"""Real processes for end-to-end tests: daphne, a platform Celery worker, a provider agent,
and the platform with a node of its own running (``platform_and_node``).

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from django.db import connection

from marketplace.models import User
from workers.models import Worker

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_database_url() -> str:
    """The URL of the database the test process is using, for child processes."""
    params = connection.settings_dict
    engine, name = params["ENGINE"], str(params["NAME"])
    if engine.endswith("sqlite3"):
        if name.startswith("file:") or ":memory:" in name:
            pytest.fail(
                "The SQLite test database is in memory, so a child process cannot share it: "
                'set DATABASES["default"]["TEST"]["NAME"] to a file (config/settings.py does).'
            )
        return f"sqlite:///{Path(name).resolve()}"
    if engine.endswith("postgresql"):
        user = quote(str(params.get("USER") or ""))
        password = params.get("PASSWORD")
        auth = f"{user}:{quote(str(password))}@" if password else (f"{user}@" if user else "")
        return f"postgres://{auth}{params.get('HOST') or '127.0.0.1'}:{params.get('PORT') or 5432}/{quote(name)}"
    pytest.fail(f"the tests do not know how to share a {engine} database with a child process")


def child_env(**extra: str) -> dict[str, str]:
    # The checkout first; an existing PYTHONPATH (packages installed outside the venv) after it.
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "DATABASE_URL": test_database_url(), "PYTHONPATH": path, "PROOFWORK_LOG_LEVEL": "INFO"}
    # A child stopped by ``spawn`` leaves in its log all it wrote, not what filled a buffer.
    env["PYTHONUNBUFFERED"] = "1"
    # One compute thread per child (torch, numpy): the test process, daphne, the platform
    # worker and the agent share the machine's few cores, and a tiny model's intra-op threads
    # then spin against the other processes (a 170-step cube run: 5 s on one thread, 47 s on
    # two, on a loaded 2-core machine).
    env["OMP_NUM_THREADS"] = "1"
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
def spawn(
    args: list[str], log: Path, env: dict[str, str] | None = None, cwd: Path = ROOT
) -> Iterator[subprocess.Popen[bytes]]:
    """Run a child process for the block, its output in ``log`` (``env``: this process's when
    None); terminated (then killed) after."""
    with log.open("wb") as out:
        proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            yield proc
        finally:
            stop(proc)


def stop(*procs: subprocess.Popen[bytes]) -> None:
    """Terminate the children still running, all at once, then wait for each (killed after
    10 s): a Celery worker takes a few seconds to shut down, so stopping several together
    costs the time of one. A child that has exited is left alone."""
    running = [proc for proc in procs if proc.poll() is None]
    for proc in running:
        proc.terminate()
    for proc in running:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def answers(url: str, **request: Any) -> bool:
    """Whether a GET of ``url`` answers 200 within 2 s (``request``: httpx's arguments)."""
    try:
        return httpx.get(url, timeout=2, **request).status_code == 200
    except httpx.HTTPError:
        return False


def wait_until_serving(
    proc: subprocess.Popen[bytes], log: Path, up: Callable[[], bool], timeout: float = START_TIMEOUT_S
) -> None:
    """Wait until a server the test started answers (``up``); the test fails with the end of
    its log when it exits first or does not answer within ``timeout`` seconds."""
    name = log.stem
    deadline = time.monotonic() + timeout
    while not up():
        if proc.poll() is not None:
            pytest.fail(f"{name} exited with {proc.returncode}:\n{log.read_text(errors='replace')[-4000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"{name} did not answer within {timeout} s:\n{log.read_text(errors='replace')[-4000:]}")
        time.sleep(0.1)


@contextmanager
def daphne(workdir: Path, env: dict[str, str] | None = None, probe: str = "/api/v1/kinds/") -> Iterator[str]:
    """daphne serving the app on the test database (``env``: ``child_env``'s by default) for
    the block, its log in ``workdir/daphne.log``; yields its base URL once ``probe`` answers."""
    port = free_port()
    args = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"]
    log = workdir / "daphne.log"
    with spawn(args, log, env or child_env(DJANGO_SETTINGS_MODULE="config.settings")) as proc:
        url = f"http://127.0.0.1:{port}"
        wait_until_serving(proc, log, lambda: answers(url + probe))
        yield url


@contextmanager
def deployed_daphne(workdir: Path, **overrides: str) -> Iterator[str]:
    """daphne as deployed: real error pages (DEBUG off), static files collected and served by
    whitenoise, media and static files under ``workdir``. No provider node runs: scheduling
    messages go to an in-memory broker instead of piling up in var/. Every STRIPE_ variable
    of this process's environment is dropped, so payments are on only where ``overrides``
    (the environment's last word) turn them on."""
    env = {k: v for k, v in child_env().items() if not k.startswith("STRIPE_")}
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "PROOFWORK_MEDIA_ROOT": str(workdir / "media"),
            "PROOFWORK_STATIC_ROOT": str(workdir / "static"),
            "DJANGO_DEBUG": "0",
            "CELERY_BROKER_URL": "memory://",
            **overrides,
        }
    )
    collect = [sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"]
    subprocess.run(collect, cwd=ROOT, env=env, check=True)
    with daphne(workdir, env, probe="/accounts/login/") as url:
        yield url


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


def start_init(tmp: Path, name: str | None) -> subprocess.Popen[str]:
    """Start ``init`` of the key ``register_agent(tmp, …, name, init)`` registers, with the
    real CLI, so that it runs while the platform starts."""
    key = tmp / (name or "node") / "worker.pem"
    return subprocess.Popen(
        agent_cmd(key, "init"), env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def register_agent(
    tmp: Path, url: str, owner: User, name: str | None, init: subprocess.Popen[str] | None = None
) -> Path:
    """``init`` (unless ``start_init`` started it: ``init``) and ``register`` a node with the
    real CLI (``name`` None: the name the CLI chooses); returns its key path."""
    from workers.identity import services

    key = tmp / (name or "node") / "worker.pem"
    started = init or start_init(tmp, name)
    _, err = started.communicate(timeout=120)
    assert started.returncode == 0, err
    _, raw = services.create_registration_token(owner)
    args = agent_cmd(key, "register", "--server", url, "--token", raw, *(["--name", name] if name else []))
    reg = subprocess.run(args, env=child_env(), capture_output=True, text=True, timeout=120)
    assert reg.returncode == 0, reg.stderr
    return key


def logs(tmp: Path) -> str:
    """The end of each process's log in ``tmp``, for a failure's message."""
    return "\n".join(
        f"--- {name}\n{(tmp / name).read_text(errors='replace')[-3000:]}"
        for name in ("agent.log", "platform.log", "daphne.log")
        if (tmp / name).exists()
    )


@dataclass(frozen=True)
class RunningNode:
    """A provider node running against the platform ``platform_and_node`` started."""

    url: str  # the platform's (daphne)
    worker: Worker  # its row as registration left it
    key: Path
    agent: subprocess.Popen[bytes]  # ``workers.agent run``
    log: Path  # the agent's


@contextmanager
def platform_and_node(tmp: Path, owner: User, name: str | None, online_within: float = 30) -> Iterator[RunningNode]:
    """The platform (daphne and a platform Celery worker) and one node of ``owner``'s,
    registered with the real CLI, running and online (a heartbeat within ``online_within``
    seconds), for the block; each process logs to ``tmp`` (``logs``)."""
    with start_init(tmp, name) as init, daphne(tmp) as url, platform_worker(tmp) as platform:
        key = register_agent(tmp, url, owner, name, init)
        worker = Worker.objects.get(owner=owner)
        log = tmp / "agent.log"
        with spawn(agent_cmd(key, "run", *broker_args()), log, child_env()) as agent:
            try:
                wait_for(
                    lambda: Worker.objects.get(pk=worker.pk).is_online,
                    online_within,
                    "the agent never sent a heartbeat",
                    explain=lambda: logs(tmp),
                )
                yield RunningNode(url, worker, key, agent, log)
            finally:
                stop(agent, platform)  # together; daphne last, as the agent may still report
