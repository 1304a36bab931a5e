"""Scheduling through workers.assignments.scheduler: who is eligible, why a task waits, replication,
expiry of silent or overdue jobs, and a task that runs out of attempts."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from ledger import services as ledger
from ledger.units import UNITS_PER_CREDIT
from marketplace.kinds import KINDS
from marketplace.models import Task, TaskStatus
from tests.factories import CAPS, TINY_ASL, TINY_CUBE, make_worker, post_task
from training.plugin import REPLAYABLE_TRAINING
from workers.agent import capabilities
from workers.assignments import jobs, scheduler, supply
from workers.identity import services
from workers.models import Assignment, Worker

pytestmark = pytest.mark.django_db


def give_up_note(task: Task) -> str:
    """The end of a waiting task's reason: when it fails with its refund if no worker takes it."""
    from django.conf import settings

    task.refresh_from_db()
    assert task.opened_at is not None
    at = task.opened_at + timedelta(seconds=settings.TASK_MAX_WAIT)
    return f" If no worker takes it by {at:%Y-%m-%d %H:%M} UTC, it fails with a full refund."


def test_only_online_active_capable_reputable_workers_are_chosen(alice: Any, bob: Any) -> None:
    good, _, _ = make_worker(alice, name="good", reputation=70)
    make_worker(alice, name="offline", reputation=90, online=False)
    suspended, _, _ = make_worker(alice, name="suspended", reputation=90)
    services.set_worker_state(alice, suspended.pk, "suspended")
    make_worker(alice, name="no-kind", reputation=90, caps={**CAPS, "kinds": ["cube_training"]})
    make_worker(alice, name="small", reputation=90, caps={**CAPS, "ram_bytes": 1024, "gpu_memory_bytes": 0})
    make_worker(alice, name="disreputable", reputation=59)
    stale, _, _ = make_worker(alice, name="stale", reputation=90)
    Worker.objects.filter(pk=stale.pk).update(last_heartbeat_at=timezone.now() - timedelta(hours=1))

    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT, min_reputation=60)
    assert [w.name for w in scheduler.eligible_workers(task, exclude=set())] == ["good"]

    (assignment,) = scheduler.schedule(task.pk)
    assert assignment.worker == good
    assert assignment.state == Assignment.State.OFFERED
    assert assignment.attempt == 1
    assert assignment.seed_block_hash == scheduler.latest_block_hash()
    assert assignment.deadline > timezone.now()
    task.refresh_from_db()
    assert task.status == TaskStatus.ASSIGNED
    # A busy worker takes no second job: its next SUBMIT_RESULT nonce must stay predictable.
    other = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT, min_reputation=60)
    assert scheduler.schedule(other.pk) == []
    assert Task.objects.get(pk=other.pk).status_reason == (
        "Waiting for a worker: of the 4 online, 1 does not offer Synthetic proof of compute;"
        " 1 has less than 1 MiB of memory; 1 has reputation below 60; 1 fits but is busy with another job."
        " It needs a worker that offers Synthetic proof of compute (agent supporting poc:aes256ctr)"
        " with 1 MiB of memory and reputation ≥ 60."
    ) + give_up_note(other)


def test_with_no_eligible_worker_the_task_waits_and_says_why(alice: Any, bob: Any) -> None:
    make_worker(alice, name="disreputable", reputation=10)
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT, min_reputation=40)
    assert scheduler.schedule(task.pk) == []
    task.refresh_from_db()
    assert task.status == TaskStatus.OPEN
    assert task.status_reason.startswith("Waiting for a worker: of the 1 online, 1 has reputation below 40. ")
    assert task.status_reason.endswith(" with 1 MiB of memory and reputation ≥ 40." + give_up_note(task))
    assert not Assignment.objects.filter(task=task).exists()


def test_a_waiting_task_says_which_requirement_each_online_worker_misses(alice: Any, bob: Any) -> None:
    """Each online worker counts once, under the first requirement it fails (kind, agent
    features, memory, reputation, then: holds the task or had its result rejected, busy);
    offline ones not at all."""
    make_worker(alice, name="cube-only", caps={**CAPS, "kinds": ["cube_training"]})
    make_worker(alice, name="cube-only-2", caps={**CAPS, "kinds": ["cube_training"]})
    make_worker(alice, name="old-agent", caps={**CAPS, "features": ["poc:shake128"]})
    make_worker(alice, name="small", caps={**CAPS, "ram_bytes": 1024, "gpu_memory_bytes": 0})
    make_worker(alice, name="new", reputation=10)
    make_worker(alice, name="asleep", online=False)
    task = post_task(bob, "synthetic", {"n": 4096}, budget=100 * UNITS_PER_CREDIT, min_reputation=20)
    assert scheduler.schedule(task.pk) == []
    task.refresh_from_db()
    assert task.status_reason == (
        "Waiting for a worker: of the 5 online, 2 do not offer Synthetic proof of compute;"
        " 1 runs an agent without poc:aes256ctr; 1 has less than 240 MiB of memory;"
        " 1 has reputation below 20."
        " It needs a worker that offers Synthetic proof of compute (agent supporting poc:aes256ctr)"
        " with 240 MiB of memory and reputation ≥ 20."
    ) + give_up_note(task)
    # A worker that fits takes it; while it holds it, the task says so.
    good, _, _ = make_worker(alice, name="good")
    (assignment,) = scheduler.schedule(task.pk)
    assert assignment.worker == good
    second = post_task(bob, "synthetic", {"n": 4096}, budget=100 * UNITS_PER_CREDIT, min_reputation=20, replication=2)
    Assignment.objects.filter(pk=assignment.pk).update(task=second)
    assert scheduler.schedule(second.pk) == []
    second.refresh_from_db()
    assert "; 1 has this task already, had its result for it rejected, or lost it twice." in second.status_reason
    Assignment.objects.filter(pk=assignment.pk).update(task=task, state=Assignment.State.REJECTED)
    assert scheduler.schedule(task.pk) == []
    task.refresh_from_db()
    assert "; 1 has this task already, had its result for it rejected, or lost it twice." in task.status_reason
    Worker.objects.update(last_heartbeat_at=None)
    assert scheduler.schedule(task.pk) == []
    task.refresh_from_db()
    assert task.status_reason.startswith("Waiting for a worker: no worker is online. It needs a worker that offers")


def test_a_synthetic_task_goes_only_to_agents_that_draw_its_matrices_its_way(alice: Any, bob: Any) -> None:
    # An agent from before the generator field (features: SHAKE128 only) would compute an
    # AES task's product from other matrices, and be rejected for it: it is not offered one.
    old, _, _ = make_worker(alice, name="old-agent", reputation=90, caps={**CAPS, "features": ["poc:shake128"]})
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    assert scheduler.schedule(task.pk) == []
    task.refresh_from_db()
    assert "agent supporting poc:aes256ctr" in task.status_reason
    # It still runs the tasks stored with SHAKE128 (marketplace migration 0003).
    legacy = post_task(bob, "synthetic", {"n": 64, "generator": "shake128"}, budget=UNITS_PER_CREDIT)
    (assignment,) = scheduler.schedule(legacy.pk)
    assert assignment.worker == old
    # A current agent takes the AES task.
    new, _, _ = make_worker(alice, name="new-agent", reputation=50)
    (assignment,) = scheduler.schedule(task.pk)
    assert assignment.worker == new


@pytest.mark.parametrize("kind", ["cube_training", "asl_training"])
def test_a_training_task_goes_only_to_agents_whose_trainer_the_platform_replays(
    alice: Any, bob: Any, kind: str
) -> None:
    # An agent that draws its initial weights or dropout masks as an earlier one did would
    # commit checkpoints the platform's replay cannot reach: its honest work would be
    # rejected and cost it reputation, so it is not offered the task.
    behind = [f for f in CAPS["features"] if f != REPLAYABLE_TRAINING]
    caps = {**CAPS, "kinds": [kind], "ram_bytes": 64 * 2**30}
    old, _, _ = make_worker(alice, name="old-trainer", reputation=90, caps={**caps, "features": behind})
    spec = {**TINY_CUBE, "synthetic_samples": 96} if kind == "cube_training" else TINY_ASL
    need = supply.Need.of(kind, KINDS[kind].validate_spec(spec), 0)
    assert REPLAYABLE_TRAINING in need.features
    # Neither given the task nor drawn to re-execute another provider's segments
    # (delegation.eligible_verifiers asks the same misfit).
    assert supply.misfit(old, need) == supply.FEATURES
    current, _, _ = make_worker(alice, name="current", reputation=50, caps=caps)
    assert supply.misfit(current, need) is None
    assert REPLAYABLE_TRAINING in capabilities.FEATURES  # what a current agent reports


def test_replication_gives_the_job_to_workers_of_different_providers(alice: Any, bob: Any, carol: Any) -> None:
    for i in range(3):
        make_worker(alice, name=f"a{i}")
    make_worker(carol, name="c0")
    task = post_task(bob, "synthetic", {"n": 64}, budget=3 * UNITS_PER_CREDIT, replication=2)
    created = scheduler.schedule(task.pk)
    assert len(created) == 2
    assert {a.worker.owner for a in created} == {alice, carol}
    assert scheduler.schedule(task.pk) == []  # running twice is harmless
    assert Assignment.objects.filter(task=task).count() == 2


def test_one_providers_nodes_do_not_take_two_replicas_of_a_task(alice: Any, bob: Any, carol: Any) -> None:
    # A trained model depends only on the spec and the data: one provider could compute it
    # once and submit it from each of its nodes. Replicas go to different providers.
    first, _, _ = make_worker(alice, name="a0", reputation=90)
    make_worker(alice, name="a1")
    task = post_task(bob, "synthetic", {"n": 64}, budget=3 * UNITS_PER_CREDIT, replication=2)
    (offered,) = scheduler.schedule(task.pk)
    assert offered.worker == first
    task.refresh_from_db()
    assert task.status_reason.startswith("1/2 replicas in hand. Waiting for a worker: of the 1 other online, ")
    assert "1 belongs to a provider already computing a replica of it" in task.status_reason
    # The replica in alice's hands expires: her other node may take the slot.
    Assignment.objects.filter(pk=offered.pk).update(state=Assignment.State.EXPIRED)
    (again,) = scheduler.schedule(task.pk)
    assert again.worker.owner == alice
    assert again.worker != first
    # Another provider's node takes the second replica.
    other, _, _ = make_worker(carol, name="c0")
    (second,) = scheduler.schedule(task.pk)
    assert second.worker == other


def test_a_silent_worker_has_its_job_expired_and_given_to_another(alice: Any, bob: Any) -> None:
    first, _, _ = make_worker(alice, name="first", reputation=80)
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    (assignment,) = scheduler.schedule(task.pk)
    jobs.start(first, assignment.pk)
    second, _, _ = make_worker(alice, name="second", reputation=60)
    assert scheduler.expire_overdue() == 0  # everyone is still talking

    Worker.objects.filter(pk=first.pk).update(last_heartbeat_at=timezone.now() - timedelta(minutes=10))
    assert scheduler.expire_overdue() == 1
    assert scheduler.expire_overdue() == 0
    assignment.refresh_from_db()
    assert assignment.state == Assignment.State.EXPIRED
    assert assignment.reason
    first.refresh_from_db()
    assert first.reputation == 80 - scheduler.EXPIRE_PENALTY
    task.refresh_from_db()
    assert task.status == TaskStatus.OPEN

    (again,) = scheduler.schedule(task.pk)
    assert again.worker == second
    assert again.attempt == 2


def test_an_overdue_job_expires_even_if_the_worker_is_online(alice: Any, bob: Any) -> None:
    _worker, _, _ = make_worker(alice)
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    (assignment,) = scheduler.schedule(task.pk)
    Assignment.objects.filter(pk=assignment.pk).update(deadline=timezone.now() - timedelta(seconds=1))
    assert scheduler.expire_overdue() == 1
    assert Assignment.objects.get(pk=assignment.pk).state == Assignment.State.EXPIRED


def test_when_attempts_run_out_the_task_fails_and_the_escrow_is_refunded(alice: Any, bob: Any) -> None:
    before = ledger.balance(bob)
    worker, _, _ = make_worker(alice)
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT, max_attempts=1)
    assert ledger.escrowed(bob) == UNITS_PER_CREDIT
    assert ledger.balance(bob) == before - UNITS_PER_CREDIT
    (assignment,) = scheduler.schedule(task.pk)
    jobs.fail(worker, assignment.pk, "CUDA out of memory")
    make_worker(alice, name="spare")  # available, but the task has no attempt left

    assert scheduler.schedule(task.pk) == []
    task = Task.objects.get(pk=task.pk)
    assert task.status == TaskStatus.FAILED
    assert "attempt" in task.status_reason or task.events.filter(message__icontains="attempt").exists()
    assert ledger.escrowed(bob) == 0
    assert ledger.balance(bob) == before
    assert Assignment.objects.filter(task=task).count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(
    __import__("django.db").db.connection.vendor != "postgresql",
    reason="row locks need PostgreSQL (set DATABASE_URL); SQLite serialises every writer",
)
def test_tasks_scheduled_at_once_never_give_one_worker_two_jobs(
    alice: Any, bob: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each task is scheduled under its own task lock; the worker's row lock keeps two of
    them from both offering the one idle worker a job (it would get one nonce twice).
    Both schedulers are held right after choosing their candidates, so they race."""
    import threading

    from django.db import connections

    worker, _, _ = make_worker(alice, name="only")
    tasks = [post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT) for _ in range(2)]
    both_chose = threading.Barrier(len(tasks))
    choose = scheduler.priced_workers

    def choose_then_wait(task: Task, *args: Any, **kwargs: Any) -> tuple[list[Worker], dict[Any, int]]:
        chosen = choose(task, *args, **kwargs)
        both_chose.wait(timeout=30)
        return chosen

    monkeypatch.setattr(scheduler, "priced_workers", choose_then_wait)
    errors: list[BaseException] = []

    def run(task_id: Any) -> None:
        try:
            scheduler.schedule(task_id)
        except BaseException as exc:  # collected and asserted on below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(t.pk,)) for t in tasks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert Assignment.objects.filter(worker=worker).count() == 1
    assert Task.objects.filter(pk__in=[t.pk for t in tasks], status=TaskStatus.ASSIGNED).count() == 1


def test_the_longest_waiting_reason_fits_the_task_row() -> None:
    """Every requirement missed by thousands of workers, after a result short of the bar
    (a longer prefix than replicas in hand), with the give-up time: still stored whole."""
    from collections import Counter

    from workers.assignments import supply

    longest_kind = max(KINDS.values(), key=lambda kind: len(kind.label))
    need = supply.Need(longest_kind, 1000 * 2**40, frozenset({"poc:aes256ctr", "poc:shake128"}), 100)
    survey = supply.Survey(need, short=Counter({reason: 123_456 for reason in supply.REASONS}), taken=1)
    note = " If no worker takes it by 2026-11-28 10:40 UTC, it fails with a full refund."
    # The verifier's reason quoted in the note is a job's stored reason: at most its column.
    longest = Assignment._meta.get_field("reason").max_length
    assert longest is not None
    why = "w" * longest
    prefix = scheduler._SHORTFALL_NOTE.format(minutes=99999, why=why)
    assert len(prefix) > len("4/5 replicas in hand. ")
    reason = prefix + survey.reason() + note
    assert "123456 fit but are busy with another job" in reason
    room = Task._meta.get_field("status_reason").max_length
    assert room is not None
    assert len(reason) <= room


def test_a_scheduling_pass_reads_the_online_workers_once_for_every_waiting_task(alice: Any, bob: Any) -> None:
    """The periodic pass explains why each of its waiting tasks waits from one read of the
    online workers, not one per task (a large pool times 200 tasks would be slow)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from workers import tasks

    make_worker(alice, name="new", reputation=10)
    waiting = [post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT, min_reputation=30) for _ in range(3)]
    Task.objects.update(status_reason="")
    with CaptureQueriesContext(connection) as queries:
        assert tasks.schedule_waiting() == 0
    surveys = [q for q in queries.captured_queries if 'AS "busy"' in q["sql"]]
    assert len(surveys) == 1
    for task in waiting:
        task.refresh_from_db()
        assert task.status_reason.startswith("Waiting for a worker: of the 1 online, 1 has reputation below 30.")


def test_a_worker_given_the_job_is_left_out_of_the_reason_even_if_the_pass_read_missed_it(alice: Any, bob: Any) -> None:
    """A pass reads the online workers once; one that came online after that read and took
    a replica is neither counted as online nor as busy in the reason for the rest."""
    from workers.assignments import supply

    make_worker(alice, name="cube-only", caps={**CAPS, "kinds": ["cube_training"]})
    task = post_task(bob, "synthetic", {"n": 64}, budget=2 * UNITS_PER_CREDIT, replication=2)
    with supply.one_pass():
        supply.online_workers()  # the pass's one read: only cube-only is online yet
        newcomer, _, _ = make_worker(alice, name="newcomer")
        (assignment,) = scheduler.schedule(task.pk)
    assert assignment.worker == newcomer
    task.refresh_from_db()
    assert task.status_reason == (
        "1/2 replicas in hand. Waiting for a worker: of the 1 other online, 1 does not offer"
        " Synthetic proof of compute. It needs a worker that offers Synthetic proof of compute"
        " (agent supporting poc:aes256ctr) with 1 MiB of memory."
    )


def test_demand_lines_read_right_for_one_and_for_many() -> None:
    from collections import Counter

    from workers.assignments import supply

    one = supply.Demand(waiting=1, short=Counter({supply.KIND: 1}), kinds={"Cube training"})
    assert one.lines() == ["1 is of a kind it does not offer (Cube training)."]
    many = supply.Demand(
        waiting=9,
        short=Counter({supply.KIND: 3, supply.MEMORY: 2, supply.TOOK_PART: 4}),
        kinds={"Cube training", "ASL recognition training"},
        memory_bytes=8 * 2**30,
    )
    assert many.lines() == [
        "3 are of kinds it does not offer (ASL recognition training, Cube training).",
        "2 need more memory than its 8.0 GiB.",
        "It already has 4 of them, had its result for them rejected, or lost them twice.",
    ]
