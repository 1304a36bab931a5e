"""The provider node installed on its own: a fresh virtualenv holding only ``pip install
'.[node]'`` (non-editable, from a copy of the checkout, the PoC kernels compiled) runs
``init``, ``register`` and ``run`` against a real daphne and platform worker, and its node
completes a synthetic task that is verified and paid. Django is not importable there, nor
any platform module: the node works without them (issue 22 §4)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import httpx
import pytest

from ledger import services as ledger
from ledger.units import UNITS_PER_CREDIT
from marketplace import services as marketplace
from marketplace.models import Task, TaskStatus
from tests.workers import processes as p
from workers.identity import services
from workers.models import Assignment, Worker

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# What a provider's machine would not have: the platform's settings and its services' URLs.
PLATFORM_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL")


def node_env() -> dict[str, str]:
    return {
        k: v for k, v in os.environ.items() if k not in PLATFORM_ENV and not k.startswith(("DJANGO_", "PROOFWORK_"))
    }


def platform_only_distributions() -> set[str]:
    """The platform extra's distributions (minus the node's), by their normalised names."""
    with (p.ROOT / "pyproject.toml").open("rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    names = {req.split("==")[0].split("[")[0].lower().replace("_", "-") for req in extras["platform"]}
    return names - {"proofwork"}


@pytest.fixture(scope="module")
def node_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with the node installed from a copy of the checkout (the
    in-place build of the kernels left behind, so the install compiles its own)."""
    base = tmp_path_factory.mktemp("node-install")
    source = base / "proofwork"
    ignore = shutil.ignore_patterns(
        ".git", ".venv", "var", "build", "*.egg-info", "__pycache__", "*.so", ".*_cache", "node_modules"
    )
    shutil.copytree(p.ROOT, source, ignore=ignore)
    venv = base / "venv"
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--no-input", "--quiet", f"{source}[node]"],
        env=node_env(),
        cwd=base,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    print(f"\nnode venv: created and installed in {time.monotonic() - started:.1f} s")
    shutil.rmtree(source)  # the node must run from its install, not from a checkout
    return python


def run_node(python: Path, cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python), *args], cwd=cwd, env=node_env(), capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def node_broker() -> list[str]:
    """The node's ``run`` broker arguments: none on a node broker (RabbitMQ: the node logs
    in with what its registration gave it), else the embedded filesystem broker's folder of
    node queues. Never the platform's Redis: the node has no Redis client."""
    return p.broker_args()


def test_the_node_venv_holds_the_node_and_nothing_of_the_platform(node_python: Path, tmp_path: Path) -> None:
    no_django = run_node(node_python, tmp_path, "-c", "import django")
    assert no_django.returncode != 0
    assert "No module named 'django'" in no_django.stderr

    listing = run_node(node_python, tmp_path, "-m", "pip", "list", "--format=json")
    installed = {d["name"].lower().replace("_", "-"): d["version"] for d in json.loads(listing.stdout)}
    assert not platform_only_distributions() & installed.keys(), sorted(installed)
    assert installed["torch"].split("+")[0] == "2.13.0"

    script = (
        "import json, protocol, training.poc.kernels as k, workers, workers.agent.app;"
        "print(json.dumps([m.__file__ for m in (protocol, workers, workers.agent.app)] + [k._simd is not None]))"
    )
    where = run_node(node_python, tmp_path, "-c", script)
    assert where.returncode == 0, where.stderr
    *files, kernels_built = json.loads(where.stdout)
    venv = node_python.parent.parent
    assert all(Path(f).is_relative_to(venv) for f in files), files
    assert kernels_built, "the PoC kernels' C extension was not built"
    # Only the agent's part of workers ships: the platform's modules are not in the install.
    assert run_node(node_python, tmp_path, "-c", "import workers.models").returncode != 0


def test_a_node_installed_alone_completes_a_synthetic_task(
    node_python: Path, node_broker: list[str], alice, bob, tmp_path: Path
) -> None:
    node_dir = tmp_path / "node"
    node_dir.mkdir()
    agent = [str(node_python), "-m", "workers.agent"]

    init = run_node(node_python, node_dir, "-m", "workers.agent", "init")
    assert init.returncode == 0, init.stderr
    assert (node_dir / "worker.pem").stat().st_mode & 0o777 == 0o600

    with p.daphne(tmp_path) as url, p.platform_worker(tmp_path):
        _, registration = services.create_registration_token(alice)
        reg = run_node(
            node_python, node_dir, "-m", "workers.agent", "register", "--server", url, "--token", registration
        )
        assert reg.returncode == 0, reg.stdout + reg.stderr
        assert (node_dir / "worker.json").stat().st_mode & 0o777 == 0o600
        worker = Worker.objects.get(owner=alice)

        with p.spawn([*agent, "run", *node_broker], tmp_path / "agent.log", node_env(), cwd=node_dir):
            p.wait_for(lambda: Worker.objects.get(pk=worker.pk).is_online, 60, "the node never sent a heartbeat")

            # Posted through the live API, as a requester would: the platform's own
            # processes schedule it to the node.
            _, api_token = marketplace.create_api_token(bob, "requester")
            posted = httpx.post(
                f"{url}/api/v1/tasks/",
                json={"kind": "synthetic", "budget": "1", "spec": {"n": 256}},
                headers={"Authorization": f"Token {api_token}"},
                timeout=30,
            )
            assert posted.status_code == 201, posted.text
            task_id = posted.json()["id"]

            def settled() -> bool:
                return Task.objects.get(pk=task_id).status in (TaskStatus.COMPLETED, TaskStatus.FAILED)

            def explain() -> str:
                task = Task.objects.get(pk=task_id)
                states = list(Assignment.objects.filter(task=task).values_list("state", "reason"))
                logs = "\n".join(
                    f"--- {name}\n{(tmp_path / name).read_text()[-2500:]}" for name in ("agent.log", "platform.log")
                )
                return f"task {task.status} ({task.status_reason}); assignments {states}\n{logs}"

            p.wait_for(settled, 180, "the task was not settled", explain=explain)

    task = Task.objects.get(pk=task_id)
    assert task.status == TaskStatus.COMPLETED, explain()
    assignment = Assignment.objects.get(task=task)
    assert assignment.worker_id == worker.pk
    assert assignment.state == Assignment.State.ACCEPTED
    assert ledger.address_balance(worker.address) > 0
    assert ledger.balance(bob) < 1000 * UNITS_PER_CREDIT
