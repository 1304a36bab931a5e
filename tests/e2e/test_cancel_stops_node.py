"""Cancelled in the browser, a running cube_training task stops computing on its node within
10 s: the requester clicks "Cancel task" on the task page (real Chromium), served by daphne
with a platform Celery worker and a real agent process training the task."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from marketplace.models import Task, TaskStatus, User
from tests.e2e.browsing import expect, log_in, new_page
from tests.workers import processes as p
from tests.workers.test_job_control_e2e import STOPPED_LINE, said_it_stopped, training_started
from workers.models import Assignment

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("shared_media"),
]


def test_a_cube_task_cancelled_in_the_browser_stops_on_its_node_within_10_s(
    browser: Any, alice: User, bob_client: APIClient, tmp_path: Path
) -> None:
    with p.platform_and_node(tmp_path, alice, "cube-node", online_within=60) as node:
        task, assignment = training_started(bob_client, tmp_path)
        with new_page(browser, node.url) as page:
            log_in(page, "bob")
            page.goto(f"/tasks/{task.pk}/")
            page.once("dialog", lambda dialog: dialog.accept())
            page.get_by_role("button", name="Cancel task").click()
            cancelled_at = time.monotonic()
            expect()(page.locator("#task-status")).to_have_text("Cancelled")
            said_it_stopped(assignment, tmp_path)
            assert time.monotonic() - cancelled_at <= 10
            # The node's words are on the task page's log (the page of a cancelled task
            # may have closed its live socket already: read it afresh).
            page.reload()
            expect()(page.locator("#task-log")).to_contain_text(STOPPED_LINE)
        # The job returned on the node: Celery logs its result just after the node's
        # stopped line reached the platform, so it may land a moment later.
        p.wait_for(
            lambda: "'stopped'" in node.log.read_text(errors="replace"),
            10,
            "the node's job did not return 'stopped'",
            explain=lambda: p.logs(tmp_path),
        )
    assert Task.objects.get(pk=task.pk).status == TaskStatus.CANCELLED
    assert Assignment.objects.get(pk=assignment.pk).result == {}
