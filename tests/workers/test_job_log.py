"""A job's whole log: every line a node sends is stored, within a bound per job that no node
can push past, and read back by the task's owner alone (``log.json``, ``log.txt``)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from ledger.units import UNITS_PER_CREDIT
from tests.factories import make_worker, post_task
from tests.workers.test_consumer import barrier, run, socket
from tests.workers.test_pages import login, make_assignment
from workers.api import node_socket
from workers.assignments import jobs, scheduler
from workers.live import log as job_log
from workers.models import Assignment, LogLine

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def job(alice: Any, bob: Any) -> dict[str, Any]:
    """alice's online worker running bob's synthetic task."""
    worker, raw, _ = make_worker(alice, name="alpha")
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    (assignment,) = scheduler.schedule(task.pk)
    jobs.start(worker, assignment.pk)
    return {"worker": worker, "token": raw, "task": task, "assignment": assignment}


def stored(assignment: Assignment) -> list[tuple[int, str]]:
    return list(LogLine.objects.filter(assignment=assignment).order_by("number").values_list("number", "text"))


# --- Storage ------------------------------------------------------------------------------


def test_every_line_is_stored_numbered_and_the_tail_is_the_last_of_them(job: dict[str, Any]) -> None:
    assignment = job["assignment"]
    lines = [f"line {i}" for i in range(1, 451)]
    for start in range(0, 450, 50):
        job_log.append(str(assignment.pk), lines[start : start + 50])
    assignment.refresh_from_db()
    assert stored(assignment) == [(i, f"line {i}") for i in range(1, 451)]
    assert assignment.log_count == 450
    assert assignment.log_tail == lines[-job_log.LOG_TAIL :]


def test_only_the_newest_lines_are_kept_and_each_is_cut(job: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(job_log, "LOG_KEEP", 30)
    assignment = job["assignment"]
    for batch in range(4):
        job_log.append(str(assignment.pk), [f"{batch}:{i}:" + "x" * 900 for i in range(20)])
    assignment.refresh_from_db()
    rows = stored(assignment)
    assert [number for number, _ in rows] == list(range(51, 81))
    assert rows[-1][1].startswith("3:19:")
    assert {len(text) for _, text in rows} == {job_log.LOG_LINE_CHARS}
    assert assignment.log_count == 80
    page = job_log.page(assignment, 0)
    assert (page["first"], page["count"], len(page["lines"])) == (51, 80, 30)


def test_a_flooding_node_cannot_store_more_than_the_bound(job: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A node sends as many lines as it may, each far too long: the job's stored log stays
    within LOG_KEEP lines of LOG_LINE_CHARS, and the newest lines are the ones kept."""
    monkeypatch.setattr(job_log, "LOG_KEEP", 120)
    monkeypatch.setattr(node_socket, "LOG_FLUSH_INTERVAL", 0.0)
    assignment = job["assignment"]

    async def scenario() -> None:
        comm = socket(job["token"])
        assert (await comm.connect())[0]
        for batch in range(8):
            lines = [f"batch {batch} line {i} " + "y" * 5000 for i in range(80)]  # 80 lines: 50 are read
            await comm.send_json_to({"type": "log", "assignment_id": str(assignment.pk), "lines": lines})
        await barrier(comm)
        await comm.disconnect(timeout=5)

    run(scenario)
    assignment.refresh_from_db()
    rows = stored(assignment)
    assert len(rows) == 120
    assert max(len(text) for _, text in rows) == job_log.LOG_LINE_CHARS
    assert rows[-1][1].startswith("batch 7 line 49 ")
    assert assignment.log_count == 8 * node_socket.LOG_BATCH
    assert len(assignment.log_tail) == job_log.LOG_TAIL


def test_forged_log_messages_store_nothing(job: dict[str, Any], carol: Any) -> None:
    """Lines for another node's job, lines that are not strings or hold a NUL, and a copy of
    the platform's stop line are refused with an error; nothing reaches the job's log."""
    assignment = job["assignment"]
    _, other_raw, _ = make_worker(carol, name="gamma")

    async def scenario() -> None:
        mine = socket(job["token"])
        assert (await mine.connect())[0]
        for lines in (["ok", 7], ["nul \x00 byte"], "not a list", ["Stopped by the platform: cancelled"]):
            await mine.send_json_to({"type": "log", "assignment_id": str(assignment.pk), "lines": lines})
            assert (await mine.receive_json_from(timeout=5))["type"] == "error"
        await mine.disconnect(timeout=5)
        theirs = socket(other_raw)
        assert (await theirs.connect())[0]
        await theirs.send_json_to({"type": "log", "assignment_id": str(assignment.pk), "lines": ["forged"]})
        assert (await theirs.receive_json_from(timeout=5))["type"] == "error"
        await theirs.disconnect(timeout=5)

    run(scenario)
    assignment.refresh_from_db()
    assert stored(assignment) == []
    assert assignment.log_count == 0


# --- Reading: the owner alone -------------------------------------------------------------


def test_the_owner_pages_through_the_log(job: dict[str, Any]) -> None:
    assignment = job["assignment"]
    job_log.append(str(assignment.pk), [f"l{i}" for i in range(1, 6)])
    client = login("bob")
    url = f"/workers/tasks/{job['task'].pk}/log.json"
    first = client.get(url, {"assignment": str(assignment.pk), "limit": "2"}).json()
    assert first["lines"] == [[1, "l1"], [2, "l2"]]
    assert (first["next"], first["count"], first["first"], first["worker"]) == (2, 5, 1, "alpha")
    rest = client.get(url, {"assignment": str(assignment.pk), "after": "2"}).json()
    assert rest["lines"] == [[3, "l3"], [4, "l4"], [5, "l5"]]
    assert rest["next"] is None

    download = client.get(f"/workers/tasks/{job['task'].pk}/log.txt")
    assert download.status_code == 200
    assert download["Content-Type"] == "text/plain; charset=utf-8"
    assert "attachment" in download["Content-Disposition"]
    body = download.getvalue().decode()
    assert body == "# alpha, attempt 1 (5 lines)\nl1\nl2\nl3\nl4\nl5\n"


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"after": "-1"}, "after"),
        ({"after": "x"}, "after"),
        ({"limit": "5000"}, "limit"),
        ({"assignment": "7"}, "assignment"),
    ],
)
def test_bad_parameters_are_a_400_naming_the_field(job: dict[str, Any], query: dict[str, str], field: str) -> None:
    params = {"assignment": str(job["assignment"].pk), **query}
    response = login("bob").get(f"/workers/tasks/{job['task'].pk}/log.json", params)
    assert response.status_code == 400
    assert field in response.json()


def test_nobody_but_the_owner_reads_the_log(job: dict[str, Any], alice: Any, carol: Any) -> None:
    """Another requester, the provider whose node ran the task, and a provider of another
    task get a 404; a job of another task named under this task is a 404; signed out, the login."""
    assignment = job["assignment"]
    job_log.append(str(assignment.pk), ["secret step"])
    task = job["task"]
    carols_worker, _, _ = make_worker(carol, name="gamma")
    carols_task = post_task(carol, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    make_assignment(carols_task, carols_worker)
    params = {"assignment": str(assignment.pk)}
    for user in ("alice", "carol"):
        client = login(user)
        assert client.get(f"/workers/tasks/{task.pk}/log.json", params).status_code == 404
        assert client.get(f"/workers/tasks/{task.pk}/log.txt").status_code == 404
    # carol's own task does not open bob's job's log.
    assert login("carol").get(f"/workers/tasks/{carols_task.pk}/log.json", params).status_code == 404
    anonymous = Client().get(f"/workers/tasks/{task.pk}/log.json", params)
    assert anonymous.status_code == 302
    assert "/accounts/login/" in anonymous["Location"]
