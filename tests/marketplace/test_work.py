"""The marketplace asks the workers app about a task's work through ``marketplace.work``,
which the workers app answers from its ``AppConfig.ready()``."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

import workers.work
from marketplace import work


def test_the_workers_app_answers_once_django_is_set_up() -> None:
    assert work.work() is workers.work


def test_without_an_answer_the_marketplace_says_which_app_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(work, "_installed", None)
    with pytest.raises(ImproperlyConfigured, match="workers app"):
        work.work()
