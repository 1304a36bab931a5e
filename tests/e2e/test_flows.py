"""What a new user does, in a real headless Chromium against daphne.

Sign up, create an API token, post a synthetic task through the form (meeting an
inline validation error on the way), find it in my tasks, watch its status change
live over the WebSocket, and cancel it.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from ledger.units import format_credits
from marketplace.kinds import KINDS
from marketplace.models import ApiToken, Dataset, Task, User, hash_token
from tests.e2e.browsing import expect, log_in, screenshot
from tests.factories import PASSWORD, UserFactory

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

UUID_PATH = re.compile(r"/tasks/[0-9a-f-]{36}/$")


def test_new_user_signs_up_posts_and_cancels_a_task(page: Any) -> None:
    # Sign up: lands on my tasks, signed in.
    page.goto("/")
    page.get_by_role("link", name="Sign up", exact=True).click()
    page.get_by_label("Username").fill("dora")
    page.get_by_label("Password", exact=True).fill(PASSWORD)
    page.get_by_label("Password confirmation").fill(PASSWORD)
    page.get_by_role("button", name="Sign up").click()
    expect()(page).to_have_url(re.compile(r"/tasks/$"))
    expect()(page.get_by_role("heading", name="My tasks")).to_be_visible()
    expect()(page.locator(".session-user")).to_have_text("dora")
    assert User.objects.filter(username="dora").exists()

    # An API token, shown once.
    page.get_by_role("link", name="Account").click()
    page.get_by_label("Token name").fill("laptop CLI")
    page.get_by_role("button", name="Create token").click()
    raw = page.locator("#new-token")
    expect()(raw).to_have_text(re.compile(r"^pw_\S{20,}$"))
    expect()(page.get_by_text("shown only this once")).to_be_visible()
    token = ApiToken.objects.get(user__username="dora")
    assert token.token_hash == hash_token(raw.inner_text())
    expect()(page.get_by_role("cell", name="laptop CLI", exact=True)).to_be_visible()
    page.reload()
    expect()(page.locator("#new-token")).to_have_count(0)
    # A second token, revoked in place (htmx), the first one untouched.
    page.get_by_label("Token name").fill("old script")
    page.get_by_role("button", name="Create token").click()
    expect()(page.get_by_role("cell", name="old script", exact=True)).to_be_visible()
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Revoke old script").click()
    expect()(page.locator("#messages")).to_contain_text("Token “old script” revoked")
    expect()(page.get_by_role("cell", name="old script", exact=True)).to_have_count(0)
    expect()(page.get_by_role("cell", name="laptop CLI", exact=True)).to_be_visible()
    assert ApiToken.objects.get(name="old script").revoked_at is not None
    assert ApiToken.objects.get(name="laptop CLI").revoked_at is None

    # Post a synthetic task: see the estimate, meet an inline error, fix it, submit.
    page.get_by_role("link", name="Post a task").first.click()
    page.get_by_role("link", name="Synthetic proof of compute").click()
    # The default size costs the price floor (gas of the worker's SUBMIT_RESULT and sweep).
    floor = format_credits(KINDS["synthetic"].estimate_price(KINDS["synthetic"].validate_spec({})))
    expect()(page.locator("#estimate-price")).to_have_text(floor)
    page.get_by_label("Title").fill("My first matmul")
    page.get_by_label("N", exact=True).fill("99999")
    error = page.locator("#id_spec_n_error")
    expect()(error).to_contain_text("less than or equal to 16384")
    expect()(page.get_by_label("N", exact=True)).to_have_attribute("aria-invalid", "true")
    screenshot(page, "post-form-error")
    page.get_by_label("N", exact=True).fill("16384")
    page.get_by_label("Count").fill("32")
    # 32 products of 16384² would be a 32 GiB result, more than the platform takes.
    count_error = page.locator("#id_spec_count_error")
    expect()(count_error).to_contain_text("at most 1 at this n")
    expect()(error).to_have_text("")
    page.get_by_label("Count").fill("1")
    expect()(count_error).to_have_text("")
    expect()(page.locator("#estimate-price")).to_have_text(floor)
    # A budget under the least a job may cost (the floor price plus the fee: the estimate
    # at the floor) is named next to the budget.
    page.get_by_label("Budget (credits)").fill("0.01")
    expect()(page.locator("#id_budget_error")).to_contain_text(f"The least a job may cost is {floor} credits")
    page.get_by_label("Budget (credits)").fill("1")
    expect()(page.locator("#id_budget_error")).to_have_text("")
    expect()(page.get_by_label("N", exact=True)).not_to_have_attribute("aria-invalid", "true")
    screenshot(page, "post-form")
    page.get_by_role("button", name="Post task").click()

    # The detail page: open, and it says why nothing will run it yet.
    expect()(page).to_have_url(UUID_PATH)
    expect()(page.locator("#task-status")).to_have_text("Open")
    if KINDS["synthetic"].available:
        expect()(page.locator("#task-reason")).to_be_hidden()
    else:
        expect()(page.locator("#task-reason")).to_contain_text("No provider runs Synthetic proof of compute tasks yet")
    expect()(page.locator("#live-state")).to_have_text("Live updates on")
    task = Task.objects.get(owner__username="dora")
    assert task.spec == {"n": 16384, "count": 1, "entry_bound": 8, "generator": "aes256ctr"}
    assert task.status == Task.Status.OPEN
    screenshot(page, "task-detail")

    # My tasks lists it.
    page.get_by_role("link", name="My tasks").first.click()
    row = page.get_by_role("row").filter(has_text="My first matmul")
    expect()(row).to_contain_text("Open")

    # Cancel it from its page.
    row.get_by_role("link", name="My first matmul").click()
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Cancel task").click()
    expect()(page.locator("#task-status")).to_have_text("Cancelled")
    expect()(page.locator("#messages")).to_contain_text("Task cancelled.")
    expect()(page.get_by_role("button", name="Cancel task")).to_have_count(0)
    task.refresh_from_db()
    assert task.status == Task.Status.CANCELLED

    # My tasks, filtered by status in place (htmx), with the filter in the address bar.
    page.get_by_role("link", name="My tasks").first.click()
    page.get_by_label("Status").select_option("open")
    expect()(page.locator("#task-list")).to_contain_text("No open tasks.")
    expect()(page).to_have_url(re.compile(r"status=open"))
    page.get_by_label("Status").select_option("cancelled")
    expect()(page.get_by_role("row").filter(has_text="My first matmul")).to_contain_text("Cancelled")


def test_status_changes_arrive_live_over_the_websocket(page: Any, live_url: str) -> None:
    from marketplace import services

    user: Any = UserFactory(username="erin")
    services.welcome_user(user)
    task = services.post_task(user, services.TaskRequest(kind="synthetic", spec={}, budget=10**9, title="Live one"))
    _, raw = services.create_api_token(user, "script")
    log_in(page, "erin")
    page.goto(f"/tasks/{task.pk}/")
    expect()(page.locator("#live-state")).to_have_text("Live updates on")
    page.evaluate("window.__sameDocument = true")

    # Another client (a script with the token) cancels it; the open page follows without a reload.
    response = page.request.post(
        f"{live_url}/api/v1/tasks/{task.pk}/cancel/", headers={"Authorization": f"Token {raw}"}
    )
    assert response.status == 200
    expect()(page.locator("#task-status")).to_have_text("Cancelled")
    expect()(page.get_by_role("button", name="Cancel task")).to_have_count(0)
    assert page.evaluate("window.__sameDocument") is True


def test_another_users_task_is_not_found(page: Any) -> None:
    from marketplace import services

    owner: Any = UserFactory(username="frank")
    services.welcome_user(owner)
    UserFactory(username="gina")
    task = services.post_task(owner, services.TaskRequest(kind="synthetic", spec={}, budget=10**9, title="Frank's"))
    log_in(page, "gina")
    response = page.goto(f"/tasks/{task.pk}/")
    assert response.status == 404
    expect()(page.get_by_role("heading", name="Not found")).to_be_visible()


def test_keyboard_user_can_skip_to_content(page: Any) -> None:
    page.goto("/")
    page.keyboard.press("Tab")
    skip = page.get_by_role("link", name="Skip to content")
    expect()(skip).to_be_focused()
    expect()(skip).to_be_in_viewport()
    page.keyboard.press("Enter")
    expect()(page.locator("#main")).to_be_focused()


def test_upload_and_delete_a_dataset(page: Any, tmp_path: Any) -> None:
    UserFactory(username="hana")
    csv = tmp_path / "points.csv"
    csv.write_bytes(b"x,y\n1,2\n3,4\n")
    log_in(page, "hana")
    page.get_by_role("link", name="Datasets").click()
    expect()(page.get_by_text("Size limit:")).to_be_visible()
    page.get_by_label("File").set_input_files(str(csv))
    page.get_by_role("button", name="Upload").click()
    expect()(page.locator("#messages")).to_contain_text("Uploaded “points.csv”")
    row = page.get_by_role("row").filter(has_text="points.csv")
    expect()(row).to_contain_text("csv")
    dataset = Dataset.objects.get(owner__username="hana")
    expect()(row.locator("code.hash")).to_have_attribute("title", dataset.sha256)

    page.once("dialog", lambda dialog: dialog.accept())
    row.get_by_role("button", name="Delete points.csv").click()
    expect()(page.locator("#messages")).to_contain_text("Dataset deleted.")
    expect()(page.get_by_role("row").filter(has_text="points.csv")).to_have_count(0)
    assert not Dataset.objects.filter(owner__username="hana").exists()
