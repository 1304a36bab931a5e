"""The task page's charts and worker log in a real headless Chromium against daphne: charts
with axes and tick labels, values under the cursor, a metric and its validation twin on one
chart, smoothing that redraws without a reload, and a log that holds every stored line, is
searched in place, keeps streaming, and downloads whole."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from ledger.units import UNITS_PER_CREDIT
from tests.conftest import funded
from tests.e2e.browsing import expect, log_in, screenshot
from tests.e2e.test_live_task import worker_send
from tests.factories import UserFactory, make_worker, post_task
from tests.workers.test_pages import CAPS as RIG_CAPS
from tests.workers.test_pages import make_assignment
from workers.live import log as job_log

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def history(steps: int) -> list[dict[str, float]]:
    """A run's stored chart points: a falling loss, a noisier validation loss, a learning rate."""
    return [
        {
            "t": 1.0 * step,
            "step": step,
            "loss": 2.0 / step,
            "val_loss": 2.5 / step + (0.4 if step % 2 else 0.0),
            "lr": 0.001,
        }
        for step in range(1, steps + 1)
    ]


def legend_value(chart: Any, label: str) -> str:
    row = chart.locator(".u-legend .u-series").filter(
        has=chart.page.locator(".u-label", has_text=re.compile(f"^{label}$"))
    )
    return str(row.locator(".u-value").inner_text())


def hover(chart: Any, x: float) -> None:
    """Put the cursor at ``x`` (0 to 1) of the chart's plotting area, half way up."""
    area = chart.locator(".u-over")
    area.scroll_into_view_if_needed()
    box = area.bounding_box()
    # Two pixels inside either edge: a cursor on the edge itself may count as off the chart,
    # where the legend shows the latest values instead.
    left = box["x"] + max(2.0, min(box["width"] * x, box["width"] - 2))
    middle = box["y"] + box["height"] / 2
    chart.page.mouse.move(left, middle - 1)
    chart.page.mouse.move(left, middle)


def test_charts_have_axes_values_on_hover_pairs_and_smoothing(page: Any, live_url: str) -> None:
    requester: Any = funded(UserFactory(username="cora"))
    provider: Any = UserFactory(username="carl")
    task = post_task(requester, title="Charted run", budget=UNITS_PER_CREDIT)
    worker, raw, _ = make_worker(provider, name="carl-h100", caps=RIG_CAPS)
    assignment = make_assignment(task, worker, history=history(20), progress=40.0)

    log_in(page, "cora")
    page.goto(f"/tasks/{task.pk}/")
    expect()(page.locator("#live-state")).to_have_text("Live updates on")

    charts = page.locator("#task-charts figure")
    expect()(charts).to_have_count(2)  # loss with val_loss, and lr
    loss = page.locator('#task-charts figure[data-metric="loss"]')
    expect()(loss.locator("figcaption")).to_have_text("loss")
    expect()(loss.locator(".u-legend .u-label")).to_have_text(["step", "loss", "val_loss"])
    expect()(page.locator('#task-charts figure[data-metric="lr"] .u-legend .u-label')).to_have_text(["step", "lr"])
    # Axes with tick labels: steps along the bottom, values up the side.
    expect()(loss).to_have_attribute("data-ticks-x", re.compile(r"\b(5|10|15|20)\b"))
    expect()(loss).to_have_attribute("data-ticks-y", re.compile(r"\d"))
    expect()(loss.locator("[role=img]")).to_have_attribute("aria-label", re.compile(r"^loss over steps 1 to 20, from "))

    # The cursor on the chart shows the step and each line's value there.
    hover(loss, 0.0)
    expect()(loss.locator(".u-legend .u-series").first.locator(".u-value")).to_have_text("1")
    assert legend_value(loss, "loss") == "2"
    assert legend_value(loss, "val_loss") == "2.9"
    hover(loss, 1.0)
    expect()(loss.locator(".u-legend .u-series").first.locator(".u-value")).to_have_text("20")
    raw_last = legend_value(loss, "val_loss")
    assert raw_last == "0.125"
    before = loss.locator("canvas").screenshot()

    # Smoothing redraws from the data in hand: the values under the cursor change, and so
    # does the picture; nothing is read again from the server.
    reads: list[str] = []
    page.on("request", lambda request: reads.append(request.url))
    slider = page.get_by_label("Smoothing")
    slider.focus()
    for _ in range(90):
        page.keyboard.press("ArrowRight")
    expect()(page.locator("#chart-smoothing-value")).to_have_text("0.90")
    hover(loss, 0.5)
    hover(loss, 1.0)
    smoothed_last = legend_value(loss, "val_loss")
    assert smoothed_last != raw_last
    assert float(smoothed_last) > float(raw_last)  # the average still carries the earlier, higher values
    assert loss.locator("canvas").screenshot() != before
    assert not [url for url in reads if "/live.json" in url or "/api/" in url]

    # Live: a new point over the worker's socket extends the chart, smoothed like the rest.
    replies = worker_send(
        live_url,
        raw,
        {
            "type": "progress",
            "assignment_id": str(assignment.pk),
            "step": 21,
            "total": 50,
            "metrics": {"loss": 0.05, "val_loss": 0.07, "lr": 0.001},
        },
    )
    assert replies == []
    expect()(loss.locator("[role=img]")).to_have_attribute("aria-label", re.compile(r"over steps 1 to 21,"))
    hover(loss, 0.5)
    hover(loss, 1.0)
    expect()(loss.locator(".u-legend .u-series").first.locator(".u-value")).to_have_text("21")
    screenshot(page, "charts-1280")

    # A phone: the charts take the screen's width and the page does not scroll sideways.
    page.set_viewport_size({"width": 375, "height": 800})
    page.wait_for_function(
        "() => document.querySelector('#task-charts figure canvas').getBoundingClientRect().right <= 375"
    )
    assert page.evaluate("document.documentElement.scrollWidth") <= 375
    screenshot(page, "charts-375")


def test_the_log_holds_every_stored_line_filters_streams_and_downloads(page: Any, live_url: str) -> None:
    requester: Any = funded(UserFactory(username="lena"))
    provider: Any = UserFactory(username="liam")
    task = post_task(requester, title="Logged run", budget=UNITS_PER_CREDIT)
    worker, raw, _ = make_worker(provider, name="liam-h100", caps=RIG_CAPS)
    assignment = make_assignment(task, worker)
    lines = [f"epoch {i} loss={1 / i:.4f}" for i in range(1, 451)]
    for start in range(0, len(lines), 50):
        job_log.append(str(assignment.pk), lines[start : start + 50])

    log_in(page, "lena")
    page.goto(f"/tasks/{task.pk}/")
    expect()(page.locator("#live-state")).to_have_text("Live updates on")
    # A job that reported no metrics has no chart, and no smoothing control either.
    expect()(page.locator("#task-charts figure")).to_have_count(0)
    expect()(page.locator("#chart-controls")).to_be_hidden()
    log = page.locator("#task-log li")
    # More than the stored tail: the page read the earlier lines from the full log.
    expect()(log).to_have_count(450)
    expect()(log.first).to_have_text("epoch 1 loss=1.0000")
    expect()(page.locator("#log-matches")).to_have_text("450 lines")

    search = page.get_by_label("Search the log")
    search.fill("epoch 7")
    visible = page.locator("#task-log li:visible")
    expected = [line for line in lines if "epoch 7" in line]
    expect()(visible).to_have_text(expected)
    expect()(page.locator("#log-matches")).to_have_text(f"{len(expected)} of 450 lines match")

    # New lines stream in under the search: a match is shown, the rest counted but hidden.
    worker_send(
        live_url,
        raw,
        {"type": "log", "assignment_id": str(assignment.pk), "lines": ["epoch 700 loss=0.0001", "checkpoint saved"]},
    )
    expect()(page.locator("#log-matches")).to_have_text(f"{len(expected) + 1} of 452 lines match")
    expect()(visible.last).to_have_text("epoch 700 loss=0.0001")
    search.fill("")
    expect()(page.locator("#task-log li:visible")).to_have_count(452)
    expect()(log.last).to_have_text("checkpoint saved")

    link = page.get_by_role("link", name="Download full log")
    with page.expect_download() as info:
        link.click()
    body = Path(info.value.path()).read_text(encoding="utf-8")
    assert body.startswith("# liam-h100, attempt 1 (")
    assert "epoch 1 loss=1.0000\n" in body
    assert body.count("\n") >= 451

    # Another user's browser gets nothing of it.
    outsider = page.context.browser.new_context(base_url=live_url)
    try:
        other = outsider.new_page()
        UserFactory(username="otto")
        log_in(other, "otto")
        assert other.request.get(f"/workers/tasks/{task.pk}/log.txt").status == 404
        query = f"/workers/tasks/{task.pk}/log.json?assignment={assignment.pk}"
        assert other.request.get(query).status == 404
    finally:
        outsider.close()
