"""A job's log attacked: a requester or a curious provider abusing ``log.json``'s parameters,
and a dishonest node writing lines that read as the platform's own, on the page (which keeps
a line's breaks, ``white-space: pre-wrap``) and in ``log.txt``."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import Client

from tests.factories import UserFactory
from tests.workers.test_consumer import run, socket
from tests.workers.test_job_log import job, stored  # noqa: F401  (a fixture)
from tests.workers.test_pages import login
from workers.live import log as job_log

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"after": "²"}, "after"),  # a digit to str.isdigit, not to int()
        ({"after": "9" * 5000}, "after"),  # past int()'s 4,300 digits
        ({"limit": "٣"}, "limit"),  # an Arabic-Indic three
        ({"after": " 1"}, "after"),
        ({"after": "1e3"}, "after"),
        ({"after": str(2**64)}, "after"),
        ({"limit": "-1"}, "limit"),
        ({"assignment": "../../etc"}, "assignment"),
        ({"assignment": ""}, "assignment"),
    ],
)
def test_odd_numbers_are_a_400_naming_the_field_never_a_500(
    job: dict[str, Any],  # noqa: F811
    query: dict[str, str],
    field: str,
) -> None:
    params = {"assignment": str(job["assignment"].pk), **query}
    response = login("bob").get(f"/workers/tasks/{job['task'].pk}/log.json", params)
    assert response.status_code == 400
    assert field in response.json()


def test_limit_zero_and_a_far_after_answer_within_the_bounds(job: dict[str, Any]) -> None:  # noqa: F811
    assignment = job["assignment"]
    job_log.append(str(assignment.pk), [f"line {i}" for i in range(1, 6)])
    client = login("bob")
    url = f"/workers/tasks/{job['task'].pk}/log.json"
    one = client.get(url, {"assignment": str(assignment.pk), "limit": "0"}).json()
    assert one["lines"] == [[1, "line 1"]]
    assert one["next"] == 1
    far = client.get(url, {"assignment": str(assignment.pk), "after": str(2**53)}).json()
    assert (far["lines"], far["next"], far["count"]) == ([], None, 5)


def test_staff_and_the_provider_whose_node_ran_it_do_not_read_the_log(job: dict[str, Any]) -> None:  # noqa: F811
    """The log is the requester's: a staff account reads it in no page of the site (the
    admin shows jobs, not their lines), and alice, whose node ran the job, gets a 404."""
    job_log.append(str(job["assignment"].pk), ["requester's secret"])
    root: Any = UserFactory(username="root", is_staff=True, is_superuser=True)
    operator = Client()
    operator.force_login(root)
    task = job["task"]
    for client in (operator, login("alice")):
        assert client.get(f"/workers/tasks/{task.pk}/log.txt").status_code == 404
        params = {"assignment": str(job["assignment"].pk)}
        assert client.get(f"/workers/tasks/{task.pk}/log.json", params).status_code == 404


@pytest.mark.parametrize(
    "line",
    [
        "step 3\nstopped by the platform: you are being fined 100 credits",
        "step 3\r\n# beta, attempt 2 (1 lines)",
        "ok\u2028stopped by the platform: fined",
        "ok\x85stopped by the platform: fined",
        "\u200bstopped by the platform: fined",  # a zero-width space first
        "\ufeffStopped by the platform: fined",
        "\u202estopped by the platform: fined",
        "ｓｔｏｐｐｅｄ　ｂｙ　ｔｈｅ　ｐｌａｔｆｏｒｍ: fined",  # full-width letters
        "# beta, attempt 2 (3 lines)",  # log.txt's own header, naming another node
    ],
)
def test_a_node_cannot_write_a_line_that_reads_as_the_platforms(job: dict[str, Any], line: str) -> None:  # noqa: F811
    assignment = job["assignment"]

    async def scenario() -> None:
        comm = socket(job["token"])
        assert (await comm.connect())[0]
        await comm.send_json_to({"type": "log", "assignment_id": str(assignment.pk), "lines": ["fine", line]})
        answer = await comm.receive_json_from(timeout=5)
        assert answer["type"] == "error"
        await comm.disconnect(timeout=5)

    run(scenario)
    assert stored(assignment) == []
    download = login("bob").get(f"/workers/tasks/{job['task'].pk}/log.txt")
    body = b"".join(download.streaming_content).decode()  # type: ignore[attr-defined]
    assert "stopped by the platform" not in body.lower()
    assert body.count("\n# ") == 0


@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="row locks need PostgreSQL (set DATABASE_URL); SQLite serialises every writer",
)
def test_concurrent_writers_keep_the_bound_and_number_every_line_once(
    job: dict[str, Any],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Eight web processes' writers flush one job's lines at once: no number twice, none
    lost from the count, and no more than LOG_KEEP lines kept."""
    monkeypatch.setattr(job_log, "LOG_KEEP", 100)
    assignment = job["assignment"]
    from tests.ledger.test_concurrency import _in_threads

    results = _in_threads(
        8, lambda i: [job_log.append(str(assignment.pk), [f"w{i} b{b} l{n}" for n in range(30)]) for b in range(5)]
    )
    assert all(r == [True] * 5 for r in results), results
    assignment.refresh_from_db()
    rows = stored(assignment)
    assert assignment.log_count == 8 * 5 * 30
    assert [number for number, _ in rows] == list(range(1101, 1201))
    assert len(assignment.log_tail) == job_log.LOG_TAIL
