"""The post page: the common fields first and the rest under "Advanced" (opened when one of
them is refused), an error summary at the top of a refused submit, a warning when the
balance cannot cover the task, the expected run time, and the quality bar the verifier
will apply, in the verifier's own numbers."""

from __future__ import annotations

import html as htmllib
import re
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from marketplace.forms import TaskForm
from marketplace.kinds import KINDS, get_kind
from marketplace.models import Task
from tests.factories import make_worker, post_task
from tests.marketplace.test_pages import default_form, synthetic_form
from workers.models import Assignment

pytestmark = pytest.mark.django_db


def plain(html: str) -> str:
    """The page's text, tags dropped and spaces folded, as a reader meets it."""
    return htmllib.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))).strip()


def block(html: str, element_id: str, tag: str = "div") -> str:
    match = re.search(rf'<{tag}[^>]*id="{element_id}"[^>]*>(.*?)</{tag}>', html, re.S)
    assert match, f"no #{element_id}"
    return match.group(1)


def advanced(html: str) -> str:
    """The "Advanced" disclosure's opening tag and contents."""
    match = re.search(r'(<details[^>]*id="advanced"[^>]*>)(.*?)</details>', html, re.S)
    assert match, "no Advanced section"
    return match.group(0)


def check(client: Client, kind: str, data: dict[str, str]) -> str:
    url = reverse("task-check", args=[kind])
    return client.post(url, data, HTTP_HX_REQUEST="true").content.decode()


# --- Common fields first, the rest under Advanced -------------------------------------


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_kind_shows_its_common_fields_first_and_hides_the_rest_under_advanced(
    alice_web: Client, alice: Any, kind: str
) -> None:
    html = alice_web.get(reverse("task-post", args=[kind])).content.decode()
    section = advanced(html)
    assert " open" not in section.split(">", 1)[0]  # closed on a fresh page
    form = TaskForm(kind=get_kind(kind), owner=alice)
    common = {f.name for f in form.common_spec_fields()}
    assert 1 <= len(common) <= 5
    for name in form.spec_names:
        assert (f'name="spec_{name}"' in section) == (f"spec_{name}" not in common), name
    for name in ("budget", "bid", "replication"):
        assert f'name="{name}"' in html
        assert f'name="{name}"' not in section
    for name in ("min_reputation", "max_attempts"):
        assert f'name="{name}"' in section


def test_the_synthetic_form_has_its_three_sizes_up_front(alice_web: Client) -> None:
    html = alice_web.get(reverse("task-post", args=["synthetic"])).content.decode()
    parameters = html.split("<legend>Parameters</legend>", 1)[1].split("</fieldset>", 1)[0]
    assert re.findall(r'name="(spec_\w+)"', parameters) == ["spec_n", "spec_count", "spec_entry_bound"]


def test_an_error_on_an_advanced_field_opens_the_section(alice_web: Client) -> None:
    response = alice_web.post(reverse("task-post", args=["synthetic"]), synthetic_form(max_attempts="99"))
    assert response.status_code == 400
    section = advanced(response.content.decode())
    assert re.match(r"<details[^>]* open", section)
    assert "less than or equal to 10" in section


def test_an_error_on_a_common_field_leaves_advanced_closed(alice_web: Client) -> None:
    response = alice_web.post(reverse("task-post", args=["synthetic"]), synthetic_form(spec_n="99999"))
    assert response.status_code == 400
    assert not re.match(r"<details[^>]* open", advanced(response.content.decode()))


# --- The error summary ---------------------------------------------------------------


def test_a_refused_submit_leads_with_an_error_summary_linking_each_field(alice_web: Client) -> None:
    response = alice_web.post(
        reverse("task-post", args=["synthetic"]), synthetic_form(spec_n="99999", max_attempts="0")
    )
    assert response.status_code == 400
    html = response.content.decode()
    summary = re.search(r'<div class="error-summary"[^>]*>', html)
    assert summary
    opening = summary.group(0)
    assert 'role="alert"' in opening
    assert 'tabindex="-1"' in opening  # focusable, so app.js can move the focus to it
    assert "data-focus-on-load" in opening
    # It comes before the first fieldset: the top of the form.
    assert html.index('class="error-summary"') < html.index("<fieldset")
    links = re.findall(r'<a href="#([^"]+)" data-field="[^"]+">([^<]*)</a>', html)
    assert [target for target, _ in links] == ["id_spec_n", "id_max_attempts"]
    assert "N: Ensure this value is less than or equal to 16384." in htmllib.unescape(links[0][1])
    for target, _ in links:
        assert f'id="{target}"' in html
    assert "<title>Error: " in html
    assert not Task.objects.exists()


def test_a_service_refusal_is_in_the_summary_too(alice_web: Client) -> None:
    response = alice_web.post(reverse("task-post", args=["synthetic"]), synthetic_form(budget="1000.5"))
    assert response.status_code == 400
    html = response.content.decode()
    summary = plain(block(html, "error-summary"))
    assert "Budget (credits): Your available balance is 1000 credits" in summary
    # The estimate beside it still warns, with the link to buy credits.
    assert "Posting this task holds 1000.5 credits in escrow" in plain(block(html, "balance-warning"))


def test_a_fresh_page_and_the_live_check_have_no_summary(alice_web: Client) -> None:
    assert "error-summary" not in alice_web.get(reverse("task-post", args=["synthetic"])).content.decode()
    assert "error-summary" not in check(alice_web, "synthetic", synthetic_form(spec_n="99999"))


# --- The balance warning -------------------------------------------------------------


def test_a_budget_over_the_balance_warns_before_posting_with_a_link_to_buy_credits(alice_web: Client) -> None:
    html = check(alice_web, "synthetic", synthetic_form(budget="298763"))
    warning = block(html, "balance-warning")
    assert plain(warning).startswith("Not enough credits. Posting this task holds 298763 credits in escrow;")
    assert "your available balance is 1000 credits" in plain(warning)
    assert f'href="{reverse("payments-buy")}"' in warning


def test_an_estimate_over_the_balance_warns_even_under_a_small_budget(db: Any) -> None:
    from ledger import services as ledger
    from ledger.units import format_credits
    from tests.conftest import web_client
    from tests.factories import UserFactory

    price = KINDS["synthetic"].estimate_price(KINDS["synthetic"].validate_spec({"n": 2048, "count": 2}))
    dora: Any = UserFactory(username="dora")
    ledger.deposit(dora, 3 * price - 1, reference="test-funds:dora")  # one unit short of 3 replicas
    # The budget typed covers one replica; the three the form asks for need three times that.
    form = synthetic_form(budget=format_credits(price), replication="3")
    warning = plain(block(check(web_client(dora), "synthetic", form), "balance-warning"))
    assert (
        f"Posting this task holds {format_credits(3 * price)} credits in escrow;"
        f" your available balance is {format_credits(3 * price - 1)} credits"
    ) in warning


def test_a_budget_the_balance_covers_shows_no_warning(alice_web: Client) -> None:
    html = check(alice_web, "synthetic", synthetic_form(budget="1.5"))
    assert 'id="balance-warning"' not in html
    assert "Available balance: 1000 credits." in plain(block(html, "estimate-balance", "p"))


# --- The expected run time -----------------------------------------------------------


def test_the_run_time_is_unknown_without_history(alice_web: Client) -> None:
    html = check(alice_web, "synthetic", synthetic_form())
    assert plain(block(html, "estimate-run", "p")) == (
        "Expected run time: unknown (no verified job of this kind to time yet)."
    )


def test_the_run_time_scales_the_kinds_verified_jobs_to_this_tasks_work(
    alice_web: Client, alice: Any, bob: Any
) -> None:
    node = make_worker(bob).worker
    now = timezone.now()
    for minutes, n in ((10, 2048), (30, 4096)):
        task = post_task(alice, spec={"n": n, "count": 1})
        Assignment.objects.create(
            task=task,
            worker=node,
            state=Assignment.State.ACCEPTED,
            seed_block_hash="0" * 64,
            deadline=now,
            created_at=now - timedelta(minutes=minutes),
            settled_at=now,
        )
    # Seconds per TFLOP: 600 s over 2·2048³ and 1800 s over 2·4096³ (8× the work); the median
    # of the two rates, times this task's work (n = 2048, count = 2: twice the first job's).
    small = KINDS["synthetic"].tflop(KINDS["synthetic"].validate_spec({"n": 2048, "count": 1}))
    big = KINDS["synthetic"].tflop(KINDS["synthetic"].validate_spec({"n": 4096, "count": 1}))
    rate = (600 / small + 1800 / big) / 2
    expected = rate * 2 * small
    minutes = round(expected / 60)
    html = check(alice_web, "synthetic", synthetic_form(spec_n="2048", spec_count="2"))
    assert plain(block(html, "estimate-run", "p")).startswith(f"Expected run time: about {minutes} minutes (")


# --- The quality bar -----------------------------------------------------------------


def short(checks: list[Any]) -> list[str]:
    """The words of the bars the verifier found unmet."""
    return [c.words for c in checks if not c.met]


def bar(html: str) -> str:
    return plain(block(html, "quality-bar"))


def test_the_cube_bar_is_the_loss_reduction_the_verifier_demands(alice_web: Client, alice: Any, settings: Any) -> None:
    from workers.verification.cube import _checks, required_loss_reduction

    settings.CUBE_MIN_LOSS_REDUCTION_PCT = 35
    page = alice_web.get(reverse("task-post", args=["cube_training"])).content.decode()
    assert "Held-out loss at least 35% below the untrained model's (the platform's minimum;" in bar(page)
    # The verifier, on a true claim 30 % below the untrained model, asks for the same 35 %.
    spec = KINDS["cube_training"].validate_spec({"min_loss_reduction": 10})
    assert required_loss_reduction(spec) == 35
    (why,) = short(_checks(0.7, 1.0, 2.0, required_loss_reduction(spec)))
    assert "at least 35%" in why
    assert short(_checks(0.6, 1.0, 2.0, required_loss_reduction(spec))) == []

    # A requester's higher bar is the one shown and applied, live as the field changes.
    live = check(alice_web, "cube_training", default_form("cube_training", alice, spec_min_loss_reduction="50"))
    assert "Held-out loss at least 50% below the untrained model's (your min loss reduction)" in bar(live)
    spec = KINDS["cube_training"].validate_spec({"min_loss_reduction": 50})
    assert short(_checks(0.6, 1.0, 2.0, required_loss_reduction(spec)))
    assert short(_checks(0.5, 1.0, 2.0, required_loss_reduction(spec))) == []


def test_the_asl_bar_is_the_accuracy_the_verifier_demands(alice_web: Client, alice: Any) -> None:
    from workers.verification.asl import _checks

    html = check(alice_web, "asl_training", default_form("asl_training", alice, spec_min_accuracy="0.6"))
    assert "Held-out top-1 accuracy at least 60.0% (your min accuracy)" in bar(html)
    assert "once in 100 tries" in bar(html)
    assert short(_checks(0.59, 0.6, signs=2, count=1000))
    assert short(_checks(0.61, 0.6, signs=2, count=1000)) == []


def test_the_synthetic_bar_is_an_exact_match_with_the_verifiers_rounds(alice_web: Client) -> None:
    from training.poc.spec import parse_spec
    from training.poc.verifier import SECURITY_BITS, rounds_for

    html = check(alice_web, "synthetic", synthetic_form(spec_n="16384", spec_count="1", spec_entry_bound="1"))
    rounds = rounds_for(parse_spec(KINDS["synthetic"].validate_spec({"n": 16384, "entry_bound": 1})))
    text = bar(html)
    assert text.startswith("A result is paid only if it meets all of these")
    assert "Exact match: every product equal to A·B, integer for integer." in text
    assert f"({rounds} random vectors): a wrong product passes with probability at most 2^−{SECURITY_BITS}." in text


def test_an_inference_bar_counts_the_rows_the_platform_recomputes(alice_web: Client, alice: Any) -> None:
    source = post_task(alice, kind="cube_training", spec={})
    Task.objects.filter(pk=source.pk).update(status=Task.Status.COMPLETED, finished_at=timezone.now())
    html = check(
        alice_web,
        "cube_inference",
        default_form("cube_inference", alice, spec_source_task=str(source.pk), spec_verify_samples="40"),
    )
    assert "40 rows, chosen with a platform secret, recomputed" in bar(html)


def test_a_spec_that_does_not_validate_shows_no_bar(alice_web: Client) -> None:
    html = check(alice_web, "synthetic", synthetic_form(spec_n="99999"))
    assert bar(html) == "Fix the fields marked in red to see what the verifier will ask."


def test_a_hostile_value_echoed_in_the_summary_is_escaped(alice_web: Client) -> None:
    # Django's choice error repeats the value sent: it must reach the page as text.
    hostile = '"><script>alert(1)</script>'
    response = alice_web.post(
        reverse("task-post", args=["cube_training"]), {"budget": "1", "replication": "1", "spec_mode": hostile}
    )
    assert response.status_code == 400
    html = response.content.decode()
    assert "<script>alert(1)" not in html
    assert "Mode: Select a valid choice. &quot;&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in block(
        html, "error-summary"
    )


def test_another_users_training_task_is_refused_as_a_source_in_the_summary(
    alice_web: Client, alice: Any, bob: Any
) -> None:
    theirs = post_task(bob, kind="cube_training", spec={})
    Task.objects.filter(pk=theirs.pk).update(status=Task.Status.COMPLETED, finished_at=timezone.now())
    response = alice_web.post(
        reverse("task-post", args=["cube_inference"]),
        default_form("cube_inference", alice, spec_source_task=str(theirs.pk), budget="1"),
    )
    assert response.status_code == 400
    assert re.search(
        r'<a href="#id_spec_source_task"[^>]*>Source task: ', block(response.content.decode(), "error-summary")
    )
    assert Task.objects.filter(kind="cube_inference").count() == 0
