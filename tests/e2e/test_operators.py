"""Operators and providers in a real browser: My workers fits a 1,280 px screen with its
Suspend and Retire buttons in view, and a phone's width without the page scrolling
sideways; an operator suspends a node through the admin's confirmation page with a
reason, and its owner reads it; the admin's lists and the operations dashboard fit
1,280 px. Screenshots go to var/test-artifacts/screenshots/ (git-ignored)."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from ledger import services as ledger
from ledger.units import UNITS_PER_CREDIT
from tests.e2e.browsing import expect, log_in, new_page, screenshot
from tests.factories import PASSWORD, UserFactory, make_worker, post_task
from workers.models import Worker

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


# A busy rig reports a lot: every field the table shows, at its longest.
WIDE_CAPS = {
    "cpu_cores": 128,
    "ram_bytes": 1024 * 2**30,
    "gpu_name": "NVIDIA H100 80GB HBM3",
    "gpu_memory_bytes": 80 * 2**30,
    "cuda_version": "12.4",
    "kinds": ["synthetic", "cube_training", "asl_training", "cube_inference", "asl_inference"],
    "features": ["poc:aes256ctr", "poc:shake128"],
    "agent_version": "0.1.0",
}

# The page scrolls sideways when anything sticks out past the viewport.
PAGE_SCROLLS = "() => document.documentElement.scrollWidth > window.innerWidth"
# An admin list's columns overflow its results box (which then scrolls on its own).
LIST_OVERFLOWS = """() => {
  const r = document.querySelector("#changelist .results");
  if (!r) throw new Error("the list has no rows to measure");
  return r.scrollWidth > r.clientWidth;
}"""


def shoot(page: Any, name: str) -> None:
    screenshot(page, f"operators-{name}")


def inside_viewport(page: Any, locator: Any) -> bool:
    box = locator.bounding_box()
    width = page.evaluate("() => window.innerWidth")
    return box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width


def provider_with_rigs() -> Any:
    provider: Any = UserFactory(username="petra")
    make_worker(provider, name="petra-h100-rack-07", caps=WIDE_CAPS, benchmark_gflops=48123.4, earnings=123_456_789_000)
    silent = make_worker(provider, name="petra-a100", caps=WIDE_CAPS).worker
    Worker.objects.filter(pk=silent.pk).update(last_heartbeat_at=timezone.now() - timedelta(minutes=5, seconds=2))
    return provider


def test_my_workers_fits_the_screen_and_says_when_a_node_was_last_heard(page: Any) -> None:
    provider_with_rigs()
    log_in(page, "petra")
    expect()(page).to_have_url(re.compile(r"/workers/$"))  # a provider without tasks lands here
    silent = page.get_by_role("row").filter(has_text="petra-a100")
    expect()(silent.locator("[data-worker-status]")).to_have_text("Offline")
    expect()(silent.locator("[data-worker-presence]")).to_have_text("last heartbeat 5 min ago")
    shoot(page, "my-workers-1280")
    widths = page.evaluate(
        "() => Array.from(document.querySelectorAll('.workers-table tbody tr:first-child > *'))"
        ".map((c) => Math.round(c.getBoundingClientRect().width))"
    )
    table = page.locator("table.workers-table")
    wrap = page.locator(".table-wrap").first
    assert table.bounding_box()["width"] <= wrap.bounding_box()["width"], widths
    assert table.bounding_box()["width"] <= wrap.bounding_box()["width"]
    for name in ("Suspend", "Retire"):
        buttons = page.get_by_role("button", name=re.compile(f"^{name} "))
        expect()(buttons).to_have_count(2)
        for i in range(2):
            assert inside_viewport(page, buttons.nth(i)), f"{name} button {i} is cut off at 1280 px"

    page.set_viewport_size({"width": 375, "height": 800})
    page.reload()
    assert not page.evaluate(PAGE_SCROLLS)
    shoot(page, "my-workers-375")


def test_an_operator_suspends_a_node_with_a_reason_its_owner_reads(browser: Any, live_url: str) -> None:
    provider_with_rigs()
    requester: Any = UserFactory(username="bob")
    ledger.deposit(requester, 10 * UNITS_PER_CREDIT, "e2e-bob")
    post_task(requester, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT, title="A task with a long-ish title to list")
    UserFactory(username="root", is_staff=True, is_superuser=True)
    with new_page(browser, live_url) as admin:
        admin.goto("/admin/login/")
        admin.get_by_label("Username").fill("root")
        admin.get_by_label("Password").fill(PASSWORD)
        admin.get_by_role("button", name="Log in").click()
        expect()(admin.locator("#operations-link")).to_be_visible()

        admin.goto("/admin/workers/worker/")
        shoot(admin, "admin-workers-1280")
        assert not admin.evaluate(PAGE_SCROLLS)
        assert not admin.evaluate(LIST_OVERFLOWS), "the workers list's columns do not fit 1280 px"
        row = admin.get_by_role("row").filter(has_text="petra-h100-rack-07")
        row.get_by_role("checkbox").check()
        admin.get_by_label("Action:").select_option("suspend")
        admin.get_by_role("button", name="Go").click()

        # The confirmation page: nothing happened yet, and it will not without a reason.
        expect()(admin.locator("#confirm-objects")).to_contain_text("petra-h100-rack-07")
        shoot(admin, "admin-confirm-1280")
        admin.get_by_role("button", name=re.compile("^Yes")).click()
        # The browser holds the form back without a reason (the server refuses it too:
        # tests/test_admin_actions.py).
        assert admin.get_by_label("Reason:").evaluate("(el) => el.validity.valueMissing")
        expect()(admin.locator("#confirm-objects")).to_be_visible()
        assert Worker.objects.get(name="petra-h100-rack-07").state == Worker.State.ACTIVE
        admin.get_by_label("Reason:").fill("Its results failed verification 12 times today.")
        admin.get_by_role("button", name=re.compile("^Yes")).click()
        expect()(admin.locator(".messagelist")).to_contain_text("Suspended 1 worker(s).")

        admin.goto("/admin/operations/")
        expect()(admin.locator("#ops-nodes")).to_contain_text("Suspended")
        assert not admin.evaluate(PAGE_SCROLLS)
        shoot(admin, "admin-operations-1280")
        for path in ("/admin/ledger/transaction/", "/admin/ledger/account/", "/admin/marketplace/task/"):
            admin.goto(path)
            shoot(admin, "admin-" + path.strip("/").replace("/", "-") + "-1280")
            assert not admin.evaluate(PAGE_SCROLLS)
            assert not admin.evaluate(LIST_OVERFLOWS), f"the columns of {path} do not fit 1280 px"

    with new_page(browser, live_url) as owner:
        log_in(owner, "petra")
        said = "Suspended by an operator: Its results failed verification 12 times today."
        expect()(owner.get_by_role("row").filter(has_text="petra-h100-rack-07")).to_contain_text(said)
        owner.get_by_role("link", name="petra-h100-rack-07").click()
        expect()(owner.locator("#state-reason")).to_have_text(said)
        shoot(owner, "worker-suspended-1280")
