"""The live task page and the provider pages in a real headless Chromium against daphne.

A worker's progress is driven for real: the test connects to daphne's ``/ws/worker/``
with the worker's token (as an agent does) and sends progress and log events; the
requester's open task page must show them without a reload, and keep them after one.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from websockets import Origin
from websockets.sync.client import connect

from ledger.units import UNITS_PER_CREDIT
from tests.conftest import funded
from tests.e2e.browsing import expect, log_in, screenshot
from tests.factories import UserFactory, make_worker, post_task
from tests.workers.test_pages import CAPS as RIG_CAPS
from tests.workers.test_pages import make_assignment, make_rig
from workers.models import Assignment, RegistrationToken, Worker

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def worker_send(live_url: str, raw_token: str, *messages: dict[str, Any]) -> list[str]:
    """Send messages as the node's agent would; returns any replies (errors) it got."""
    ws_url = "ws://" + urlsplit(live_url).netloc + "/ws/worker/"
    with connect(
        ws_url, additional_headers={"Authorization": f"Worker {raw_token}"}, origin=Origin(live_url), open_timeout=10
    ) as socket:
        for message in messages:
            socket.send(json.dumps(message))
        replies = []
        try:
            while True:
                replies.append(str(socket.recv(timeout=0.5)))
        except TimeoutError:
            pass
    return replies


def test_progress_chart_and_log_arrive_live_and_survive_a_reload(page: Any, live_url: str) -> None:
    requester: Any = funded(UserFactory(username="rita"))
    provider: Any = UserFactory(username="paul")
    task = post_task(requester, title="Live matmul", budget=UNITS_PER_CREDIT)
    worker, raw, _ = make_worker(provider, name="paul-h100", caps=RIG_CAPS)
    assignment = make_assignment(task, worker)

    log_in(page, "rita")
    page.goto(f"/tasks/{task.pk}/")
    expect()(page.locator("#live-state")).to_have_text("Live updates on")
    expect()(page.locator("#assignment-rows")).to_contain_text("paul-h100")
    expect()(page.locator("#task-progress-text")).to_have_text("0%")
    expect()(page.locator("#task-charts figure")).to_have_count(0)

    replies = worker_send(
        live_url,
        raw,
        {
            "type": "progress",
            "assignment_id": str(assignment.pk),
            "step": 5,
            "total": 10,
            "metrics": {"loss": 0.5},
            "eta": 75,
        },
        {"type": "log", "assignment_id": str(assignment.pk), "lines": ["epoch 5/10 loss=0.5000"]},
    )
    assert replies == []

    expect()(page.locator("#task-progress-text")).to_have_text("50%")
    assert page.locator("#task-progress").evaluate("bar => bar.value") == 50
    expect()(page.locator("#task-step")).to_have_text("Step 5 of 10.")
    expect()(page.locator("#task-eta")).to_have_text("About 1 min 15 s left.")
    chart = page.locator('#task-charts figure[data-metric="loss"]')
    drawn = chart.locator("[role=img]")
    expect()(drawn).to_have_attribute("aria-label", "loss over steps 5 to 5, from 0.5 to 0.5")
    expect()(chart.locator(".u-legend .u-series").nth(1).locator(".u-value")).to_have_text("0.5")
    expect()(page.locator("#task-metrics")).to_contain_text("0.5")
    expect()(page.locator("#task-log li")).to_have_text(["epoch 5/10 loss=0.5000"])
    expect()(page.locator("#task-log")).to_have_attribute("aria-live", "polite")
    expect()(page.locator("#assignment-rows")).to_contain_text("50%")

    # A second sample extends the line: two points now.
    worker_send(
        live_url,
        raw,
        {"type": "progress", "assignment_id": str(assignment.pk), "step": 10, "total": 10, "metrics": {"loss": 0.25}},
    )
    expect()(page.locator("#task-progress-text")).to_have_text("100%")
    expect()(drawn).to_have_attribute("aria-label", "loss over steps 5 to 10, from 0.25 to 0.5")
    screenshot(page, "live-task")

    # What was persisted is what a reloading (or reconnecting) browser draws.
    row = Assignment.objects.get(pk=assignment.pk)
    assert row.progress == 100.0
    assert [p["step"] for p in row.history] == [5, 10]
    page.reload()
    expect()(page.locator("#task-progress-text")).to_have_text("100%")
    expect()(drawn).to_have_attribute("aria-label", "loss over steps 5 to 10, from 0.25 to 0.5")
    expect()(page.locator("#task-log li")).to_have_text(["epoch 5/10 loss=0.5000"])


def test_a_provider_registers_a_node_and_manages_workers(page: Any, live_url: str) -> None:
    provider: Any = UserFactory(username="petra")
    worker = make_rig(provider, "petra-h100", benchmark_gflops=48123.4, jobs_done=3, earnings=2_500_000_000)
    make_rig(provider, "petra-old", online=False, capabilities={"cpu_cores": 8, "kinds": ["synthetic"]})

    log_in(page, "petra")
    page.get_by_role("link", name="Workers", exact=True).click()
    expect()(page).to_have_url(re.compile(r"/workers/$"))
    row = page.get_by_role("row").filter(has_text="petra-h100")
    expect()(row.locator("[data-worker-status]")).to_have_text("Online")
    expect()(row).to_contain_text("NVIDIA H100 (80.0 GiB)")
    expect()(row).to_contain_text("48123.4")
    expect()(row).to_contain_text("2.5")
    expect()(page.get_by_role("row").filter(has_text="petra-old").locator("[data-worker-status]")).to_have_text(
        "Offline"
    )
    expect()(page.locator("#dashboard-live")).to_have_text("Live updates on.")
    screenshot(page, "live-my-workers")

    # A one-time registration token and the node's commands.
    page.get_by_role("link", name="Register a worker").click()
    page.get_by_role("button", name="Create registration token").click()
    token = page.locator("#registration-token").inner_text()
    assert token.startswith("pwr_")
    expect()(page.locator("#cmd-register")).to_have_text(
        f".venv/bin/python -m workers.agent register --server {live_url} --token {token}"
    )
    if settings.NODE_BROKER_URL:  # the node logs in with what its registration gives it
        expect()(page.locator("#cmd-run")).to_have_text(".venv/bin/python -m workers.agent run")
    else:  # embedded: the node reads its queue from the platform's own folder
        expect()(page.locator("#cmd-run")).to_contain_text("run --broker filesystem:// --broker-folder ")
    assert RegistrationToken.objects.get(owner=provider).token_hash != token
    screenshot(page, "live-register")

    # Suspend, then retire after confirming.
    page.get_by_role("link", name="Back to my workers").click()
    page.get_by_role("button", name="Suspend petra-h100").click()
    expect()(page.locator("#messages")).to_contain_text("Worker “petra-h100” suspended.")
    expect()(row.locator("[data-worker-status]")).to_have_text("Suspended")
    page.once("dialog", lambda dialog: dialog.dismiss())
    page.get_by_role("button", name="Retire petra-h100").click()
    expect()(row.locator("[data-worker-status]")).to_have_text("Suspended")
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Retire petra-h100").click()
    expect()(page.locator("#messages")).to_contain_text("Worker “petra-h100” retired.")
    expect()(row.locator("[data-worker-status]")).to_have_text("Retired")
    worker.refresh_from_db()
    assert worker.state == Worker.State.RETIRED
