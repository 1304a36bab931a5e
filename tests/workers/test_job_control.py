"""The platform stops a node's running job over ``/ws/worker/`` (workers.assignments.control): who gets
the ``stop``, when, and what each way of ending a job costs the worker. Also the attacks:
a node cannot stop, read or write another node's job, nor forge the platform's words."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client
from django.utils import timezone

from ledger.units import UNITS_PER_CREDIT
from marketplace import services as marketplace
from marketplace.models import TaskEvent
from tests.factories import UserFactory, make_worker, post_task
from tests.workers.test_consumer import barrier, run, socket
from workers.assignments import jobs, scheduler
from workers.identity import services
from workers.models import Assignment, Worker

pytestmark = pytest.mark.django_db(transaction=True)

CANCELLED = "The requester cancelled the task."


def running_job(owner: Any, requester: Any, name: str) -> dict[str, Any]:
    """``owner``'s online worker running ``requester``'s synthetic task."""
    worker, raw, _ = make_worker(owner, name=name)
    task = post_task(requester, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    (assignment,) = scheduler.schedule(task.pk)
    assert assignment.worker == worker
    jobs.start(worker, assignment.pk)
    return {"worker": worker, "token": raw, "task": task, "assignment": assignment}


@pytest.fixture
def job(alice: Any, bob: Any) -> dict[str, Any]:
    return running_job(alice, bob, "alpha")


async def quiet(comm: WebsocketCommunicator) -> bool:
    """Nothing arrives on the socket for a moment."""
    return await comm.receive_nothing(timeout=0.3)


def stop_of(assignment: Assignment, reason: str) -> dict[str, Any]:
    return {"type": "stop", "assignment_id": str(assignment.pk), "reason": reason}


def test_a_cancelled_task_stops_its_node_and_only_its_node(job: dict[str, Any], bob: Any, carol: Any) -> None:
    other = running_job(carol, bob, "beta")

    async def scenario() -> None:
        mine, theirs = socket(job["token"]), socket(other["token"])
        assert (await mine.connect())[0]
        assert (await theirs.connect())[0]
        await sync_to_async(marketplace.cancel_task)(bob, job["task"].pk)
        assert await mine.receive_json_from(timeout=5) == stop_of(job["assignment"], CANCELLED)
        assert await quiet(theirs)  # another node's socket hears nothing of it
        await mine.disconnect()
        await theirs.disconnect()

    run(scenario)
    assert Assignment.objects.get(pk=job["assignment"].pk).state == Assignment.State.EXPIRED
    assert Assignment.objects.get(pk=other["assignment"].pk).state == Assignment.State.RUNNING


def test_a_stop_sent_while_the_socket_was_down_answers_the_next_heartbeat_progress_and_log(
    job: dict[str, Any], bob: Any
) -> None:
    marketplace.cancel_task(bob, job["task"].pk)  # no socket open: the stop reaches nobody
    assignment = job["assignment"]
    ended = stop_of(assignment, CANCELLED)

    async def scenario() -> None:
        comm = socket(job["token"])
        assert (await comm.connect())[0]
        await comm.send_json_to({"type": "heartbeat", "assignment_id": str(assignment.pk)})
        assert await comm.receive_json_from(timeout=5) == ended
        progress = {"type": "progress", "assignment_id": str(assignment.pk), "step": 1, "total": 4}
        await comm.send_json_to(progress)
        assert await comm.receive_json_from(timeout=5) == ended
        await comm.send_json_to({"type": "log", "assignment_id": str(assignment.pk), "lines": ["epoch 2"]})
        assert await comm.receive_json_from(timeout=5) == ended
        await comm.send_json_to({"type": "heartbeat"})  # a heartbeat naming no job is only a heartbeat
        assert await quiet(comm)
        await comm.disconnect()

    run(scenario)
    stored = Assignment.objects.get(pk=assignment.pk)
    assert stored.progress == 0
    assert "epoch 2" not in stored.log_tail


def test_the_nodes_stopped_puts_the_platforms_reason_on_the_log_once(job: dict[str, Any], bob: Any) -> None:
    marketplace.cancel_task(bob, job["task"].pk)
    assignment = job["assignment"]

    async def scenario() -> None:
        comm = socket(job["token"])
        assert (await comm.connect())[0]
        for _ in range(3):  # replayed: still one line
            await comm.send_json_to({"type": "stopped", "assignment_id": str(assignment.pk), "reason": "lies"})
        await barrier(comm)
        await comm.disconnect()

    run(scenario)
    tail = Assignment.objects.get(pk=assignment.pk).log_tail
    assert tail.count(f"stopped by the platform: {CANCELLED}") == 1
    assert not any("lies" in line for line in tail)


def test_a_node_cannot_write_the_platforms_stop_line_itself(job: dict[str, Any], bob: Any) -> None:
    """The job's log says "stopped by the platform: <reason>" in the platform's words, once.
    A node writing that line itself, before any stop, would both put words in the
    platform's mouth on the requester's page and, the line being there already, keep the
    real one out when the platform does stop the job."""
    assignment = job["assignment"]
    forged = f"stopped by the platform: {CANCELLED}"

    async def scenario() -> None:
        comm = socket(job["token"])
        assert (await comm.connect())[0]
        await comm.send_json_to({"type": "log", "assignment_id": str(assignment.pk), "lines": ["epoch 1", forged]})
        assert (await comm.receive_json_from(timeout=5))["type"] == "error"
        await barrier(comm)
        await sync_to_async(marketplace.cancel_task)(bob, job["task"].pk)
        assert (await comm.receive_json_from(timeout=5))["type"] == "stop"
        await comm.send_json_to({"type": "stopped", "assignment_id": str(assignment.pk)})
        await barrier(comm)
        await comm.disconnect()

    run(scenario)
    assert Assignment.objects.get(pk=assignment.pk).log_tail == [forged]  # the platform's, after the stop


def test_a_node_cannot_learn_stop_or_write_another_nodes_job(job: dict[str, Any], bob: Any, carol: Any) -> None:
    """carol's node names alice's job: it learns nothing of it, and writes nothing to it,
    whether that job runs or was ended; its own running job cannot be 'stopped' by it."""
    other = running_job(carol, bob, "beta")
    theirs, own = job["assignment"], other["assignment"]

    async def attempt(comm: WebsocketCommunicator, assignment: Assignment) -> None:
        await comm.send_json_to({"type": "heartbeat", "assignment_id": str(assignment.pk)})
        assert await quiet(comm)
        await comm.send_json_to({"type": "stopped", "assignment_id": str(assignment.pk)})
        reply = await comm.receive_json_from(timeout=5)
        assert reply["type"] == "error"
        await comm.send_json_to({"type": "progress", "assignment_id": str(assignment.pk), "step": 1, "total": 4})
        assert (await comm.receive_json_from(timeout=5))["type"] == "error"

    async def scenario() -> None:
        victim, comm = socket(job["token"]), socket(other["token"])
        assert (await victim.connect())[0]
        assert (await comm.connect())[0]
        await attempt(comm, theirs)  # running
        for forged in ({"type": "stop", "assignment_id": str(theirs.pk)}, {"type": "worker.stop"}):
            await comm.send_json_to(forged)  # the platform's own message types are not the node's
            assert await comm.receive_json_from(timeout=5) == {"type": "error", "detail": "Unknown message type."}
        await comm.send_json_to({"type": "stopped", "assignment_id": str(own.pk)})  # its own, still running
        assert (await comm.receive_json_from(timeout=5))["type"] == "error"
        assert await quiet(victim)  # nothing reached alice's node
        await sync_to_async(marketplace.cancel_task)(bob, job["task"].pk)
        assert (await victim.receive_json_from(timeout=5))["type"] == "stop"
        await attempt(comm, theirs)  # ended
        await victim.disconnect()
        await comm.disconnect()

    run(scenario)
    assert Assignment.objects.get(pk=theirs.pk).log_tail == []
    assert Assignment.objects.get(pk=own.pk).state == Assignment.State.RUNNING


@pytest.mark.parametrize("target", ["suspended", "retired"])
def test_an_operators_suspension_stops_the_job_at_once_without_penalty(
    job: dict[str, Any], alice: Any, target: str
) -> None:
    worker, assignment, task = job["worker"], job["assignment"], job["task"]
    before = Worker.objects.get(pk=worker.pk).reputation
    reason = f"An operator {target} the worker."

    async def scenario() -> None:
        comm = socket(job["token"])
        assert (await comm.connect())[0]
        await sync_to_async(services.set_worker_state)(
            alice, worker.pk, target, by_platform=True, reason="hardware fault reported"
        )
        # The stop comes first, then the close of a socket whose worker may no longer act.
        assert await comm.receive_json_from(timeout=5) == stop_of(assignment, reason)
        assert await comm.receive_output(timeout=5) == {"type": "websocket.close", "code": 4403}

    run(scenario)
    stored = Assignment.objects.get(pk=assignment.pk)
    assert (stored.state, stored.reason) == (Assignment.State.EXPIRED, reason)
    assert Worker.objects.get(pk=worker.pk).reputation == before
    timeline = list(TaskEvent.objects.filter(task=task).values_list("message", flat=True))
    assert f"An operator {target} the worker running this job; reassigning." in timeline


@pytest.mark.parametrize("target", ["suspended", "retired"])
def test_the_owners_suspension_is_a_reported_give_up(job: dict[str, Any], alice: Any, target: str) -> None:
    worker, assignment = job["worker"], job["assignment"]
    before = Worker.objects.get(pk=worker.pk).reputation
    services.set_worker_state(alice, worker.pk, target)
    stored = Assignment.objects.get(pk=assignment.pk)
    assert (stored.state, stored.reason) == (Assignment.State.EXPIRED, f"The worker's owner {target} it.")
    assert Worker.objects.get(pk=worker.pk).reputation == before - jobs.FAIL_PENALTY
    timeline = list(TaskEvent.objects.filter(task=job["task"]).values_list("message", flat=True))
    assert f"The owner of alpha {target} it; reassigning." in timeline


def test_a_job_expired_at_its_deadline_is_stopped_on_its_node(job: dict[str, Any]) -> None:
    assignment = job["assignment"]
    Assignment.objects.filter(pk=assignment.pk).update(deadline=timezone.now() - timedelta(seconds=1))

    async def scenario() -> None:
        comm = socket(job["token"])
        assert (await comm.connect())[0]
        assert await sync_to_async(scheduler.expire_overdue)() == 1
        reply = await comm.receive_json_from(timeout=5)
        assert reply == stop_of(assignment, "Deadline passed or the worker went silent.")
        await comm.disconnect()

    run(scenario)


def test_a_task_failed_with_a_live_replica_stops_it(job: dict[str, Any], bob: Any) -> None:
    task, assignment = job["task"], job["assignment"]
    # Its other attempts are used up: the next pass fails the task and ends the live job.
    task.max_attempts = 1
    task.save(update_fields=["max_attempts"])
    Assignment.objects.create(
        task=task, worker=job["worker"], attempt=9, seed_block_hash="0" * 64, deadline=timezone.now(), state="expired"
    )

    async def scenario() -> None:
        comm = socket(job["token"])
        assert (await comm.connect())[0]
        await sync_to_async(scheduler.schedule)(task.pk)
        reply = await comm.receive_json_from(timeout=5)
        assert reply == stop_of(assignment, "The task failed: its other attempts were used up.")
        await comm.disconnect()

    run(scenario)


def test_the_nodes_own_fail_and_submit_send_no_stop(job: dict[str, Any]) -> None:
    async def scenario() -> None:
        comm = socket(job["token"])
        assert (await comm.connect())[0]
        await sync_to_async(jobs.fail)(job["worker"], job["assignment"].pk, "out of memory")
        assert await quiet(comm)
        await comm.disconnect()

    run(scenario)


def test_the_workers_page_and_the_admin_say_which_job_a_busy_node_runs(
    job: dict[str, Any], alice: Any, client: Client, django_assert_max_num_queries: Any
) -> None:
    Assignment.objects.filter(pk=job["assignment"].pk).update(progress=42.0)
    client.force_login(alice)
    page = client.get(f"/workers/{job['worker'].pk}/").content.decode()
    current = page[page.index('id="current-job"') :]
    current = current[: current.index("</section>")]
    for shown in ("Running now", job["task"].title, "synthetic", "42.0 %"):
        assert shown in current

    root: Any = UserFactory(username="root", is_staff=True, is_superuser=True)
    client.force_login(root)
    for _ in range(3):  # more busy nodes cost no more queries (prefetched)
        running_job(UserFactory(), alice, "more")
    with django_assert_max_num_queries(12):
        listing = client.get("/admin/workers/worker/").content.decode()
    assert f"Running synthetic “{job['task'].title}” since" in listing
    assert "42 %" in listing
    detail = client.get(f"/admin/workers/worker/{job['worker'].pk}/change/").content.decode()
    assert job["task"].title in detail

    marketplace.cancel_task(job["task"].owner, job["task"].pk)
    client.force_login(alice)
    assert 'id="current-job"' not in client.get(f"/workers/{job['worker'].pk}/").content.decode()


@pytest.mark.parametrize("bad", [{"a": 1}, 12345, "not-a-uuid", "x" * 5000])
def test_a_malformed_assignment_id_in_heartbeat_or_stopped_is_answered_not_a_crash(
    job: dict[str, Any], bad: Any
) -> None:
    """The new fields a node sends (a heartbeat's assignment_id, stopped's) take any JSON:
    the socket answers (or ignores) them and stays open for the next message."""

    async def scenario() -> None:
        comm = socket(job["token"])
        assert (await comm.connect())[0]
        await comm.send_json_to({"type": "heartbeat", "assignment_id": bad})
        assert await quiet(comm)
        await comm.send_json_to({"type": "stopped", "assignment_id": bad})
        assert (await comm.receive_json_from(timeout=5))["type"] == "error"
        await comm.send_json_to({"type": "progress", "assignment_id": str(job["assignment"].pk), "step": 1, "total": 4})
        assert await quiet(comm)  # still open, and its own job's progress is taken
        await comm.disconnect()

    run(scenario)
    assert Assignment.objects.get(pk=job["assignment"].pk).state == Assignment.State.RUNNING


@pytest.mark.parametrize(
    ("by_platform", "reason", "cost"), [(True, "An operator", 0), (False, "The worker's owner", 3)]
)
def test_a_suspension_costs_the_same_when_the_periodic_expiry_ends_the_job_first(
    job: dict[str, Any], alice: Any, monkeypatch: pytest.MonkeyPatch, by_platform: bool, reason: str, cost: int
) -> None:
    """The suspension commits, then its jobs end (``end_worker_jobs``); a scheduler pass in
    between (every few seconds, and the broker calls after the commit may take seconds)
    finds a suspended worker's live job and expires it itself. It must not turn an
    operator's free suspension into the silent worker's penalty, nor say it went silent."""
    worker, assignment = job["worker"], job["assignment"]
    before = Worker.objects.get(pk=worker.pk).reputation
    real = services.end_worker_jobs

    def racing(*args: Any, **kwargs: Any) -> int:
        scheduler.expire_overdue()  # the periodic pass lands between the commit and the jobs' end
        return real(*args, **kwargs)

    monkeypatch.setattr(services, "end_worker_jobs", racing)
    services.set_worker_state(
        alice, worker.pk, "suspended", by_platform=by_platform, reason="hardware fault reported" if by_platform else ""
    )
    stored = Assignment.objects.get(pk=assignment.pk)
    assert stored.state == Assignment.State.EXPIRED
    assert stored.reason.startswith(reason), stored.reason
    assert Worker.objects.get(pk=worker.pk).reputation == before - cost
