"""Faults with real processes: a node killed with SIGKILL mid-task, and a node suspended
while connected. The platform's periodic pass (workers.tasks.schedule_waiting, what beat
runs) is called from the test instead of a beat process, on the same database."""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.conf import settings

from ledger import services as ledger
from ledger.sealer import seal_all
from ledger.units import UNITS_PER_CREDIT
from marketplace import services as marketplace
from marketplace.models import Task, TaskStatus
from tests.factories import post_task
from tests.workers import processes as p
from workers.agent.identity import Credentials, credentials_path
from workers.assignments.settlement import reward_per_replica
from workers.models import Assignment, Worker
from workers.tasks import schedule_waiting

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# Above the agent's 10 s heartbeat period, so a live node never looks silent.
HEARTBEAT_TIMEOUT = 12


@pytest.fixture
def short_heartbeat(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.WORKER_HEARTBEAT_TIMEOUT = HEARTBEAT_TIMEOUT
    monkeypatch.setenv("PROOFWORK_WORKER_HEARTBEAT_TIMEOUT", str(HEARTBEAT_TIMEOUT))


def logs(tmp: Path, *names: str) -> str:
    return "\n".join(f"--- {n}\n{(tmp / n).read_text(errors='replace')[-2500:]}" for n in names if (tmp / n).exists())


def test_a_node_killed_mid_task_has_its_job_finished_by_another(
    alice: Any, bob: Any, tmp_path: Path, short_heartbeat: None
) -> None:
    env = p.child_env()
    inits = [p.start_init(tmp_path, "first"), p.start_init(tmp_path, "second")]  # while daphne starts
    with p.daphne(tmp_path) as url, p.platform_worker(tmp_path) as platform:
        first_key = p.register_agent(tmp_path, url, alice, "first", inits[0])
        second_key = p.register_agent(tmp_path, url, alice, "second", inits[1])
        first = Worker.objects.get(name="first")
        second = Worker.objects.get(name="second")
        with p.spawn(p.agent_cmd(first_key, "run", *p.broker_args()), tmp_path / "first.log", env) as victim:
            p.wait_for(lambda: Worker.objects.get(pk=first.pk).is_online, 60, "the first agent never connected")
            ledger.deposit(bob, 10 * UNITS_PER_CREDIT, reference="test-deposit")
            # Big enough to take a few seconds on a CPU, so the kill lands mid-run.
            task = post_task(bob, "synthetic", {"n": 1024, "count": 6}, budget=UNITS_PER_CREDIT)

            def first_running() -> bool:
                schedule_waiting()
                return Assignment.objects.filter(task=task, worker=first, state=Assignment.State.RUNNING).exists()

            p.wait_for(first_running, 60, "the first agent never started", explain=lambda: logs(tmp_path, "first.log"))
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait(timeout=10)
        assert Assignment.objects.get(task=task, worker=first).state == Assignment.State.RUNNING

        with p.spawn(p.agent_cmd(second_key, "run", *p.broker_args()), tmp_path / "second.log", env) as agent:

            def finished() -> bool:
                schedule_waiting()  # expires the silent node's job and hands it on, as beat would
                return Task.objects.get(pk=task.pk).status in (TaskStatus.COMPLETED, TaskStatus.FAILED)

            def explain() -> str:
                states = list(Assignment.objects.filter(task=task).values_list("worker__name", "state", "reason"))
                t = Task.objects.get(pk=task.pk)
                return f"task {t.status} ({t.status_reason}); {states}\n" + logs(tmp_path, "second.log", "platform.log")

            p.wait_for(finished, 150, "the job was not finished elsewhere", interval=1.0, explain=explain)
            p.stop(agent, platform)  # together: each takes seconds to shut down

    task.refresh_from_db()
    assert task.status == TaskStatus.COMPLETED, task.status_reason
    killed = Assignment.objects.get(task=task, worker=first)
    assert killed.state == Assignment.State.EXPIRED
    assert "silent" in killed.reason
    finished_by = Assignment.objects.get(task=task, worker=second)
    assert finished_by.state == Assignment.State.ACCEPTED
    assert finished_by.attempt == 2
    assert task.result_summary["workers"] == [second.address]
    assert Worker.objects.get(pk=first.pk).jobs_done == 0
    assert Worker.objects.get(pk=second.pk).jobs_done == 1


def test_the_only_node_killed_mid_task_and_restarted_completes_it(
    alice: Any, bob: Any, tmp_path: Path, short_heartbeat: None
) -> None:
    """kill -9 of the only fitting node mid-job, then the same node (same key) started
    again: its lost job is given up (the restarted node abandons it, or it expires as
    silent, whichever comes first), the task is offered to it again, and it completes,
    verified and paid. On the filesystem broker the lost message was deleted as it was
    received; on Redis it stays unacknowledged (a day's visibility timeout); RabbitMQ
    delivers it again to the restarted node, which finds its job over ("already-expired")
    and then runs the new offer. Run it on each with CELERY_BROKER_URL."""
    env = p.child_env()
    init = p.start_init(tmp_path, "only")  # while daphne starts
    with p.daphne(tmp_path) as url, p.platform_worker(tmp_path) as platform:
        key = p.register_agent(tmp_path, url, alice, "only", init)
        node = Worker.objects.get(name="only")
        assert ledger.address_balance(node.address) == 0
        ledger.deposit(bob, 10 * UNITS_PER_CREDIT, reference="test-deposit")
        requester_before = ledger.balance(bob)
        with p.spawn(p.agent_cmd(key, "run", *p.broker_args()), tmp_path / "first.log", env) as victim:
            p.wait_for(lambda: Worker.objects.get(pk=node.pk).is_online, 60, "the agent never connected")
            # Big enough to take a few seconds on a CPU, so the kill lands mid-run.
            task = post_task(bob, "synthetic", {"n": 1024, "count": 6}, budget=UNITS_PER_CREDIT)

            def running() -> bool:
                schedule_waiting()
                return Assignment.objects.filter(task=task, worker=node, state=Assignment.State.RUNNING).exists()

            p.wait_for(running, 60, "the agent never started", explain=lambda: logs(tmp_path, "first.log"))
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait(timeout=10)
        (lost,) = Assignment.objects.filter(task=task)
        assert lost.state == Assignment.State.RUNNING

        with p.spawn(p.agent_cmd(key, "run", *p.broker_args()), tmp_path / "again.log", env) as agent:

            def finished() -> bool:
                schedule_waiting()  # as beat would: expiry, re-offers
                return Task.objects.get(pk=task.pk).status in (TaskStatus.COMPLETED, TaskStatus.FAILED)

            def explain() -> str:
                rows = Assignment.objects.filter(task=task).order_by("attempt")
                states = list(rows.values_list("attempt", "state", "reason"))
                t = Task.objects.get(pk=task.pk)
                return f"task {t.status} ({t.status_reason}); {states}\n" + logs(tmp_path, "again.log", "platform.log")

            p.wait_for(finished, 180, "the restarted node did not complete the task", interval=1.0, explain=explain)
            p.stop(agent, platform)  # together: each takes seconds to shut down

    task.refresh_from_db()
    assert task.status == TaskStatus.COMPLETED, task.status_reason
    lost.refresh_from_db()
    assert lost.state == Assignment.State.EXPIRED
    assert "restarted" in lost.reason or "silent" in lost.reason
    done = Assignment.objects.get(task=task, state=Assignment.State.ACCEPTED)
    assert (done.worker_id, done.attempt) == (node.pk, 2)
    assert task.result_summary["workers"] == [node.address]
    # Paid: the node's balance rose by its reward (less the platform's fee), the requester
    # paid that reward and got the rest of the escrow back, and the escrow is empty.
    reward = reward_per_replica(task)
    node_row = Worker.objects.get(pk=node.pk)
    assert node_row.jobs_done == 1
    assert 0 < node_row.earnings <= reward
    # What it can spend: the reward less the gas of its SUBMIT_RESULT (it held nothing before).
    assert 0 < ledger.address_balance(node.address) <= node_row.earnings
    assert ledger.balance(bob) == requester_before - reward
    escrow = ledger.escrow_account(task.pk)
    assert escrow is not None
    seal_all()
    escrow.refresh_from_db()
    assert (escrow.available, escrow.balance) == (0, 0)


def test_a_suspended_node_loses_its_socket_and_its_token(alice: Any, tmp_path: Path) -> None:
    env = p.child_env()
    init = p.start_init(tmp_path, "node")  # while daphne starts
    with p.daphne(tmp_path) as url:
        key = p.register_agent(tmp_path, url, alice, "node", init)
        worker = Worker.objects.get(name="node")
        token = Credentials.load(credentials_path(key)).token
        with p.spawn(p.agent_cmd(key, "run", *p.broker_args()), tmp_path / "agent.log", env):
            p.wait_for(lambda: Worker.objects.get(pk=worker.pk).is_online, 60, "the agent never connected")
            assert (
                httpx.get(
                    f"{url}/api/v1/assignments/{uuid.uuid4()}/", headers={"Authorization": f"Worker {token}"}
                ).status_code
                == 404
            )

            _, api_token = marketplace.create_api_token(alice, "e2e")
            response = httpx.post(
                f"{url}/api/v1/workers/{worker.pk}/suspend/", headers={"Authorization": f"Token {api_token}"}
            )
            assert response.status_code == 200, response.text
            assert response.json()["state"] == "suspended"

            # The platform closes the node's socket (4403); on a node broker, the broker
            # connection may be closed first, and the node closes its socket itself.
            closed = ["refuses this node's socket (4403)"]
            if settings.NODE_BROKER_URL:
                closed.append("no broker connection: the socket closes")
            p.wait_for(
                lambda: any(line in (tmp_path / "agent.log").read_text(errors="replace") for line in closed),
                20,
                "the agent's socket was not closed",
                explain=lambda: logs(tmp_path, "agent.log", "daphne.log"),
            )
            refused = httpx.get(
                f"{url}/api/v1/assignments/{uuid.uuid4()}/", headers={"Authorization": f"Worker {token}"}
            )
            assert refused.status_code == 401
            assert refused.json() == {
                "detail": "Invalid worker token, or the worker is suspended or retired, or its owner's account is deactivated."
            }
    assert not Worker.objects.get(pk=worker.pk).is_online
