"""No stranded task, no locked escrow: a job lost with its node may go back to that node,
and a task no worker takes within PROOFWORK_TASK_MAX_WAIT fails with a full refund.

Time passes by moving the task's clock back (its ``opened_at`` and its jobs' ``settled_at``),
as many hours as the test needs; the periodic pass (``workers.tasks.schedule_waiting``,
what beat runs) is called directly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from django.db.models import F
from django.utils import timezone

from ledger import services as ledger
from ledger.models import Account
from ledger.sealer import seal_all
from ledger.units import UNITS_PER_CREDIT
from marketplace.kinds import KINDS
from marketplace.models import Task, TaskStatus
from tests.factories import CAPS, make_worker, post_task
from workers.assignments import jobs, scheduler, settlement
from workers.models import Assignment, Worker
from workers.tasks import schedule_waiting

pytestmark = pytest.mark.django_db

HOUR = 3600


@pytest.fixture(autouse=True)
def one_hour_wait(settings: Any) -> None:
    settings.TASK_MAX_WAIT = HOUR


def age(task: Task, seconds: float) -> None:
    """Move the task's waiting clock ``seconds`` into the past."""
    past = timedelta(seconds=seconds)
    Task.objects.filter(pk=task.pk).update(opened_at=timezone.now() - past)
    Assignment.objects.filter(task=task, settled_at__isnull=False).update(settled_at=F("settled_at") - past)


def silence(worker: Worker) -> None:
    Worker.objects.filter(pk=worker.pk).update(last_heartbeat_at=timezone.now() - timedelta(hours=2))


def wake(worker: Worker) -> None:
    Worker.objects.filter(pk=worker.pk).update(last_heartbeat_at=timezone.now())


def submit_for_verdict(assignment: Assignment) -> None:
    """A result in hand (how it got there: test_flow_e2e and test_results)."""
    Assignment.objects.filter(pk=assignment.pk).update(state=Assignment.State.SUBMITTED, submitted_at=timezone.now())


# --- A job lost with its node may go back to it ----------------------------------------


def test_the_only_node_gets_its_task_back_after_going_silent(alice: Any, bob: Any) -> None:
    """kill -9 of the only fitting node: its job expires at the heartbeat timeout; once the
    node heartbeats again, the task is offered to it again, as its next attempt."""
    node, _, _ = make_worker(alice, name="only")
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    (first,) = scheduler.schedule(task.pk)
    jobs.start(node, first.pk)
    silence(node)
    schedule_waiting()
    first.refresh_from_db()
    assert first.state == Assignment.State.EXPIRED
    task.refresh_from_db()
    assert task.status == TaskStatus.OPEN
    assert task.status_reason.startswith("Waiting for a worker: no worker is online.")
    assert "it fails with a full refund." in task.status_reason

    wake(node)
    schedule_waiting()
    again = Assignment.objects.get(task=task, state=Assignment.State.OFFERED)
    assert again.worker == node
    assert again.attempt == 2
    assert Task.objects.get(pk=task.pk).status == TaskStatus.ASSIGNED


def test_a_restarted_node_that_abandons_its_job_is_offered_it_again(alice: Any, bob: Any) -> None:
    node, _, _ = make_worker(alice, name="only")
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    (first,) = scheduler.schedule(task.pk)
    jobs.start(node, first.pk)
    (abandoned,) = jobs.abandon_running(node)  # what the restarted agent asks first
    assert abandoned.state == Assignment.State.EXPIRED
    (again,) = scheduler.schedule(task.pk)
    assert again.worker == node
    assert again.attempt == 2


def test_other_providers_nodes_come_first_then_the_providers_other_nodes_then_the_node_itself(
    alice: Any, bob: Any, carol: Any
) -> None:
    lost, _, _ = make_worker(alice, name="lost", reputation=90)
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    (first,) = scheduler.schedule(task.pk)
    jobs.fail(lost, first.pk, "CUDA out of memory")
    sibling, _, _ = make_worker(alice, name="sibling", reputation=80)
    stranger, _, _ = make_worker(carol, name="stranger", reputation=10)  # lowest reputation, still first
    assert [w.name for w in scheduler.eligible_workers(task, set())] == ["lost", "sibling", "stranger"]

    (second,) = scheduler.schedule(task.pk)
    assert second.worker == stranger
    jobs.fail(stranger, second.pk, "disk full")
    # Both providers have lost it now: a node that never had it comes before either.
    (third,) = scheduler.schedule(task.pk)
    assert third.worker == sibling


def test_a_node_whose_result_was_rejected_is_not_offered_the_task_again(alice: Any, bob: Any) -> None:
    make_worker(alice, name="cheat")
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    (first,) = scheduler.schedule(task.pk)
    submit_for_verdict(first)
    settlement.reject(first.pk, "Freivalds' check failed")
    assert scheduler.schedule(task.pk) == []
    task.refresh_from_db()
    assert task.status_reason.startswith(
        "Waiting for a worker: of the 1 online, 1 has this task already, had its result for it rejected, or lost it twice."
    )


def test_a_provider_short_of_the_bar_is_not_offered_the_task_again(alice: Any, bob: Any) -> None:
    make_worker(alice, name="short")
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    (first,) = scheduler.schedule(task.pk)
    submit_for_verdict(first)
    settlement.reject(first.pk, "loss fell 3 %, below the 20 % bar", penalise=False)
    make_worker(alice, name="sibling")
    assert scheduler.schedule(task.pk) == []
    task.refresh_from_db()
    assert "1 belongs to a provider already computing a replica of it" in task.status_reason


def test_one_provider_never_holds_two_live_replicas_when_a_lost_replica_comes_back(
    alice: Any, bob: Any, carol: Any
) -> None:
    make_worker(alice, name="a0", reputation=90)
    a1, _, _ = make_worker(alice, name="a1", reputation=80)
    c0, _, _ = make_worker(carol, name="c0", reputation=70)
    task = post_task(bob, "synthetic", {"n": 64}, budget=3 * UNITS_PER_CREDIT, replication=2)
    created = scheduler.schedule(task.pk)
    assert {a.worker.name for a in created} == {"a0", "c0"}
    lost = next(a for a in created if a.worker == c0)
    jobs.fail(c0, lost.pk, "out of memory")
    # Only alice's nodes and c0 are left: alice holds a live replica, so c0 takes it back.
    (back,) = scheduler.schedule(task.pk)
    assert back.worker == c0
    live = Assignment.objects.filter(task=task, state__in=[Assignment.State.OFFERED, Assignment.State.RUNNING])
    owners = list(live.values_list("worker__owner_id", flat=True))
    assert sorted(owners) == sorted({alice.pk, carol.pk})
    assert a1.pk not in set(live.values_list("worker_id", flat=True))


def test_coming_back_to_the_same_node_still_uses_up_its_attempts(alice: Any, bob: Any) -> None:
    before = ledger.balance(bob)
    node, _, _ = make_worker(alice, name="crashes")
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT, max_attempts=2)
    for attempt in (1, 2):
        (job,) = scheduler.schedule(task.pk)
        assert (job.worker, job.attempt) == (node, attempt)
        jobs.start(node, job.pk)
        jobs.abandon_running(node)
    assert scheduler.schedule(task.pk) == []
    task.refresh_from_db()
    assert task.status == TaskStatus.FAILED
    assert task.status_reason == (
        "Failed: all 2 of its attempts were used up (each rejected or expired). Fully refunded."
    )
    assert ledger.escrowed(bob) == 0
    assert ledger.balance(bob) == before


def test_one_node_giving_a_task_up_on_purpose_cannot_use_up_all_its_attempts(alice: Any, bob: Any, carol: Any) -> None:
    """A dishonest (or broken) provider's node, the only free one for a moment, reports
    every job of a task as failed: /fail/ is a reason the node writes, so it cannot be told
    from a crash. The task must still be there for the next provider's node, not failed in
    three scheduler passes by one node."""
    saboteur, _, _ = make_worker(alice, name="saboteur")
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT, max_attempts=3)
    for _ in range(3):
        jobs_now = scheduler.schedule(task.pk)
        if not jobs_now:
            break
        (job,) = jobs_now
        assert job.worker == saboteur
        jobs.fail(saboteur, job.pk, "abandoned: the node is shutting down")
    scheduler.schedule(task.pk)  # the next periodic pass, before another provider's node is free
    task.refresh_from_db()
    assert task.status != TaskStatus.FAILED, task.status_reason
    honest, _, _ = make_worker(carol, name="honest")
    (job,) = scheduler.schedule(task.pk)
    assert job.worker == honest


# --- Every way a task waits ends: a node, or a refund --------------------------------


def no_node_online(alice: Any, carol: Any) -> None:
    make_worker(alice, name="asleep", online=False)


def kind_misfit(alice: Any, carol: Any) -> None:
    make_worker(alice, name="cube-only", caps={**CAPS, "kinds": ["cube_training"]})


def feature_misfit(alice: Any, carol: Any) -> None:
    make_worker(alice, name="old-agent", caps={**CAPS, "features": ["poc:shake128"]})


def memory_misfit(alice: Any, carol: Any) -> None:
    make_worker(alice, name="small", caps={**CAPS, "ram_bytes": 1024, "gpu_memory_bytes": 0})


def reputation_misfit(alice: Any, carol: Any) -> None:
    make_worker(alice, name="new", reputation=5)


def every_fitting_node_busy(alice: Any, carol: Any) -> None:
    node, _, _ = make_worker(alice, name="busy")
    other = post_task(carol, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    (job,) = scheduler.schedule(other.pk)
    jobs.start(node, job.pk)


WAITS: dict[str, Callable[[Any, Any], None]] = {
    "no node online": no_node_online,
    "kind misfit": kind_misfit,
    "feature misfit": feature_misfit,
    "memory misfit": memory_misfit,
    "reputation misfit": reputation_misfit,
    "every fitting node busy": every_fitting_node_busy,
}


def assert_failed_and_refunded(task: Task, owner: Any, before: int, says: str) -> None:
    """The task failed saying why; its escrow is empty and its owner has all of it back,
    pending and once sealed."""
    task.refresh_from_db()
    assert task.status == TaskStatus.FAILED, task.status_reason
    assert says in task.status_reason
    assert task.events.filter(status=TaskStatus.FAILED).exists()
    assert ledger.escrowed(owner) == 0
    assert ledger.balance(owner) == before
    escrow = ledger.escrow_account(task.pk)
    assert escrow is not None
    seal_all()
    escrow.refresh_from_db()
    assert (escrow.available, escrow.balance) == (0, 0)
    sealed = Account.objects.get(user=owner, kind="user")
    assert sealed.balance == before


@pytest.mark.parametrize("wait", WAITS.values(), ids=list(WAITS))
def test_a_task_no_node_can_take_fails_with_a_full_refund_once_it_waited_too_long(
    alice: Any, bob: Any, carol: Any, wait: Callable[[Any, Any], None]
) -> None:
    before = ledger.balance(bob)
    wait(alice, carol)
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT, min_reputation=10)
    schedule_waiting()
    task.refresh_from_db()
    assert task.status == TaskStatus.OPEN
    waiting = task.status_reason
    assert waiting.startswith("Waiting for a worker: ")
    assert waiting.endswith(" it fails with a full refund.")

    age(task, HOUR - 60)
    schedule_waiting()
    assert Task.objects.get(pk=task.pk).status == TaskStatus.OPEN  # not yet
    age(task, HOUR + 1)
    schedule_waiting()
    # The reason says how long it waited and what the online nodes lacked at the end.
    why = waiting.removeprefix("Waiting for a worker: ").split(" If no worker")[0]
    assert_failed_and_refunded(
        task, bob, before, "Failed: no worker took it within 1 hour. Fully refunded. At the end, "
    )
    assert why in Task.objects.get(pk=task.pk).status_reason


def test_a_task_whose_only_node_had_its_result_rejected_gives_up(alice: Any, bob: Any) -> None:
    before = ledger.balance(bob)
    make_worker(alice, name="cheat")
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    (first,) = scheduler.schedule(task.pk)
    submit_for_verdict(first)
    settlement.reject(first.pk, "Freivalds' check failed")
    schedule_waiting()
    assert Task.objects.get(pk=task.pk).status == TaskStatus.OPEN
    # The clock runs from when its last job ended, not from when it opened.
    Task.objects.filter(pk=task.pk).update(opened_at=timezone.now() - timedelta(days=3))
    schedule_waiting()
    assert Task.objects.get(pk=task.pk).status == TaskStatus.OPEN
    age(task, HOUR + 1)
    schedule_waiting()
    assert_failed_and_refunded(task, bob, before, "had its result for it rejected, or lost it twice")


def test_a_task_whose_only_nodes_lost_it_gets_a_node_back(alice: Any, bob: Any) -> None:
    """Not a wait any longer: the node that lost the task takes it again."""
    node, _, _ = make_worker(alice, name="only")
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    (first,) = scheduler.schedule(task.pk)
    jobs.fail(node, first.pk, "the node restarted and lost the job")
    age(task, HOUR + 1)
    schedule_waiting()
    assert Assignment.objects.get(task=task, state=Assignment.State.OFFERED).worker == node


def test_a_task_short_of_its_bar_fails_after_the_shortfall_wait(alice: Any, bob: Any, settings: Any) -> None:
    before = ledger.balance(bob)
    settings.SHORTFALL_WAIT = 600
    make_worker(alice, name="short")
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    (first,) = scheduler.schedule(task.pk)
    submit_for_verdict(first)
    settlement.reject(first.pk, "loss fell 3 %, below the 20 % bar", penalise=False)
    schedule_waiting()
    task.refresh_from_db()
    assert task.status == TaskStatus.OPEN
    assert "if no other provider takes it within 10 minutes, it fails with a full refund." in task.status_reason
    assert "If no worker takes it by" not in task.status_reason  # the sooner end only
    age(task, 601)
    schedule_waiting()
    assert_failed_and_refunded(task, bob, before, "no other provider took the task within 10 minutes")


def test_a_kind_no_provider_runs_gives_up_too(alice: Any, bob: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    before = ledger.balance(bob)
    make_worker(alice, name="node")
    monkeypatch.setitem(KINDS, "synthetic", replace(KINDS["synthetic"], verifier=None))
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    assert "No provider runs Synthetic proof of compute tasks yet; if none does by " in task.status_reason
    schedule_waiting()
    assert Task.objects.get(pk=task.pk).status == TaskStatus.OPEN
    age(task, HOUR + 1)
    schedule_waiting()
    assert_failed_and_refunded(task, bob, before, "No provider runs Synthetic proof of compute tasks.")


def broken_prepare(spec: Any, source: Any, out: Any, secret_seed: bytes) -> Any:
    """A held-out preparation that crashes on the platform's side (a full disk, say)."""
    raise OSError(28, "No space left on device")


def test_a_task_whose_held_out_split_cannot_be_prepared_gives_up(
    alice: Any, bob: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Preparation that fails on bad data fails the task at once (test_cube_kinds); one that
    keeps crashing leaves the task waiting, until it waited too long."""
    before = ledger.balance(bob)
    make_worker(alice, name="node")
    broken = replace(KINDS["synthetic"], prepare=broken_prepare)
    monkeypatch.setitem(KINDS, "synthetic", broken)
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    schedule_waiting()  # the crash is logged; the pass goes on
    assert Task.objects.get(pk=task.pk).status == TaskStatus.OPEN
    age(task, HOUR + 1)
    schedule_waiting()
    assert_failed_and_refunded(task, bob, before, "Failed: no worker took it within 1 hour.")


def test_a_replica_short_waits_while_another_runs_then_gives_up(alice: Any, bob: Any) -> None:
    """With one provider online, a task of two replicas runs one; it does not give up while
    that one is live (its deadline bounds it), only once none is."""
    before = ledger.balance(bob)
    node, _, _ = make_worker(alice, name="only")
    task = post_task(bob, "synthetic", {"n": 64}, budget=2 * UNITS_PER_CREDIT, replication=2)
    (job,) = scheduler.schedule(task.pk)
    jobs.start(node, job.pk)
    age(task, 5 * HOUR)
    schedule_waiting()
    task.refresh_from_db()
    assert task.status == TaskStatus.RUNNING
    assert task.status_reason.startswith("1/2 replicas in hand. Waiting for a worker: ")
    assert "fails with a full refund" not in task.status_reason

    Assignment.objects.filter(pk=job.pk).update(deadline=timezone.now() - timedelta(seconds=1))
    silence(node)  # and the node is gone
    schedule_waiting()
    assert Task.objects.get(pk=task.pk).status == TaskStatus.OPEN
    age(task, HOUR + 1)
    schedule_waiting()
    assert_failed_and_refunded(task, bob, before, "Failed: no worker took it within 1 hour.")


def test_a_result_awaiting_its_verdict_is_never_given_up(alice: Any, bob: Any) -> None:
    make_worker(alice, name="only")
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    (job,) = scheduler.schedule(task.pk)
    submit_for_verdict(job)
    age(task, 10 * HOUR)
    assert scheduler.give_up_waiting() == 0
    assert Task.objects.get(pk=task.pk).status in (TaskStatus.ASSIGNED, TaskStatus.VERIFYING)
    assert ledger.escrowed(bob) == UNITS_PER_CREDIT
