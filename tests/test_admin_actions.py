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
