"""The task page as a run page: the verdict with its numbers and the cost first, result
files with sizes and all of them as one ZIP, re-running a task, and two runs compared.
Each capability with its attacks: another user's task, a malformed id, a kind mismatch."""

from __future__ import annotations

import io
import re
import zipfile
from html import unescape
from typing import Any

import pytest
from django.test import Client

from marketplace.kinds import KINDS
from marketplace.models import Task, TaskStatus
from tests.factories import post_task
from tests.runs import ASL_METRICS, CUBE_CHECKS, completed_cube, short_asl
from tests.workers.test_pages import login, text

pytestmark = pytest.mark.django_db


def visible(html: str, element_id: str) -> str:
    """The visible text of the element with that id up to the end of its card."""
    start = html.index(f'id="{element_id}"')
    end = html.index("</section>", start)
    body = re.sub(r"<[^>]+>", " ", html[html.index(">", start) + 1 : end])
    return re.sub(r"\s+", " ", unescape(body)).strip()


# --- The summary first -------------------------------------------------------------------


def test_a_completed_run_shows_its_verdict_bars_cost_and_file_sizes_first(alice: Any) -> None:
    task = completed_cube(alice)
    html = login("alice").get(f"/tasks/{task.pk}/").content.decode()
    summary = visible(html, "run-summary")
    assert "Passed" in summary
    for check in CUBE_CHECKS:
        assert check.measured.capitalize() in summary
        assert check.bar in summary
    assert "at least 20%" in summary
    assert "58%" in summary
    assert "Paid to workers 3 credits" in summary
    assert "Platform fee 0.5 credits" in summary
    assert "Refunded to you 96.5 credits" in summary
    for name in KINDS["cube_training"].artifacts:
        assert name in summary
    assert "1.5 KB" in summary  # the first file's size, in words
    assert f'href="/tasks/{task.pk}/results.zip"' in html
    # The summary comes before the charts and the workers.
    assert html.index('id="run-summary"') < html.index('id="progress-heading"') < html.index('id="task-ledger"')


def test_a_run_short_of_its_bar_says_by_how_much_and_that_it_waits_again(alice: Any) -> None:
    task = short_asl(alice)
    assert task.status == TaskStatus.OPEN
    assert task.progress == 0  # the run in hand is gone: not 100 % while it waits
    html = login("alice").get(f"/tasks/{task.pk}/").content.decode()
    summary = visible(html, "run-summary")
    assert "Fell short of the bar" in summary
    assert "Held-out top-1 accuracy 0.3000 is below the required 0.5000." in summary
    assert "at least 0.5000 (the spec's min_accuracy)" in summary
    assert "Open — 1 result fell short, waiting for another worker." in summary
    # The banner over the page names the numbers too.
    assert "fell short of the task's quality bar (held-out top-1 accuracy 0.3000 is below the required 0.5000)" in (
        task.status_reason
    )
    assert 'value="0.000000"' in html  # the progress bar


def test_the_rejected_results_numbers_are_kept_on_its_assignment(alice: Any) -> None:
    task = short_asl(alice)
    (assignment,) = task.assignments.all()
    assert assignment.metrics["heldout_top1"] == ASL_METRICS["heldout_top1"]


def test_a_run_with_no_result_yet_says_so(alice: Any) -> None:
    task = post_task(alice, spec={"n": 64})
    summary = visible(login("alice").get(f"/tasks/{task.pk}/").content.decode(), "run-summary")
    assert "No result judged yet" in summary
    assert "Still in escrow 5 credits" in summary


# --- Download all ------------------------------------------------------------------------


def test_the_owner_downloads_all_result_files_as_one_zip(alice: Any) -> None:
    task = completed_cube(alice)
    response = login("alice").get(f"/tasks/{task.pk}/results.zip")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/zip"
    assert f'filename="task-{task.pk}-results.zip"' in response["Content-Disposition"]
    archive = zipfile.ZipFile(io.BytesIO(response.getvalue()))
    names = KINDS["cube_training"].artifacts
    assert archive.namelist() == list(names)
    assert archive.read(names[0]) == b"x" * 1500


def test_another_users_zip_is_not_found(alice: Any, bob: Any) -> None:
    task = completed_cube(alice)
    assert login("bob").get(f"/tasks/{task.pk}/results.zip").status_code == 404
    assert Client().get(f"/tasks/{task.pk}/results.zip").status_code == 302  # to log in


def test_a_task_without_result_files_has_no_zip(alice: Any) -> None:
    task = short_asl(alice)
    assert login("alice").get(f"/tasks/{task.pk}/results.zip").status_code == 404


# --- Re-run ------------------------------------------------------------------------------


def test_rerun_fills_the_post_form_with_the_tasks_settings(alice: Any) -> None:
    task = completed_cube(alice, title="Lattice 3", spec={"lattice_edge": 4, "epochs": 7})
    Task.objects.filter(pk=task.pk).update(min_reputation=40, max_attempts=5, replication=2)
    html = login("alice").get(f"/tasks/{task.pk}/").content.decode()
    assert f'href="/tasks/new/cube_training/?from={task.pk}"' in html
    form = login("alice").get(f"/tasks/new/cube_training/?from={task.pk}")
    assert form.status_code == 200
    body = form.content.decode()
    for name, value in [
        ("title", "Lattice 3"),
        ("budget", "100"),
        ("min_reputation", "40"),
        ("max_attempts", "5"),
        ("replication", "2"),
        ("spec_lattice_edge", "4"),
        ("spec_epochs", "7"),
    ]:
        assert re.search(rf'name="{name}"[^>]*value="{re.escape(value)}"', body), name


def test_rerun_of_another_users_task_is_not_found(alice: Any, bob: Any) -> None:
    task = completed_cube(alice)
    response = login("bob").get(f"/tasks/new/cube_training/?from={task.pk}")
    assert response.status_code == 404
    assert "Lattice" not in response.content.decode()


@pytest.mark.parametrize("value", ["", "not-a-uuid", "1234"])
def test_rerun_with_a_malformed_id_is_a_400_naming_the_field(alice: Any, value: str) -> None:
    response = login("alice").get(f"/tasks/new/synthetic/?from={value}")
    assert response.status_code == 400
    assert re.search(r"\bfrom : ", text(response))


def test_rerun_on_another_kinds_form_is_a_400(alice: Any) -> None:
    task = completed_cube(alice)
    response = login("alice").get(f"/tasks/new/synthetic/?from={task.pk}")
    assert response.status_code == 400
    assert "cube_training task, not synthetic" in text(response)


# --- Compare -----------------------------------------------------------------------------


def test_two_runs_of_a_kind_compare_side_by_side(alice: Any) -> None:
    a = completed_cube(alice, title="Run A", spec={"epochs": 4})
    b = completed_cube(alice, title="Run B", spec={"epochs": 9})
    page = login("alice").get(f"/tasks/{a.pk}/").content.decode()
    assert 'action="/tasks/compare/"' in page
    assert f'<option value="{b.pk}">' in page
    response = login("alice").get(f"/tasks/compare/?a={a.pk}&b={b.pk}")
    assert response.status_code == 200
    html = response.content.decode()
    spec = visible(html, "compare-spec")
    assert "Run A" in spec
    assert "Run B" in spec
    epochs = re.search(r"<tr[^>]*><th scope=\"row\"><code>epochs</code>.*?</tr>", html, re.S)
    assert epochs
    assert 'class="differs"' in epochs.group(0)
    seed = re.search(r"<tr[^>]*><th scope=\"row\"><code>seed</code>.*?</tr>", html, re.S)
    assert seed
    assert "differs" not in seed.group(0)
    assert visible(html, "compare-verdicts").count("Passed") == 2
    assert "heldout_val_loss" in visible(html, "compare-metrics")
    assert "Platform fee 0.5 0.5" in visible(html, "compare-cost")


def test_runs_of_different_kinds_do_not_compare(alice: Any) -> None:
    a = completed_cube(alice)
    b = post_task(alice, spec={"n": 64})
    response = login("alice").get(f"/tasks/compare/?a={a.pk}&b={b.pk}")
    assert response.status_code == 400
    assert "runs compare within one kind: a is cube_training, b is synthetic." in text(response)


def test_another_users_run_does_not_compare(alice: Any, bob: Any) -> None:
    mine = completed_cube(alice)
    theirs = completed_cube(bob)
    for query in (f"a={mine.pk}&b={theirs.pk}", f"a={theirs.pk}&b={mine.pk}"):
        assert login("alice").get(f"/tasks/compare/?{query}").status_code == 404
    # Nor is it offered on the task page.
    assert str(theirs.pk) not in login("alice").get(f"/tasks/{mine.pk}/").content.decode()


@pytest.mark.parametrize("query", ["", "a=", "b=x", "a=nope&b=nope"])
def test_compare_with_missing_or_malformed_ids_is_a_400_naming_the_field(alice: Any, query: str) -> None:
    response = login("alice").get(f"/tasks/compare/?{query}")
    assert response.status_code == 400
    assert re.search(r"\b[ab] : (a task id is required|.* is not a task id)", text(response))
