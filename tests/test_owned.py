"""The owner rule lives in one place: every model a user owns has ``objects.owned_by``."""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.conf import settings
from django.contrib.auth.models import AnonymousUser

from config.owned import OwnedQuerySet
from ledger.models import Account
from marketplace.models import Task
from tests.factories import post_task

PROJECT_APPS = ("marketplace", "ledger", "workers", "payments")


def _owner_fields() -> list[tuple[Any, str]]:
    found: list[tuple[Any, str]] = []
    for model in apps.get_models():
        if model._meta.app_label not in PROJECT_APPS:
            continue
        for field in model._meta.get_fields():
            if (
                field.name in ("owner", "user")
                and field.is_relation
                and field.concrete
                and field.related_model is apps.get_model(settings.AUTH_USER_MODEL)
            ):
                found.append((model, field.name))
    return found


def test_every_owned_model_filters_its_owner_through_owned_by() -> None:
    owned = _owner_fields()
    assert len(owned) >= 8  # tasks, datasets, uploads, tokens, workers, accounts, payments, payouts…
    for model, field in owned:
        queryset = model._default_manager.all()
        assert isinstance(queryset, OwnedQuerySet), f"{model.__name__} has no owned_by"
        assert queryset.owner_field == field, model.__name__


def test_owned_by_gives_a_user_their_rows_and_nobody_anonymous_any(alice: Any, bob: Any) -> None:
    mine = post_task(alice)
    post_task(bob)

    assert list(Task.objects.owned_by(alice)) == [mine]
    assert {account.user_id for account in Account.objects.owned_by(bob)} == {bob.pk}
    assert not Task.objects.owned_by(AnonymousUser()).exists()
    assert not Task.objects.owned_by(None).exists()
