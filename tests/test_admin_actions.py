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
