"""The task page says what is true at each stage: the timeline's first row, the summary's
start times, the note of an empty metrics list, and whether its ledger rows wait for a block.

Rendered through Django's test client; the live parts are in tests/e2e/test_task_page_text.py.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.test import Client
from django.utils import timezone

from ledger.sealer import seal_all
from marketplace import lifecycle, services
from marketplace.models import Task, TaskEvent, TaskStatus
from tests.factories import post_task
from tests.workers.test_pages import make_assignment, make_rig
from workers.models import Assignment

pytestmark = pytest.mark.django_db


def page(client: Client, task: Task) -> str:
    response = client.get(f"/tasks/{task.pk}/")
    assert response.status_code == 200
    return response.content.decode()


def section(html: str, element_id: str) -> str:
    """The visible text of the element with that id (up to its section's end), collapsed."""
    start = html.index(f'id="{element_id}"')
    end = html.index("</section>", start)
    body = re.sub(r"<[^>]+>", " ", html[html.index(">", start) + 1 : end])
    return re.sub(r"\s+", " ", body).strip()


def move(task: Task, target: str, message: str = "") -> None:
    with transaction.atomic():
        locked = Task.objects.select_for_update().get(pk=task.pk)
        lifecycle.transition_locked(locked, target, message or f"Now {target}.")


# --- The timeline ---------------------------------------------------------------------


def test_a_task_posted_to_the_market_was_created_not_drafted(alice_web: Client, alice: Any) -> None:
    task = post_task(alice, spec={"n": 512})
    timeline = section(page(alice_web, task), "task-timeline")
    assert timeline.index("Created") < timeline.index("Task created.") < timeline.index("Open")
    assert "Draft" not in timeline


def test_a_draft_says_draft_and_still_does_once_published(alice_web: Client, alice: Any) -> None:
    task = post_task(alice, spec={"n": 512}, draft=True)
    timeline = section(page(alice_web, task), "task-timeline")
    assert "Draft Task created." in timeline
    assert "Created" not in timeline

    # Published later (not within the posting's own transaction): it was a draft meanwhile.
    TaskEvent.objects.filter(task=task).update(at=timezone.now() - timedelta(minutes=5))
    services.publish_task(alice, task.pk)
    timeline = section(page(alice_web, task), "task-timeline")
    assert "Draft Task created." in timeline
    assert "Open Task opened for workers" in timeline
    assert "Created" not in timeline


# --- The summary's start times ---------------------------------------------------------


def summary(client: Client, task: Task) -> str:
    return section(page(client, task), "task-summary")


def test_started_is_the_run_in_hand_or_labelled_as_the_first(alice_web: Client, alice: Any, bob: Any) -> None:
    task = post_task(alice, spec={"n": 512})
    assert "Started" not in summary(alice_web, task)

    first_worker = make_rig(bob, "bob-1")
    first = make_assignment(task, first_worker, started_at=timezone.now() - timedelta(minutes=10))
    move(task, TaskStatus.RUNNING)
    text = summary(alice_web, task)
    assert "Started" in text
    assert "First started" not in text

    # The worker is lost: the task waits again, and the start it shows is the first one.
    Assignment.objects.filter(pk=first.pk).update(state=Assignment.State.EXPIRED)
    move(task, TaskStatus.OPEN, "Worker lost; reassigning.")
    text = summary(alice_web, task)
    assert "First started" in text
    assert not re.search(r"(?<!First )Started", text)

    # Another worker runs it: both starts, each named.
    second_worker = make_rig(bob, "bob-2")
    later = timezone.now()
    make_assignment(task, second_worker, attempt=2, started_at=later)
    move(task, TaskStatus.RUNNING)
    text = summary(alice_web, task)
    task.refresh_from_db()
    assert task.started_at is not None
    assert f"First started {task.started_at:%Y-%m-%d %H:%M:%S} UTC" in text
    assert f"Last started {later:%Y-%m-%d %H:%M:%S} UTC" in text


# --- The metrics list while it is empty -------------------------------------------------


def test_a_kind_that_reports_no_metrics_says_so_not_yet(alice_web: Client, alice: Any) -> None:
    task = post_task(alice, spec={"n": 512})
    html = page(alice_web, task)
    assert "reports its progress only, no metrics" in section(html, "task-metrics")
    assert "No metrics reported yet" not in html

    services.cancel_task(alice, task.pk)
    html = page(alice_web, task)
    assert "reports its progress only, no metrics" in section(html, "task-metrics")
    assert "yet" not in section(html, "task-metrics")


def test_a_training_task_waits_for_metrics_until_it_is_finished(alice_web: Client, alice: Any) -> None:
    task = post_task(alice, "cube_training", {"synthetic_samples": 64})
    assert "No metrics reported yet." in section(page(alice_web, task), "task-metrics")
    services.cancel_task(alice, task.pk)
    metrics = section(page(alice_web, task), "task-metrics")
    assert "No metrics were reported." in metrics
    assert "yet" not in metrics

    Task.objects.filter(pk=task.pk).update(metrics={"loss": 0.123456})
    metrics = section(page(alice_web, task), "task-metrics")
    assert "loss 0.1235" in metrics
    assert "No metrics" not in metrics


# --- The ledger section: whether the page should read it again ----------------------------


def test_the_ledger_section_says_whether_a_row_waits_for_a_block(alice_web: Client, alice: Any) -> None:
    task = post_task(alice, spec={"n": 512})
    html = page(alice_web, task)
    assert re.search(r'id="task-ledger"[^>]*data-pending="true"', html)
    assert "Pending" in section(html, "task-ledger")

    seal_all()
    html = page(alice_web, task)
    assert re.search(r'id="task-ledger"[^>]*data-pending="false"', html)
    assert re.search(r"Sealed · <a [^>]*>#\d+</a>", html)
