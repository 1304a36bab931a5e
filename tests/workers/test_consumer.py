"""``/ws/worker/`` through the real ASGI application: authentication, heartbeats,
progress (own running assignments only, persisted at a bounded rate, fanned out to the
task's group), log lines, and the platform closing a suspended worker's socket."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.utils import timezone

from config.asgi import application
from ledger.units import UNITS_PER_CREDIT
from marketplace.events import task_group
from marketplace.models import Task
from tests.factories import make_worker, post_task
from tests.sockets import open_or_refused
from workers.api import node_socket
from workers.assignments import jobs, scheduler
from workers.identity import services
from workers.models import Assignment, Worker

# Transactional: the consumer's database_sync_to_async closes the connection it used,
# which a test wrapped in one open transaction cannot survive.
pytestmark = pytest.mark.django_db(transaction=True)


def run(coro: Callable[[], Awaitable[None]]) -> None:
    """Run an async scenario; DB calls inside stay on this thread's test transaction."""
    async_to_sync(coro)()


def socket(raw_token: str | None) -> WebsocketCommunicator:
    headers = [(b"origin", b"http://testserver")]
    if raw_token is not None:
        headers.append((b"authorization", f"Worker {raw_token}".encode()))
    return WebsocketCommunicator(application, "/ws/worker/", headers=headers)


async def barrier(comm: WebsocketCommunicator) -> None:
    """Messages are handled in order: once this one's error is back, the earlier ones are done."""
    await comm.send_json_to({"type": "ping-barrier"})
    reply = await comm.receive_json_from(timeout=5)
    assert reply == {"type": "error", "detail": "Unknown message type."}


async def subscribe(task_id: Any) -> tuple[Any, str]:
    layer = get_channel_layer()
    assert layer is not None
    channel = await layer.new_channel()
    await layer.group_add(task_group(task_id), channel)
    return layer, channel


async def nothing_on(layer: Any, channel: str) -> bool:
    try:
        await asyncio.wait_for(layer.receive(channel), timeout=0.3)
    except TimeoutError:
        return True
    return False


@pytest.fixture
def job(alice: Any, bob: Any) -> dict[str, Any]:
    """alice's online worker running bob's synthetic task."""
    worker, raw, _ = make_worker(alice, name="alpha")
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    (assignment,) = scheduler.schedule(task.pk)
    assert assignment.worker == worker
    jobs.start(worker, assignment.pk)
    return {"worker": worker, "token": raw, "task": task, "assignment": assignment}


def test_a_worker_token_connects_and_a_heartbeat_marks_it_online(job: dict[str, Any]) -> None:
    worker = job["worker"]
    stale = timezone.now() - timedelta(minutes=5)
    Worker.objects.filter(pk=worker.pk).update(last_heartbeat_at=stale)

    async def scenario() -> None:
        comm = socket(job["token"])
        connected, _ = await comm.connect()
        assert connected
        await sync_to_async(Worker.objects.filter(pk=worker.pk).update)(last_heartbeat_at=stale)
        await comm.send_json_to({"type": "heartbeat"})
        await barrier(comm)
        await comm.disconnect()

    run(scenario)
    worker.refresh_from_db()
    assert worker.last_heartbeat_at is not None
    assert timezone.now() - worker.last_heartbeat_at < timedelta(seconds=5)
    assert worker.is_online


@pytest.mark.parametrize("which", ["none", "garbage", "unknown", "suspended", "retired"])
def test_a_bad_or_disabled_token_is_closed_with_4401(alice: Any, which: str) -> None:
    worker, raw, _ = make_worker(alice)
    token: str | None = {"none": None, "garbage": "not-a-token", "unknown": "pww_" + "x" * 43}.get(which, raw)
    if which in ("suspended", "retired"):
        services.set_worker_state(alice, worker.pk, which)

    async def scenario() -> None:
        connected, code = await open_or_refused(socket(token))
        assert (connected, code) == (False, 4401)

    run(scenario)


def test_progress_is_persisted_at_a_bounded_rate_and_fanned_out(job: dict[str, Any]) -> None:
    assignment, task = job["assignment"], job["task"]
    received: list[dict[str, Any]] = []

    async def scenario() -> None:
        layer, channel = await subscribe(task.pk)
        comm = socket(job["token"])
        assert (await comm.connect())[0]
        for step in (1, 2):  # two events well within one second
            await comm.send_json_to(
                {
                    "type": "progress",
                    "assignment_id": str(assignment.pk),
                    "step": step,
                    "total": 4,
                    "metrics": {"gflops": 1.5},
                }
            )
            received.append(await asyncio.wait_for(layer.receive(channel), timeout=5))
        await barrier(comm)
        persisted = await sync_to_async(Assignment.objects.get)(pk=assignment.pk)
        assert persisted.progress == 25.0  # only the first of the two was written
        assert [point["step"] for point in persisted.history] == [1]
        # The last step is always written, whatever the rate.
        await comm.send_json_to({"type": "progress", "assignment_id": str(assignment.pk), "step": 4, "total": 4})
        received.append(await asyncio.wait_for(layer.receive(channel), timeout=5))
        await barrier(comm)
        await comm.disconnect()

    run(scenario)
    assert [(e["type"], e["step"], e["percent"]) for e in received] == [
        ("task.progress", 1, 25.0),
        ("task.progress", 2, 50.0),
        ("task.progress", 4, 100.0),
    ]
    assert received[0]["task_id"] == str(task.pk)
    assert received[0]["metrics"] == {"gflops": 1.5}
    assignment.refresh_from_db()
    assert assignment.progress == 100.0
    assert [point["step"] for point in assignment.history] == [1, 4]
    assert assignment.last_progress_at is not None
    task.refresh_from_db()
    assert task.progress == 100.0


def test_a_run_that_starts_over_starts_a_new_history(job: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A node restarted mid-job runs the redelivered job again from step 0: a lower step
    than the last stored one begins the chart anew instead of drawing the curve backwards."""
    monkeypatch.setattr(node_socket, "PERSIST_INTERVAL", 0.0)
    assignment = job["assignment"]

    async def scenario() -> None:
        comm = socket(job["token"])
        assert (await comm.connect())[0]
        for step in (1, 2, 3, 1, 2):
            await comm.send_json_to(
                {"type": "progress", "assignment_id": str(assignment.pk), "step": step, "total": 10}
            )
        await barrier(comm)
        await comm.disconnect()

    run(scenario)
    assignment.refresh_from_db()
    assert [point["step"] for point in assignment.history] == [1, 2]
    assert assignment.progress == 20.0


def test_the_progress_history_stays_bounded(job: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_socket, "PERSIST_INTERVAL", 0.0)
    monkeypatch.setattr(node_socket, "HISTORY_LIMIT", 10)
    assignment = job["assignment"]

    async def scenario() -> None:
        comm = socket(job["token"])
        assert (await comm.connect())[0]
        for step in range(1, 41):
            await comm.send_json_to(
                {
                    "type": "progress",
                    "assignment_id": str(assignment.pk),
                    "step": step,
                    "total": 40,
                    "metrics": {"loss": 1 / step},
                }
            )
        await barrier(comm)
        await comm.disconnect()

    run(scenario)
    assignment.refresh_from_db()
    steps = [point["step"] for point in assignment.history]
    assert len(steps) <= 10
    assert steps[0] == 1
    assert steps[-1] == 40
    assert steps == sorted(steps)
    assert assignment.metrics == {"loss": 1 / 40}


@pytest.mark.parametrize(
    "case",
    [
        "foreign",
        "settled",
        "malformed-id",
        "missing-id",
        "nan-metric",
        "infinite-metric",
        "step-over-total",
        "zero-total",
        "metric-named-step",
        "metric-named-t",
    ],
)
def test_refused_progress_changes_nothing_and_reaches_nobody(job: dict[str, Any], bob: Any, case: str) -> None:
    assignment, task = job["assignment"], job["task"]
    other_task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    other_worker, _, _ = make_worker(bob, name="beta")
    (foreign,) = scheduler.schedule(other_task.pk)
    assert foreign.worker == other_worker
    if case == "settled":
        jobs.fail(job["worker"], assignment.pk, "test: out of memory")
    target = {"foreign": str(foreign.pk), "malformed-id": "not-a-uuid", "missing-id": None}.get(
        case, str(assignment.pk)
    )
    message: dict[str, Any] = {"type": "progress", "assignment_id": target, "step": 1, "total": 2}
    if case == "nan-metric":
        message["metrics"] = {"loss": float("nan")}
    elif case == "infinite-metric":
        message["metrics"] = {"loss": float("inf")}
    elif case == "step-over-total":
        message.update(step=3, total=2)
    elif case == "zero-total":
        message.update(step=0, total=0)
    elif case == "metric-named-step":  # a chart point's own keys: it would move the point
        message["metrics"] = {"step": 1e15}
    elif case == "metric-named-t":
        message["metrics"] = {"t": 0.0}
    before = {a.pk: (a.progress, a.history, a.metrics) for a in Assignment.objects.all()}

    async def scenario() -> None:
        layers = [await subscribe(task.pk), await subscribe(other_task.pk)]
        comm = socket(job["token"])
        assert (await comm.connect())[0]
        await comm.send_json_to(message)
        reply = await comm.receive_json_from(timeout=5)
        assert reply["type"] == "error"
        assert reply["detail"]
        for layer, channel in layers:
            assert await nothing_on(layer, channel)
        await comm.disconnect()

    run(scenario)
    assert {a.pk: (a.progress, a.history, a.metrics) for a in Assignment.objects.all()} == before
    assert set(Task.objects.values_list("progress", flat=True)) == {0.0}


def test_log_lines_are_bounded_and_fanned_out(job: dict[str, Any], bob: Any) -> None:
    assignment, task = job["assignment"], job["task"]
    fanned: list[dict[str, Any]] = []

    async def scenario() -> None:
        layer, channel = await subscribe(task.pk)
        comm = socket(job["token"])
        assert (await comm.connect())[0]
        await comm.send_json_to({"type": "log", "assignment_id": str(assignment.pk), "lines": ["x" * 2000] * 80})
        fanned.append(await asyncio.wait_for(layer.receive(channel), timeout=5))
        for batch in range(6):
            lines = [f"batch {batch} line {i}" for i in range(50)]
            await comm.send_json_to({"type": "log", "assignment_id": str(assignment.pk), "lines": lines})
        await comm.send_json_to({"type": "log", "assignment_id": str(assignment.pk), "lines": "not a list"})
        assert (await comm.receive_json_from(timeout=5))["type"] == "error"
        await comm.disconnect()

    run(scenario)
    assert fanned[0]["type"] == "task.log"
    assert len(fanned[0]["lines"]) == 50
    assert {len(line) for line in fanned[0]["lines"]} == {500}
    assignment.refresh_from_db()
    assert len(assignment.log_tail) == node_socket.LOG_LINES
    assert assignment.log_tail[-1] == "batch 5 line 49"


@pytest.mark.parametrize("target", ["suspended", "retired"])
def test_suspending_or_retiring_closes_the_open_socket(job: dict[str, Any], alice: Any, target: str) -> None:
    worker = job["worker"]

    def change_state() -> None:
        services.set_worker_state(alice, worker.pk, target)  # the close goes out on commit

    async def scenario() -> None:
        comm = socket(job["token"])
        assert (await comm.connect())[0]
        await sync_to_async(change_state)()
        stop = await comm.receive_json_from(timeout=5)  # its running job is stopped first
        assert (stop["type"], stop["assignment_id"]) == ("stop", str(job["assignment"].pk))
        closed = await comm.receive_output(timeout=5)
        assert closed == {"type": "websocket.close", "code": 4403}
        # And it cannot come back.
        assert await open_or_refused(socket(job["token"])) == (False, 4401)

    run(scenario)
    assert Worker.objects.get(pk=worker.pk).state == target


@pytest.mark.parametrize("target", ["suspended", "retired"])
def test_a_worker_suspended_while_its_socket_connects_is_refused(
    job: dict[str, Any], alice: Any, monkeypatch: pytest.MonkeyPatch, target: str
) -> None:
    """The suspension commits after the token was checked but before the socket joined the
    worker's group: the close it sends reaches nobody, so the socket must see it itself."""
    worker = job["worker"]
    check_token = node_socket.authenticate_worker

    def suspended_meanwhile(raw: str) -> Worker | None:
        found = check_token(raw)
        services.set_worker_state(alice, worker.pk, target)
        return found

    monkeypatch.setattr(node_socket, "authenticate_worker", suspended_meanwhile)

    async def scenario() -> None:
        comm = socket(job["token"])
        assert await open_or_refused(comm) == (False, 4401)
        # Frames the node sends after the close are not read: the worker is not reporting.
        assignment_id = str(job["assignment"].pk)
        await comm.send_json_to({"type": "progress", "assignment_id": assignment_id, "step": 2, "total": 4})
        await comm.send_json_to({"type": "heartbeat"})
        assert await comm.receive_nothing(timeout=0.5)

    run(scenario)
    job["assignment"].refresh_from_db()
    assert (job["assignment"].progress, job["assignment"].history) == (0.0, [])


def test_deactivating_the_owners_account_closes_the_open_socket(job: dict[str, Any], alice: Any) -> None:
    def deactivate() -> None:
        alice.is_active = False
        alice.save(update_fields=["is_active"])  # the close goes out on commit

    async def scenario() -> None:
        comm = socket(job["token"])
        assert (await comm.connect())[0]
        await sync_to_async(deactivate)()
        closed = await comm.receive_output(timeout=5)
        assert closed == {"type": "websocket.close", "code": 4403}
        assert await open_or_refused(socket(job["token"])) == (False, 4401)

    run(scenario)
    assert Worker.objects.get(pk=job["worker"].pk).state == Worker.State.ACTIVE


def progress(assignment: Assignment, step: Any, total: Any, **extra: Any) -> dict[str, Any]:
    return {"type": "progress", "assignment_id": str(assignment.pk), "step": step, "total": total, **extra}


def test_out_of_range_numbers_and_bad_frames_get_an_error_and_the_socket_lives_on(job: dict[str, Any]) -> None:
    assignment, task = job["assignment"], job["task"]
    bad: list[dict[str, Any]] = [
        progress(assignment, 10**400, 10**400),
        progress(assignment, 2**53 + 1, 2**53 + 1),
        progress(assignment, True, True),
        progress(assignment, 1, 2.0),
        progress(assignment, 1, 2, eta=10**400),
        progress(assignment, 1, 2, eta=float("nan")),
        progress(assignment, 1, 2, eta=True),
        progress(assignment, 1, 2, eta="soon"),
        progress(assignment, 1, 2, eta=-1),
        progress(assignment, 1, 2, metrics={"loss": 10**400}),
        # Finite, but two such values span more than a float holds: the chart's scale is inf.
        progress(assignment, 1, 2, metrics={"loss": 1.7e308}),
        progress(assignment, 1, 2, metrics={"loss": -1.7e308}),
        progress(assignment, 1, 2, metrics={"loss": 2**53 + 1}),
        progress(assignment, 1, 2, metrics={"loss": True}),
        progress(assignment, 1, 2, metrics={"loss": "low"}),
        progress(assignment, 1, 2, sent_at=10**400),
        progress(assignment, 1, 2, sent_at=float("inf")),
        progress(assignment, 1, 2, sent_at=False),
        progress(assignment, 1, 2, sent_at="yesterday"),
        {"type": "log", "assignment_id": str(assignment.pk), "lines": [{"nested": 1}]},
        # Text PostgreSQL cannot store would fail the buffered write, losing the batch.
        {"type": "log", "assignment_id": str(assignment.pk), "lines": ["ok", "a\x00b"]},
        {"type": "log", "assignment_id": str(assignment.pk), "lines": ["\ud800"]},
        progress(assignment, 1, 2, metrics={"lo\x00ss": 1.0}),
    ]
    frames: list[dict[str, Any]] = [
        {"text_data": "{not json"},
        {"text_data": '{"type": "progress", "step": ' + "9" * 5000 + "}"},  # past Python's digit limit
        {"text_data": "[" * 100_000},  # past the recursion limit
        {"text_data": "[1, 2]"},
        {"bytes_data": b"\x00\x01"},
    ]

    async def scenario() -> None:
        layer, channel = await subscribe(task.pk)
        comm = socket(job["token"])
        assert (await comm.connect())[0]
        for message in bad:
            await comm.send_json_to(message)
            reply = await comm.receive_json_from(timeout=5)
            assert reply["type"] == "error", message
        for frame in frames:
            await comm.send_to(**frame)
            reply = await comm.receive_json_from(timeout=5)
            assert reply["type"] == "error", frame
        assert await nothing_on(layer, channel)
        # The largest sound numbers pass, and the socket still works.
        await comm.send_json_to(
            progress(assignment, 2**52, 2**53, eta=0, sent_at=2**53, metrics={"loss": 1e300, "n": -(2**53)})
        )
        event = await asyncio.wait_for(layer.receive(channel), timeout=5)
        assert (event["step"], event["percent"], event["eta"], event["sent_at"]) == (2**52, 50.0, 0.0, 2.0**53)
        assert event["metrics"] == {"loss": 1e300, "n": -(2.0**53)}
        await comm.disconnect()

    run(scenario)


async def drain(layer: Any, channel: str, quiet: float = 0.5) -> list[dict[str, Any]]:
    """Every event on ``channel`` until none has come for ``quiet`` seconds."""
    events = []
    while True:
        try:
            events.append(await asyncio.wait_for(layer.receive(channel), timeout=quiet))
        except TimeoutError:
            return events


def test_the_last_step_skips_the_throttle_once_whatever_the_sockets(
    job: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(node_socket, "PERSIST_INTERVAL", 60.0)  # only the last-step exception may write again
    assignment, task = job["assignment"], job["task"]

    async def scenario() -> None:
        first, second = socket(job["token"]), socket(job["token"])
        assert (await first.connect())[0]
        assert (await second.connect())[0]
        await first.send_json_to(progress(assignment, 1, 4))
        await barrier(first)  # step 1 handled before the other socket's messages (sockets race)
        for comm in (first, second):  # a node repeating its last step, from two sockets
            for _ in range(30):
                await comm.send_json_to(progress(assignment, 4, 4, metrics={"loss": 0.5}))
        for total in range(5, 15):  # and "finishing" again with ever larger totals
            await second.send_json_to(progress(assignment, total, total))
        for comm in (first, second):
            await barrier(comm)
            await comm.disconnect()

    run(scenario)
    assignment.refresh_from_db()
    assert [point["step"] for point in assignment.history] == [1, 4]  # one write, then the one extra
    assert (assignment.progress, assignment.metrics) == (100.0, {"loss": 0.5})
    task.refresh_from_db()
    assert task.progress == 100.0


def test_a_recent_write_by_another_web_process_holds_progress_back(
    job: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(node_socket, "PERSIST_INTERVAL", 60.0)
    assignment = job["assignment"]
    Assignment.objects.filter(pk=assignment.pk).update(last_progress_at=timezone.now(), progress=25.0)

    async def scenario() -> None:
        comm = socket(job["token"])  # this process has written nothing for the assignment yet
        assert (await comm.connect())[0]
        await comm.send_json_to(progress(assignment, 2, 4))
        await barrier(comm)
        held = await sync_to_async(Assignment.objects.get)(pk=assignment.pk)
        assert (held.progress, held.history) == (25.0, [])
        await comm.send_json_to(progress(assignment, 4, 4))  # the last step still gets through
        await barrier(comm)
        await comm.disconnect()

    run(scenario)
    assignment.refresh_from_db()
    assert assignment.progress == 100.0
    assert [point["step"] for point in assignment.history] == [4]


def one_progress_event(job: dict[str, Any], step: int, total: int) -> float:
    """Send one progress event on a fresh socket; the percent the task's browsers got."""
    seen: list[float] = []

    async def scenario() -> None:
        layer, channel = await subscribe(job["task"].pk)
        comm = socket(job["token"])
        assert (await comm.connect())[0]
        await comm.send_json_to(progress(job["assignment"], step, total))
        seen.append((await asyncio.wait_for(layer.receive(channel), timeout=5))["percent"])
        await barrier(comm)
        await comm.disconnect()

    run(scenario)
    return seen[0]


def test_a_step_short_of_the_last_is_never_shown_as_done(job: dict[str, Any]) -> None:
    assignment = job["assignment"]
    assert one_progress_event(job, 99_999, 100_000) == 99.99
    assignment.refresh_from_db()
    assert assignment.progress == 99.99


def test_a_burst_of_progress_reaches_browsers_coalesced_and_ends_on_its_last_state(job: dict[str, Any]) -> None:
    assignment = job["assignment"]

    async def scenario() -> None:
        layer, channel = await subscribe(job["task"].pk)
        comm = socket(job["token"])
        assert (await comm.connect())[0]
        started = time.monotonic()
        for step in range(1, 41):
            await comm.send_json_to(progress(assignment, step, 100, metrics={"loss": 1 / step}))
        await barrier(comm)
        elapsed = time.monotonic() - started
        events = await drain(layer, channel)
        steps = [event["step"] for event in events]
        assert steps[0] == 1  # the first of a burst goes out at once
        assert steps[-1] == 40  # the browser ends on the latest state
        assert events[-1]["metrics"] == {"loss": 1 / 40}
        assert steps == sorted(steps)
        # One event now, then at most one per FANOUT_INTERVAL while the burst lasted, then the last.
        assert len(steps) <= 2 + elapsed / node_socket.FANOUT_INTERVAL, (steps, elapsed)
        assert len(steps) < 40
        await comm.disconnect()

    run(scenario)


def test_an_isolated_progress_event_is_not_held_back(job: dict[str, Any]) -> None:
    assignment = job["assignment"]

    async def scenario() -> None:
        layer, channel = await subscribe(job["task"].pk)
        comm = socket(job["token"])
        assert (await comm.connect())[0]
        for step in (1, 2, 3):
            await comm.send_json_to(progress(assignment, step, 4))
            await barrier(comm)
            # Already on its way to the browsers by the time the next message is handled.
            event = await asyncio.wait_for(layer.receive(channel), timeout=0.05)
            assert event["step"] == step
            await asyncio.sleep(node_socket.FANOUT_INTERVAL * 1.5)
        await comm.disconnect()

    run(scenario)


def test_a_burst_of_log_lines_is_written_at_a_bounded_rate_and_all_reach_the_row_and_browsers(
    job: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(node_socket, "LOG_FLUSH_INTERVAL", 60.0)  # the first write, then only the one on close
    assignment = job["assignment"]
    sent = [[f"message {m} line {i}" for i in range(6)] for m in range(30)]  # 180 lines: all are kept

    async def scenario() -> None:
        layer, channel = await subscribe(job["task"].pk)
        comm = socket(job["token"])
        assert (await comm.connect())[0]
        for lines in sent:
            await comm.send_json_to({"type": "log", "assignment_id": str(assignment.pk), "lines": lines})
        await barrier(comm)
        during = await sync_to_async(Assignment.objects.get)(pk=assignment.pk)
        assert during.log_tail == sent[0]  # written once; the rest held in memory
        events = await drain(layer, channel)
        assert [line for event in events for line in event["lines"]] == [line for lines in sent for line in lines]
        assert len(events) < len(sent)
        await comm.disconnect(timeout=5)

    run(scenario)
    assignment.refresh_from_db()
    assert assignment.log_tail == [line for lines in sent for line in lines]


def test_held_log_lines_are_written_within_the_interval(job: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_socket, "LOG_FLUSH_INTERVAL", 0.3)
    assignment = job["assignment"]

    async def scenario() -> None:
        comm = socket(job["token"])
        assert (await comm.connect())[0]
        for batch in ("a", "b", "c"):
            await comm.send_json_to({"type": "log", "assignment_id": str(assignment.pk), "lines": [batch]})
        await barrier(comm)
        await asyncio.sleep(1.0)  # the socket stays open: the timer writes, not the close
        row = await sync_to_async(Assignment.objects.get)(pk=assignment.pk)
        assert row.log_tail == ["a", "b", "c"]
        await comm.disconnect()

    run(scenario)


def test_a_flooding_socket_is_closed_with_4429(job: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_socket, "MESSAGE_BURST", 10)
    monkeypatch.setattr(node_socket, "MESSAGE_RATE", 5.0)

    async def scenario() -> None:
        comm = socket(job["token"])
        assert (await comm.connect())[0]
        for _ in range(40):
            await comm.send_json_to({"type": "heartbeat-typo"})
        replies = 0
        while (output := await comm.receive_output(timeout=5))["type"] == "websocket.send":
            replies += 1
        assert (output["type"], output["code"]) == ("websocket.close", 4429)
        assert "Too many messages" in output["reason"]
        assert replies < 40
        # The budget is the worker's, not the socket's: a reconnect gets no fresh burst...
        again = socket(job["token"])
        assert (await again.connect())[0]
        await asyncio.sleep(0.4)  # ...but an honest node carries on once it has refilled (5/s)
        await barrier(again)
        await again.disconnect()

    run(scenario)


def test_a_workers_sockets_share_one_message_budget(job: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """More sockets buy no more messages: the second socket goes over the worker's budget."""
    monkeypatch.setattr(node_socket, "MESSAGE_BURST", 10)
    monkeypatch.setattr(node_socket, "MESSAGE_RATE", 0.01)

    async def scenario() -> None:
        first, second = socket(job["token"]), socket(job["token"])
        assert (await first.connect())[0]
        assert (await second.connect())[0]
        for _ in range(6):
            await barrier(first)
        for _ in range(4):
            await barrier(second)
        await second.send_json_to({"type": "ping-barrier"})  # the worker's 11th message
        output = await second.receive_output(timeout=5)
        assert (output["type"], output["code"]) == ("websocket.close", 4429)
        assert "Too many messages" in output["reason"]
        await first.disconnect()

    run(scenario)


def test_past_max_sockets_a_newer_socket_closes_the_oldest(
    job: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node whose connection drops without a FIN leaves sockets the server still counts;
    its live reconnection must get through, so the oldest socket gives way, not the newest."""
    monkeypatch.setattr(node_socket, "MAX_SOCKETS", 2)
    worker = job["worker"]

    async def scenario() -> None:
        first, second, third = socket(job["token"]), socket(job["token"]), socket(job["token"])
        assert (await first.connect())[0]
        assert (await second.connect())[0]
        assert (await third.connect())[0]
        output = await first.receive_output(timeout=5)
        assert (output["type"], output["code"]) == ("websocket.close", 4429)
        assert output["reason"] == "Too many open sockets: over 2, the oldest is closed."
        await barrier(second)
        await barrier(third)
        assert node_socket.open_sockets.count(worker.pk) == 2
        await second.disconnect()
        await third.disconnect()
        assert node_socket.open_sockets.count(worker.pk) == 0

    run(scenario)


def test_a_socket_that_crashes_is_no_longer_counted(job: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A handler that raises ends the consumer without ``disconnect``; the socket must stop
    counting against the worker all the same (else every crash leaks an entry)."""

    async def broken(self: Any, content: dict[str, Any]) -> None:
        raise RuntimeError("the database went away")

    working = node_socket.WorkerConsumer._log

    async def scenario() -> None:
        first = socket(job["token"])
        assert (await first.connect())[0]
        assert node_socket.open_sockets.count(job["worker"].pk) == 1
        monkeypatch.setattr(node_socket.WorkerConsumer, "_log", broken)
        await first.send_json_to({"type": "log", "assignment_id": str(job["assignment"].pk), "lines": ["x"]})
        with pytest.raises(RuntimeError, match="went away"):
            await first.wait(timeout=5)
        monkeypatch.setattr(node_socket.WorkerConsumer, "_log", working)
        assert node_socket.open_sockets.count(job["worker"].pk) == 0
        again = socket(job["token"])
        assert (await again.connect())[0]
        await barrier(again)
        await again.disconnect()

    run(scenario)


def test_the_last_progress_point_lands_even_after_the_result(job: dict[str, Any]) -> None:
    """The node sends its last point on the socket and its result over HTTP; when the result
    wins the race, the point still reaches the row and the browsers."""
    assignment = job["assignment"]
    Assignment.objects.filter(pk=assignment.pk).update(state=Assignment.State.SUBMITTED)
    assert one_progress_event(job, 4, 4) == 100.0
    assignment.refresh_from_db()
    assert assignment.progress == 100.0
    assert [point["step"] for point in assignment.history] == [4]
