"""The task page keeps telling the truth as the task moves on, without a reload, in a real
headless Chromium against daphne: ledger rows turn from Pending to Sealed when a block
seals them, the step and time left go once the run is over, a reload of state from the
server never drops a log line the page shows, and a silent worker is said to be silent.

Status changes are made here, in the test process, through the services; they reach the
page's socket as the Celery worker's do, through the channel layer's spool.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import pytest
from django.db import transaction
from django.utils import timezone
from websockets import Origin
from websockets.sync.client import ClientConnection, connect

from ledger.models import Transaction
from ledger.sealer import seal_all
from ledger.units import UNITS_PER_CREDIT
from marketplace import lifecycle
from marketplace.models import Task, TaskStatus
from protocol import encoding
from tests.conftest import funded
from tests.e2e.browsing import expect, log_in
from tests.factories import UserFactory, make_worker, post_task
from tests.workers.test_jobs import Provider
from tests.workers.test_pages import CAPS as RIG_CAPS
from tests.workers.test_pages import make_assignment, make_rig
from workers.assignments import scheduler
from workers.models import Assignment, Worker
from workers.tasks import verify_assignment

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

T = TypeVar("T")


def off_the_loop(work: Callable[[], T]) -> T:
    """Run ``work`` in a thread of its own. Playwright's sync API keeps an event loop running
    in this one, where the channel layer's ``async_to_sync`` refuses to send the events the
    platform's services send after commit (the tests/e2e/conftest.py browser fixture)."""
    results: list[T] = []
    thread = threading.Thread(target=lambda: results.append(work()))
    thread.start()
    thread.join(timeout=60)
    assert results, "the work raised or timed out (see the captured log)"
    return results[0]


def move(task: Task, target: str, message: str = "") -> None:
    """A status change as the platform makes one; the page hears of it over its socket."""

    def change() -> None:
        with transaction.atomic():
            locked = lifecycle.lock_task(task.pk)
            assert locked is not None
            lifecycle.transition_locked(locked, target, message or f"Now {target}.")

    off_the_loop(change)


def node_socket(live_url: str, raw_token: str) -> ClientConnection:
    """The worker's socket, held open as a node's agent holds it (its log lines stay in the
    server's buffer until the write interval ends, or the socket closes)."""
    return connect(
        "ws://" + urlsplit(live_url).netloc + "/ws/worker/",
        additional_headers={"Authorization": f"Worker {raw_token}"},
        origin=Origin(live_url),
        open_timeout=10,
    )


def open_task_page(page: Any, username: str, task: Task) -> None:
    log_in(page, username)
    page.goto(f"/tasks/{task.pk}/")
    expect()(page.locator("#live-state")).to_have_text("Live updates on")
    page.evaluate("window.__sameDocument = true")  # gone if the page reloads


def test_ledger_rows_turn_sealed_without_a_reload(page: Any, live_url: str, tmp_path: Path) -> None:
    requester: Any = funded(UserFactory(username="lena"))
    provider = Provider(UserFactory(username="lars"), "lars-rig")
    task = post_task(requester, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    (assignment,) = scheduler.schedule(task.pk)
    assert provider.submit(assignment, provider.run_job(assignment, tmp_path)).status_code == 202

    open_task_page(page, "lena", task)
    expect()(page.locator("#task-status")).to_have_text("Verifying")
    assert off_the_loop(lambda: verify_assignment(str(assignment.pk))) == "accepted"
    expect()(page.locator("#task-status")).to_have_text("Completed")
    result_row = page.locator("#task-ledger tbody tr").filter(has_text="Submit result")
    expect()(result_row).to_contain_text("Pending")

    off_the_loop(seal_all)
    submitted = Transaction.objects.select_related("block").get(
        type=encoding.SUBMIT_RESULT, reference__startswith=f"result:{task.pk}:"
    )
    assert submitted.block is not None
    # Re-read about once a block time (5 s) after the redraw, a little less often since.
    expect()(result_row).to_contain_text(f"Sealed · #{submitted.block.height}", timeout=20_000)
    expect()(page.locator("#task-ledger")).not_to_contain_text("Pending")
    expect()(page.locator("#task-ledger")).to_have_attribute("data-pending", "false")
    assert page.evaluate("window.__sameDocument") is True


def test_the_step_and_time_left_go_once_the_run_is_over(page: Any, live_url: str) -> None:
    requester: Any = funded(UserFactory(username="fay"))
    worker, raw, _ = make_worker(UserFactory.create(username="finn"), name="finn-rig", caps=RIG_CAPS)
    task = post_task(requester, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    assignment = make_assignment(task, worker)
    move(task, TaskStatus.RUNNING)

    open_task_page(page, "fay", task)
    expect()(page.locator("#task-status")).to_have_text("Running")
    step = {"type": "progress", "assignment_id": str(assignment.pk)}
    with node_socket(live_url, raw) as node:
        node.send(json.dumps({**step, "step": 0, "total": 1, "eta": 30}))
        expect()(page.locator("#task-step")).to_have_text("Step 0 of 1.")
        expect()(page.locator("#task-eta")).to_have_text("About 30 s left.")
        # The last step: nothing is left, whatever the node estimates.
        node.send(json.dumps({**step, "step": 1, "total": 1, "eta": 0}))
        expect()(page.locator("#task-step")).to_have_text("Step 1 of 1.")
        expect()(page.locator("#task-eta")).to_have_text("")

        move(task, TaskStatus.VERIFYING)
        expect()(page.locator("#task-status")).to_have_text("Verifying")
        expect()(page.locator("#task-eta")).to_have_text("")
        move(task, TaskStatus.COMPLETED)
        expect()(page.locator("#task-status")).to_have_text("Completed")
        expect()(page.locator("#task-step")).to_have_text("")
        expect()(page.locator("#task-eta")).to_have_text("")

        # A report that arrives after the end (a submitted job still takes its last one)
        # does not bring them back.
        Assignment.objects.filter(pk=assignment.pk).update(state=Assignment.State.SUBMITTED)
        node.send(json.dumps({**step, "step": 1, "total": 1, "eta": 0}))
        node.send(json.dumps({"type": "log", "assignment_id": str(assignment.pk), "lines": ["done"]}))
        expect()(page.locator("#task-log li")).to_have_text(["done"])
    expect()(page.locator("#task-step")).to_have_text("")
    expect()(page.locator("#task-eta")).to_have_text("")
    # The synthetic kind charts nothing, and says so instead of waiting for metrics.
    expect()(page.locator("#task-metrics")).to_have_text(re.compile(r"reports its progress only, no metrics"))
    expect()(page.locator("#task-charts figure")).to_have_count(0)
    assert page.evaluate("window.__sameDocument") is True


def test_a_reload_of_state_keeps_the_log_lines_the_page_shows(page: Any, live_url: str) -> None:
    requester: Any = funded(UserFactory(username="lola"))
    provider: Any = UserFactory(username="luke")
    task = post_task(requester, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    old_worker = make_rig(provider, "luke-old")
    make_assignment(
        task, old_worker, state=Assignment.State.EXPIRED, log_tail=["synthetic started on luke-old", "lost"]
    )
    worker, raw, _ = make_worker(provider, name="luke-new", caps=RIG_CAPS)
    assignment = make_assignment(task, worker, attempt=2, state=Assignment.State.OFFERED)

    open_task_page(page, "lola", task)
    log = page.locator("#task-log li")
    expect()(log).to_have_text(["synthetic started on luke-old", "lost"])
    # What live.json says before the new worker's first line is written: the server
    # buffers log lines, so a reload of state may come before they are stored.
    stale = page.request.get(f"/workers/tasks/{task.pk}/live.json").json()
    reads: list[str] = []

    def serve_stale(route: Any) -> None:
        reads.append(route.request.url)
        route.fulfill(status=200, content_type="application/json", body=json.dumps(stale))

    with node_socket(live_url, raw) as node:
        line = {"type": "log", "assignment_id": str(assignment.pk), "lines": ["synthetic started on luke-new"]}
        node.send(json.dumps(line))
        expect()(log).to_have_text(["synthetic started on luke-old", "lost", "synthetic started on luke-new"])

        page.route("**/live.json", serve_stale)
        with page.expect_response(re.compile(r"/live\.json$")):
            move(task, TaskStatus.RUNNING, "Worker started.")  # a status change reloads the state
        assert reads, "the stale state should have been served"
        expect()(page.locator("#task-status")).to_have_text("Running")
        page.wait_for_timeout(300)  # the answer is drawn
        expect()(log).to_have_text(["synthetic started on luke-old", "lost", "synthetic started on luke-new"])

        # Once the line is stored, a reload of state does not repeat it.
        page.unroute("**/live.json")
        node.send(json.dumps({**line, "lines": ["epoch 1"]}))
        expect()(log).to_have_text(
            ["synthetic started on luke-old", "lost", "synthetic started on luke-new", "epoch 1"]
        )
    # The socket closed: every buffered line is written (as the server handles the close).
    for _ in range(50):
        if Assignment.objects.get(pk=assignment.pk).log_tail == ["synthetic started on luke-new", "epoch 1"]:
            break
        page.wait_for_timeout(100)
    assert Assignment.objects.get(pk=assignment.pk).log_tail == ["synthetic started on luke-new", "epoch 1"]
    with page.expect_response(re.compile(r"/live\.json$")):
        move(task, TaskStatus.VERIFYING)
    page.wait_for_timeout(300)
    expect()(log).to_have_text(["synthetic started on luke-old", "lost", "synthetic started on luke-new", "epoch 1"])
    assert page.evaluate("window.__sameDocument") is True


def test_a_silent_worker_is_said_to_be_silent(page: Any, live_url: str) -> None:
    requester: Any = funded(UserFactory(username="sara"))
    worker, raw, _ = make_worker(UserFactory.create(username="sven"), name="sven-rig", caps=RIG_CAPS)
    task = post_task(requester, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    assignment = make_assignment(task, worker, progress=40.0)
    move(task, TaskStatus.RUNNING)
    quiet_since = timezone.now() - timedelta(seconds=45)
    Worker.objects.filter(pk=worker.pk).update(last_heartbeat_at=quiet_since)
    Assignment.objects.filter(pk=assignment.pk).update(last_progress_at=quiet_since)

    open_task_page(page, "sara", task)
    row = page.locator(f'#assignment-rows tr[data-assignment-id="{assignment.pk}"]')
    expect()(row).to_contain_text(re.compile(r"Running · last heard from 4\d s ago"))

    # It reports again: alive, and no longer said to be silent.
    with node_socket(live_url, raw) as node:
        node.send(json.dumps({"type": "progress", "assignment_id": str(assignment.pk), "step": 5, "total": 10}))
        expect()(row).to_contain_text("50%")
        expect()(row).not_to_contain_text("last heard")
