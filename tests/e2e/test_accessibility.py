"""Every page a user can reach, checked with axe-core in a real Chromium at 1280 and 375 px:
no "serious" or "critical" violation, and at 375 px no page wider than the viewport.

One daphne and one browser for the module, one signed-in context per role and width. The
rows are made once, committed outside any test's transaction (the pages are served by
another process), and the database is flushed when the module ends, as a transactional
test's is. Each page's screenshot at each width goes to var/test-artifacts/screenshots/
(git-ignored) for a person to look at. axe-core is vendored in tests/e2e/vendor/.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.browsing import log_in, screenshot
from tests.factories import UserFactory, make_dataset, make_worker, post_task

# The rows are made once for the module; the tests only read pages. Transactional, so no
# open transaction of this process holds SQLite's lock while daphne writes (a sign-in); and
# the flush after each test limited to an app without tables, so the rows and the signed-in
# sessions last the module (the ``rows`` fixture flushes them all at its end).
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True, available_apps=["django.contrib.staticfiles"]),
]

ROOT = Path(__file__).resolve().parents[2]
AXE = Path(__file__).resolve().parent / "vendor" / "axe.min.js"
WIDTHS = (1280, 375)
BLOCKING = ("serious", "critical")
KINDS = ("synthetic", "cube_training", "cube_inference", "asl_training", "asl_inference")


@dataclass(frozen=True)
class Page:
    """A page to check: who looks at it, and its path from the module's rows."""

    name: str
    role: str
    path: Callable[[dict[str, Any]], str]


def fixed(path: str) -> Callable[[dict[str, Any]], str]:
    return lambda rows: path


PAGES = [
    Page("home", "anonymous", fixed("/")),
    Page("login", "anonymous", fixed("/accounts/login/")),
    Page("signup", "anonymous", fixed("/accounts/signup/")),
    Page("password-reset", "anonymous", fixed("/accounts/password/reset/")),
    Page("explorer", "anonymous", fixed("/explorer/")),
    Page("block", "anonymous", lambda rows: f"/explorer/blocks/{rows['height']}/"),
    Page("transaction", "anonymous", lambda rows: f"/explorer/tx/{rows['tx']}/"),
    Page("address", "anonymous", lambda rows: f"/explorer/address/{rows['address']}/"),
    Page("search", "anonymous", fixed("/explorer/search/?q=nothing-matches-this")),
    Page("market", "anonymous", fixed("/market/")),
    *(Page(f"market-{kind}", "anonymous", fixed(f"/market/{kind}/")) for kind in KINDS),
    Page("my-tasks", "requester", fixed("/tasks/")),
    Page("post-a-task", "requester", fixed("/tasks/new/")),
    *(Page(f"post-{kind}", "requester", fixed(f"/tasks/new/{kind}/")) for kind in KINDS),
    Page("task-finished", "requester", lambda rows: f"/tasks/{rows['finished']}/"),
    Page("task-failed", "requester", lambda rows: f"/tasks/{rows['failed']}/"),
    Page("compare", "requester", lambda rows: f"/tasks/compare/?a={rows['finished']}&b={rows['failed']}"),
    Page("datasets", "requester", fixed("/datasets/")),
    Page("dataset", "requester", lambda rows: f"/datasets/{rows['dataset']}/"),
    Page("wallet", "requester", fixed("/wallet/")),
    Page("account", "requester", fixed("/account/")),
    Page("my-workers", "provider", fixed("/workers/")),
    Page("worker", "provider", lambda rows: f"/workers/{rows['worker']}/"),
    Page("worker-register", "provider", fixed("/workers/register")),
    Page("admin", "staff", fixed("/admin/")),
    Page("operations", "staff", fixed("/admin/operations/")),
]

USERS = {"requester": "alice", "provider": "pat", "staff": "root"}


def make_rows() -> dict[str, Any]:
    """A requester with a finished task, a failed one and a dataset; a provider with a
    worker; a staff account; a sealed block of the requester's transactions."""
    from django.db import transaction

    from ledger import services as ledger
    from ledger.models import Block, Transaction
    from ledger.sealer import seal_all
    from marketplace import lifecycle
    from tests.conftest import funded

    alice = funded(UserFactory(username="alice"))
    pat = funded(UserFactory(username="pat"))
    UserFactory(username="root", is_staff=True, is_superuser=True)
    finished = post_task(alice, spec={"n": 512}, title="A finished proof of compute")
    failed = post_task(alice, spec={"n": 512}, title="A task that failed")
    with transaction.atomic():
        locked = lifecycle.lock_task(finished.pk)
        assert locked is not None
        lifecycle.complete_locked(locked, {"result_hash": "ab" * 32, "gflops": 1.5})
    with transaction.atomic():
        locked = lifecycle.lock_task(failed.pk)
        assert locked is not None
        lifecycle.fail_locked(locked, "No worker could take it within 60 minutes.", reason="expired")
    dataset = make_dataset(alice, name="Teacher embeddings")
    worker = make_worker(pat, name="rig-1").worker
    seal_all()
    block = Block.objects.order_by("-height").first()
    tx = Transaction.objects.filter(block__isnull=False).order_by("-pk").first()
    assert block is not None
    assert tx is not None
    return {
        "finished": finished.pk,
        "failed": failed.pk,
        "dataset": dataset.pk,
        "worker": worker.pk,
        "height": block.height,
        "tx": tx.hash,
        "address": ledger.ensure_user_account(alice).address,
    }


@pytest.fixture(scope="module")
def rows(django_db_blocker: Any, live_url: str) -> Iterator[dict[str, Any]]:
    from django.core.management import call_command

    # Made before the module's browser starts (``pages`` asks for it first): the services
    # send page events through async_to_sync, which refuses to run beside Playwright's loop.
    with django_db_blocker.unblock():
        made = make_rows()
    yield made
    with django_db_blocker.unblock():
        call_command("flush", interactive=False, verbosity=0)


@pytest.fixture(scope="module")
def pages(rows: dict[str, Any], browser: Any, live_url: str) -> Iterator[Callable[[str, int], Any]]:
    """A page per role and width, signed in once and reused."""
    made: dict[tuple[str, int], Any] = {}
    contexts = []

    def page_for(role: str, width: int) -> Any:
        if (role, width) not in made:
            context = browser.new_context(base_url=live_url, viewport={"width": width, "height": 900})
            context.set_default_timeout(15_000)
            contexts.append(context)
            page = context.new_page()
            if role != "anonymous":
                log_in(page, USERS[role])
            made[role, width] = page
        return made[role, width]

    yield page_for
    for context in contexts:
        context.close()


def violations(page: Any) -> list[dict[str, Any]]:
    """axe-core's serious and critical violations on the page as it stands."""
    if not page.evaluate("typeof window.axe !== 'undefined'"):
        page.add_script_tag(path=str(AXE))
    found: list[dict[str, Any]] = page.evaluate(
        """async (blocking) => {
          const result = await axe.run(document, {resultTypes: ["violations"]});
          return result.violations.filter((v) => blocking.includes(v.impact)).map((v) => ({
            id: v.id, impact: v.impact, help: v.help,
            nodes: v.nodes.slice(0, 5).map((n) => n.target.join(" ") + ": " + n.failureSummary.split("\\n")[1]),
          }));
        }""",
        list(BLOCKING),
    )
    return found


def cases() -> Iterator[Any]:
    for spec in PAGES:
        for width in WIDTHS:
            case_id = f"{spec.role}-{spec.name}-{width}"
            yield pytest.param(spec, width, id=case_id)


@pytest.mark.parametrize(("spec", "width"), list(cases()))
def test_page_has_no_serious_violation_and_fits(
    rows: dict[str, Any], pages: Callable[[str, int], Any], spec: Page, width: int
) -> None:
    page = pages(spec.role, width)
    path = spec.path(rows)
    response = page.goto(path)
    assert response is not None
    assert response.status == 200, f"{path}: {response.status}"
    page.wait_for_load_state("load")
    screenshot(page, f"{spec.role}-{spec.name}-{width}")
    found = violations(page)
    assert not found, f"{path} at {width} px: " + "\n".join(
        f"{v['impact']} {v['id']} ({v['help']}): {'; '.join(v['nodes'])}" for v in found
    )
    if width < 640:
        scroll_width, inner_width = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
        assert scroll_width <= inner_width, f"{path} is {scroll_width} px wide in a {inner_width} px viewport"
