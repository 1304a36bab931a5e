"""The task page as a run page, in headless Chromium against daphne: at 1280 × 800 a
finished run's verdict and cost are on screen without scrolling, for a completed cube run
and for an ASL run short of its bar that waits again; at 375 px the page is one column and
never scrolls sideways. Screenshots of each go to the test's artifact folder
(``var/test-artifacts/screenshots/``, git-ignored) for a person to look at."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.browsing import expect, log_in, screenshot
from tests.e2e.test_narrow_pages import OVERFLOWING
from tests.runs import completed_cube, short_asl
from tests.workers import processes

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def daphne_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("daphne")


@pytest.fixture(scope="module")
def live_url(django_db_setup: Any, django_db_blocker: Any, daphne_dir: Path) -> Iterator[str]:
    """daphne as tests/e2e/conftest.py starts it, with its media folder known to the tests
    (``_media_root``), so the result files they store are the ones it serves."""
    with django_db_blocker.unblock(), processes.deployed_daphne(daphne_dir) as url:
        yield url


@pytest.fixture(autouse=True)
def _media_root(settings: Any, daphne_dir: Path) -> None:
    settings.MEDIA_ROOT = daphne_dir / "media"


@pytest.fixture
def sized(browser: Any, live_url: str, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A page of the width the test is parametrised with, 800 px tall."""
    width = request.node.callspec.params["width"]
    context = browser.new_context(base_url=live_url, viewport={"width": width, "height": 800})
    context.set_default_timeout(15_000)
    try:
        yield context.new_page()
    finally:
        context.close()


def bottom(page: Any, selector: str) -> float:
    box = page.locator(selector).first.bounding_box()
    assert box is not None, selector
    return float(box["y"] + box["height"])


@pytest.mark.parametrize("width", [1280, 375])
@pytest.mark.parametrize("run", ["completed", "short"])
def test_a_finished_runs_verdict_and_cost_come_first(sized: Any, alice: Any, width: int, run: str) -> None:
    task = completed_cube(alice) if run == "completed" else short_asl(alice)
    page = sized
    log_in(page, "alice")
    page.goto(f"/tasks/{task.pk}/")
    verdict = page.locator("#task-verdict")
    expect()(verdict).to_contain_text("Passed" if run == "completed" else "Fell short of the bar")
    if run == "short":
        expect()(verdict).to_contain_text("below the required 0.5000")
        expect()(verdict).to_contain_text("Open — 1 result fell short, waiting for another worker")
        expect()(page.locator("#task-progress-text")).to_have_text("0%")
    else:
        expect()(page.locator("#run-summary")).to_contain_text("Download all")
        expect()(page.locator("#run-summary")).to_contain_text("KB")
    screenshot(page, f"run-page-{run}-{width}", full_page=False)
    screenshot(page, f"run-page-{run}-{width}-full")

    scroll_width, inner_width = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert scroll_width <= inner_width, page.evaluate(OVERFLOWING)
    if width == 1280:
        # Above the fold: the verdict's why and the cost, without scrolling.
        assert bottom(page, "#verdict-why") <= 800
        assert bottom(page, "#task-cost") <= 800
        # Two columns: the workers card sits beside the progress card, not under it.
        progress = page.locator("#progress-heading").bounding_box()
        workers = page.locator("#workers-heading").bounding_box()
        assert progress is not None
        assert workers is not None
        assert workers["x"] > progress["x"] + 300
    else:
        # One column: the workers card comes under the progress card.
        progress = page.locator("#progress-heading").bounding_box()
        workers = page.locator("#workers-heading").bounding_box()
        assert progress is not None
        assert workers is not None
        assert workers["y"] > progress["y"]
        assert abs(workers["x"] - progress["x"]) < 2
