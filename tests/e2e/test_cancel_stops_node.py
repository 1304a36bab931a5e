"""Cancelled in the browser, a running cube_training task stops computing on its node within
10 s: the requester clicks "Cancel task" on the task page (real Chromium), served by daphne
with a platform Celery worker and a real agent process training the task."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from marketplace.models import Task, TaskStatus
from tests.e2e.browsing import expect, log_in
from tests.workers import processes as p
from tests.workers.test_job_control_e2e import STOPPED_LINE, logs, training_started
from workers.models import Assignment, Worker

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_cube_task_cancelled_in_the_browser_stops_on_its_node_within_10_s(
    browser: Any, alice: Any, bob: Any, tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROOFWORK_MEDIA_ROOT", str(settings.MEDIA_ROOT))
    client = APIClient()
    client.force_authenticate(bob)
    agent_log = tmp_path / "agent.log"
    with p.daphne(tmp_path) as url, p.platform_worker(tmp_path):
        key = p.register_agent(tmp_path, url, alice, "cube-node")
        worker = Worker.objects.get(owner=alice)
        with p.spawn(p.agent_cmd(key, "run", *p.broker_args()), agent_log, p.child_env()):
            p.wait_for(lambda: Worker.objects.get(pk=worker.pk).is_online, 60, "the agent never sent a heartbeat")
            task, assignment = training_started(client, tmp_path)

            context = browser.new_context(base_url=url, viewport={"width": 1280, "height": 900})
            context.set_default_timeout(15_000)
            page = context.new_page()
            try:
                log_in(page, "bob")
                page.goto(f"/tasks/{task.pk}/")
                page.once("dialog", lambda dialog: dialog.accept())
                page.get_by_role("button", name="Cancel task").click()
                cancelled_at = time.monotonic()
                expect()(page.locator("#task-status")).to_have_text("Cancelled")
                p.wait_for(
                    lambda: STOPPED_LINE in Assignment.objects.get(pk=assignment.pk).log_tail,
                    10,
                    "the node did not say it stopped within 10 s",
                    explain=lambda: logs(tmp_path),
                )
                assert time.monotonic() - cancelled_at <= 10
                # The node's words are on the task page's log (the page of a cancelled task
                # may have closed its live socket already: read it afresh).
                page.reload()
                expect()(page.locator("#task-log")).to_contain_text(STOPPED_LINE)
            finally:
                context.close()
            # The job returned on the node: Celery logs its result just after the node's
            # stopped line reached the platform, so it may land a moment later.
            p.wait_for(
                lambda: "'stopped'" in agent_log.read_text(errors="replace"),
                10,
                "the node's job did not return 'stopped'",
                explain=lambda: logs(tmp_path),
            )
    assert Task.objects.get(pk=task.pk).status == TaskStatus.CANCELLED
    assert Assignment.objects.get(pk=assignment.pk).result == {}
