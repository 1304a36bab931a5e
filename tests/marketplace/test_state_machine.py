from __future__ import annotations

import itertools

import pytest

from marketplace import services
from marketplace.models import TERMINAL, TRANSITIONS, IllegalTransition, Task, TaskStatus, check_transition
from tests.factories import post_task

ALL = [s.value for s in TaskStatus]


@pytest.mark.parametrize("current", ALL)
@pytest.mark.parametrize("target", ALL)
def test_check_transition_follows_the_table(current: str, target: str) -> None:
    if target in TRANSITIONS[current]:
        check_transition(current, target)
    else:
        with pytest.raises(IllegalTransition, match=f"{current} cannot become {target}"):
            check_transition(current, target)


def test_terminal_states_have_no_way_out() -> None:
    assert all(not TRANSITIONS[s] for s in TERMINAL)


def test_the_happy_path_is_allowed() -> None:
    path = ["draft", "open", "assigned", "running", "verifying", "completed"]
    for current, target in itertools.pairwise(path):
        check_transition(current, target)


@pytest.mark.django_db
def test_illegal_transition_changes_nothing(alice) -> None:
    task = post_task(alice)
    services.cancel_task(alice, task.pk)
    before = Task.objects.get(pk=task.pk)
    events = before.events.count()
    with pytest.raises(IllegalTransition):
        services.cancel_task(alice, task.pk)
    after = Task.objects.get(pk=task.pk)
    assert after.status == TaskStatus.CANCELLED
    assert after.updated_at == before.updated_at
    assert after.events.count() == events


@pytest.mark.django_db
def test_posting_opens_and_records_the_timeline(alice) -> None:
    task = post_task(alice, title="matmul")
    assert task.status == TaskStatus.OPEN
    assert task.opened_at is not None
    assert list(task.events.values_list("status", flat=True)) == ["draft", "open"]


@pytest.mark.django_db
def test_a_draft_stays_a_draft_until_published(alice) -> None:
    task = post_task(alice, draft=True)
    assert task.status == TaskStatus.DRAFT
    task = services.publish_task(alice, task.pk)
    assert task.status == TaskStatus.OPEN
