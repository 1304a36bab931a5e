"""Every admin action that changes something needs more than the right to view a list:
Django checks an action's permissions only when the action names them."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission
from django.test import RequestFactory

from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def test_staff_who_may_only_view_are_offered_no_action() -> None:
    viewer: Any = UserFactory(username="support", is_staff=True)
    viewer.user_permissions.add(*Permission.objects.filter(codename__startswith="view_"))
    request = RequestFactory().get("/admin/")
    request.user = viewer
    offered = {
        f"{model._meta.label}.{name}": name
        for model, model_admin in admin.site._registry.items()
        for name in model_admin.get_actions(request)
    }
    assert offered == {}


def test_superusers_are_offered_the_service_actions() -> None:
    root: Any = UserFactory(username="root", is_staff=True, is_superuser=True)
    request = RequestFactory().get("/admin/")
    request.user = root
    offered = {
        f"{model._meta.label}.{name}"
        for model, model_admin in admin.site._registry.items()
        for name in model_admin.get_actions(request)
    }
    assert {
        "marketplace.Task.cancel",
        "marketplace.ApiToken.revoke",
        "payments.PayoutRequest.approve",
        "payments.PayoutRequest.reject",
        "workers.Worker.suspend",
        "workers.Worker.resume",
        "workers.Worker.retire",
    } <= offered


def test_no_one_deletes_a_task_in_the_admin(bob: Any) -> None:
    """A task holds escrow and is the source of its inference tasks' models: deleting it
    would strand the money and the tasks built on it. Cancelling refunds it instead."""
    from django.test import Client

    from ledger.units import UNITS_PER_CREDIT
    from marketplace.models import Task
    from tests.factories import post_task

    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    root: Any = UserFactory(username="root", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(root)
    assert client.get(f"/admin/marketplace/task/{task.pk}/delete/").status_code == 403
    assert client.post(f"/admin/marketplace/task/{task.pk}/delete/", {"post": "yes"}).status_code == 403
    changelist = client.post(
        "/admin/marketplace/task/", {"action": "delete_selected", "_selected_action": [str(task.pk)], "post": "yes"}
    )
    assert changelist.status_code in (200, 302)
    assert Task.objects.filter(pk=task.pk).exists()


# --- Actions that change what a user owns ask for a confirmation and a reason ----------

# Actions that change nothing a user owns: Django's delete (refused on every model that
# holds state), the clean-up of expired login failures, and sending an approved payout's
# transfer again (the approval, which asked, already decided it).
ASK_NOTHING = {"delete_selected", "cleanup_expired_attempts", "retry_sending"}


def test_every_action_that_changes_what_a_user_owns_asks_for_a_reason() -> None:
    root: Any = UserFactory(username="root", is_staff=True, is_superuser=True)
    request = RequestFactory().get("/admin/")
    request.user = root
    actions: dict[str, Any] = {
        f"{model._meta.label}.{name}": offered[0] if offered else None
        for model, model_admin in admin.site._registry.items()
        for name, offered in (model_admin.get_actions(request) or {}).items()
        if name not in ASK_NOTHING
    }
    assert "marketplace.Task.cancel" in actions
    unasked = {label for label, func in actions.items() if not getattr(func, "asks_reason", False)}
    assert unasked == set()


@pytest.fixture
def operator() -> Any:
    from django.test import Client

    root: Any = UserFactory(username="root", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(root)
    return client


def cancel_post(task: Any, **extra: str) -> dict[str, Any]:
    return {"action": "cancel", "_selected_action": [str(task.pk)], **extra}


def test_an_operators_cancel_asks_first_then_tells_the_requester_why(operator: Any, bob: Any) -> None:
    from django.contrib.admin.models import LogEntry
    from django.test import Client

    from ledger import services as ledger
    from ledger.units import UNITS_PER_CREDIT
    from marketplace.models import Task
    from tests.factories import post_task

    before = ledger.balance(bob)
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT, title="Bob's matmul")

    asked = operator.post("/admin/marketplace/task/", cancel_post(task))
    assert asked.status_code == 200
    page = asked.content.decode()
    assert "Bob&#x27;s matmul" in page
    assert 'name="reason"' in page
    assert 'maxlength="200"' in page
    assert Task.objects.get(pk=task.pk).status == "open"

    done = operator.post(
        "/admin/marketplace/task/",
        cancel_post(task, confirm="yes", reason="Spam: the same task 400 times."),
        follow=True,
    )
    assert "Cancelled 1 task(s)." in done.content.decode()
    task.refresh_from_db()
    said = "Cancelled by an operator: Spam: the same task 400 times."
    assert (task.status, task.status_reason) == ("cancelled", said)
    assert ledger.balance(bob) == before  # the escrow came back
    entry = LogEntry.objects.get(object_id=str(task.pk))
    assert entry.user.username == "root"
    assert "Spam: the same task 400 times." in entry.get_change_message()

    requester = Client()
    requester.force_login(bob)
    task_page = requester.get(f"/tasks/{task.pk}/").content.decode()
    assert task_page.count(said) == 2  # the status reason and the timeline's line
    assert "Cancelled by the requester" not in task_page
    api = requester.get(f"/api/v1/tasks/{task.pk}/").json()
    assert api["status_reason"] == said
    assert api["events"][-1]["message"] == said


def test_a_requesters_own_cancel_reads_by_you(bob: Any) -> None:
    from django.test import Client

    from ledger.units import UNITS_PER_CREDIT
    from marketplace import services
    from tests.factories import post_task

    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    services.cancel_task(bob, task.pk)
    requester = Client()
    requester.force_login(bob)
    page = requester.get(f"/tasks/{task.pk}/").content.decode()
    assert "Cancelled by you." in page
    assert "operator" not in page


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        ({}, None),  # straight from the action menu: only the question
        ({"confirm": "no", "reason": "Because."}, None),
        ({"confirm": "yes"}, "Give a reason"),
        ({"confirm": "yes", "reason": ""}, "Give a reason"),
        ({"confirm": "yes", "reason": "   \t  "}, "Give a reason"),
        ({"confirm": "yes", "reason": "x" * 201}, "at most 200 characters"),
    ],
    ids=["no-confirmation", "confirm-not-yes", "no-reason", "empty-reason", "blank-reason", "too-long"],
)
def test_a_forged_post_without_confirmation_or_reason_changes_nothing(
    operator: Any, bob: Any, extra: dict[str, str], error: str | None
) -> None:
    from django.contrib.admin.models import LogEntry

    from ledger.units import UNITS_PER_CREDIT
    from marketplace.models import Task
    from tests.factories import post_task

    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    response = operator.post("/admin/marketplace/task/", cancel_post(task, **extra))
    assert response.status_code == (400 if error else 200)
    page = response.content.decode()
    assert 'name="reason"' in page
    if error:
        assert error in page
    assert Task.objects.get(pk=task.pk).status == "open"
    assert not LogEntry.objects.exists()


def test_non_staff_cannot_reach_the_actions(bob: Any, alice: Any) -> None:
    from django.test import Client

    from ledger.units import UNITS_PER_CREDIT
    from marketplace.models import Task
    from tests.factories import post_task

    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    outsider = Client()
    outsider.force_login(alice)
    forged = cancel_post(task, confirm="yes", reason="I do not like it.")
    response = outsider.post("/admin/marketplace/task/", forged)
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")
    assert Task.objects.get(pk=task.pk).status == "open"


def test_the_confirmation_refuses_a_post_without_csrf(bob: Any) -> None:
    from django.test import Client

    from ledger.units import UNITS_PER_CREDIT
    from marketplace.models import Task
    from tests.factories import post_task

    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    root: Any = UserFactory(username="root2", is_staff=True, is_superuser=True)
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(root)
    response = strict.post("/admin/marketplace/task/", cancel_post(task, confirm="yes", reason="Spam."))
    assert response.status_code == 403
    assert Task.objects.get(pk=task.pk).status == "open"


def test_an_operators_token_revocation_tells_the_owner_why(operator: Any, bob: Any) -> None:
    from django.test import Client

    from marketplace import services
    from marketplace.models import ApiToken

    token, _ = services.create_api_token(bob, "ci-script")
    post = {"action": "revoke", "_selected_action": [str(token.pk)]}
    assert operator.post("/admin/marketplace/apitoken/", post).status_code == 200  # asks first
    assert ApiToken.objects.get(pk=token.pk).revoked_at is None

    operator.post("/admin/marketplace/apitoken/", {**post, "confirm": "yes", "reason": "Leaked <in> a public repo."})
    token.refresh_from_db()
    said = "Revoked by an operator: Leaked <in> a public repo."
    assert token.revoked_at is not None
    assert token.revoked_reason == said

    owner = Client()
    owner.force_login(bob)
    page = owner.get("/account/").content.decode()
    assert "Revoked by an operator: Leaked &lt;in&gt; a public repo." in page
    assert "ci-script" in page
    # The owner's own revocation of another token says nothing of an operator.
    own, _ = services.create_api_token(bob, "laptop")
    services.revoke_api_token(bob, own.pk)
    own.refresh_from_db()
    assert own.revoked_reason == ""
    # Revoking again keeps the first revocation's words.
    services.revoke_api_token(bob, token.pk, operator_reason="another reason")
    token.refresh_from_db()
    assert token.revoked_reason == said
