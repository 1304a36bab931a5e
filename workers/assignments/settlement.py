"""Settlement: what happens to money, reputation and the task once a result is judged.

Accepted → the reward leaves escrow for the worker (minus the platform fee), the
worker's signed SUBMIT_RESULT enters the mempool, reputation rises; when every replica
is accepted the task completes and the rest of the escrow goes back to the requester.
Rejected → REJECT_RESULT on the chain, reputation falls, the job is reassigned until the
task's attempts run out, then the task fails with a full refund. A true claim that only
missed the task's quality bar costs nothing at once (the spec may make the bar
unreachable) but ``SHORT_PENALTY`` once another worker's result on the task meets it.
All of it in one database transaction per verdict, idempotent per assignment.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any
from uuid import UUID

from django.db import transaction
from django.db.models import F
from django.db.models.functions import Coalesce, Greatest, Least
from django.utils import timezone

from ledger import services as ledger
from marketplace import pricing
from marketplace.lifecycle import complete_locked, lock_task
from marketplace.models import ACTIVE, Task
from workers.assignments import lifecycle
from workers.assignments.jobs import reward_per_replica, signed_tx_from_json
from workers.live.dashboard import worker_changed
from workers.models import Assignment, Shortfall, Worker

log = logging.getLogger(__name__)

REPUTATION_UP = 2
REPUTATION_DOWN = 10
# A result short of a quality bar that another worker then met on the same task: the bar
# was reachable, so the short result was poor work (or a node burning the task's attempts
# at no cost), though honest runs near the bar can miss it too, hence less than a false claim.
SHORT_PENALTY = 5


def release_reward(task: Task, assignment: Assignment, worker_address: str) -> Any:
    """Pay the accepted job out of escrow: its node's ask (``Assignment.price``), with the
    platform's fee on top from the requester's escrow (marketplace/pricing.py)."""
    reference = f"reward:{assignment.pk}"
    if assignment.price is None:
        return ledger.release_to_worker(task.pk, worker_address, reward_per_replica(task), reference=reference)
    fee = pricing.fee_on(assignment.price)
    return ledger.release_to_worker(task.pk, worker_address, assignment.price, reference=reference, fee=fee)


class ResultVoid(Exception):
    """The result's SUBMIT_RESULT can never enter the chain: the worker spent its nonce.

    The worker signed another transaction with the nonce its result's transaction carries
    (after submitting, with its own key), so the result cannot be sealed and is not paid;
    ``verify_assignment`` rejects it.
    """


def accept(assignment_id: UUID, metrics: dict[str, object]) -> Assignment | None:
    """Settle an accepted result. Returns None when it was already settled.

    Raises ResultVoid (changing nothing) when the worker voided its own transaction.
    """
    with transaction.atomic():
        assignment, task = lifecycle.lock(assignment_id)
        if assignment.state != Assignment.State.SUBMITTED:
            return None
        worker = assignment.worker
        if task.status not in ACTIVE:
            # Cancellation refuses while a result awaits its verdict and a failed task
            # waits for it, so this is a backstop: nothing is left in escrow to pay from.
            _close(assignment, Assignment.State.EXPIRED, f"The task was {task.status} before the result was verified.")
            return assignment
        tx, signature = signed_tx_from_json(assignment.result["transaction"])
        # The rows of the workers whose short results this acceptance penalises, before any
        # account: a sweep locks its worker's row, then accounts (workers/assignments/sweep.py).
        short = _lock_shortfalls(task)
        # Every account this settlement touches, locked at once (see lock_task_accounts);
        # the nonce is read under the worker account's lock, so it cannot move after.
        ledger.lock_task_accounts(task.pk, worker.address)
        if ledger.next_nonce(worker.address) > tx.nonce:
            raise ResultVoid(f"the worker spent nonce {tx.nonce}, which its result's transaction carries")
        release = release_reward(task, assignment, worker.address)
        row = ledger.submit_transaction(tx, signature, reference=f"submit:{assignment.pk}")
        if row.status == "refused":
            # The platform built this template; a refusal is our bug, not the worker's.
            # Raising rolls the reward back and leaves the result submitted for a retry.
            raise ledger.LedgerError(row.reason, f"SUBMIT_RESULT refused: {row.reason_detail or row.reason}")
        assignment.metrics = {**assignment.metrics, **metrics}
        _close(assignment, Assignment.State.ACCEPTED)
        gflops = metrics.get("gflops")
        Worker.objects.filter(pk=worker.pk).update(
            reputation=Least(F("reputation") + REPUTATION_UP, 100),
            jobs_done=F("jobs_done") + 1,
            earnings=F("earnings") + release.amount,
            # The best end-to-end figure so far: small tasks are mostly overhead.
            **(
                {"benchmark_gflops": Greatest(Coalesce(F("benchmark_gflops"), 0.0), float(gflops))}
                if isinstance(gflops, int | float)
                else {}
            ),
        )
        for earlier in short:  # the bar was reachable: each short result now costs its worker
            _penalise_short(earlier)
        accepted = Assignment.objects.filter(task=task, state=Assignment.State.ACCEPTED).count()
        if accepted >= task.replication:
            complete(task, assignment, metrics)
        else:
            message = f"{accepted}/{task.replication} replicas verified."
            lifecycle.sync_status(task, message, reason=message)
            transaction.on_commit(partial(lifecycle.schedule_later, task.pk))
    return assignment


def _lock_shortfalls(task: Task) -> list[Assignment]:
    """The task's results rejected short of its bar and not yet penalised, their workers'
    rows locked (in primary-key order)."""
    short = list(
        Assignment.objects.select_for_update().filter(
            task=task, state=Assignment.State.REJECTED, shortfall=Shortfall.PENDING
        )
    )
    list(Worker.objects.select_for_update().filter(pk__in={a.worker_id for a in short}).order_by("pk"))
    return short


def _penalise_short(assignment: Assignment) -> None:
    """A result excused when rejected short of the bar costs ``SHORT_PENALTY``, once."""
    lifecycle.penalise(assignment.worker_id, SHORT_PENALTY)
    assignment.shortfall = Shortfall.PENALISED
    assignment.save(update_fields=["shortfall"])
    transaction.on_commit(partial(worker_changed, assignment.worker_id))


def complete(task: Task, last: Assignment, metrics: dict[str, object]) -> None:
    """Every replica is verified: the task completes with ``last``'s result and the rest of
    its escrow goes back to the requester (task row locked, active task)."""
    workers = (
        Assignment.objects.filter(task=task, state=Assignment.State.ACCEPTED)
        .order_by("settled_at")
        .values_list("worker__address", flat=True)
    )
    complete_locked(
        task,
        {
            "result_hash": last.result["compute_result"]["result_hash"],
            "workers": list(workers),
            **{k: v for k, v in metrics.items() if isinstance(v, int | float | str)},
        },
    )


def complete_stragglers() -> int:
    """Complete active tasks whose replicas are all verified but which never completed.

    Before replicas drove a task's status, a task with replication > 1 went back to open
    when one replica was verified, and the last acceptance then never completed it (the
    rest of its escrow stayed locked). Periodic, so such rows settle by themselves."""
    done = 0
    for task_id in lifecycle.fully_accepted().values_list("pk", flat=True)[:100]:
        with transaction.atomic():
            task = lock_task(task_id)
            last = (
                Assignment.objects.filter(task=task_id, state=Assignment.State.ACCEPTED).order_by("-settled_at").first()
            )
            if task is None or task.status not in ACTIVE or last is None:
                continue
            complete(task, last, dict(last.metrics))
            done += 1
    return done


def give_up(assignment_id: UUID, reason: str) -> Assignment | None:
    """The platform cannot judge a submitted result (its own fault, for too long): the job
    ends without penalty to the worker and is reassigned. None when already settled."""
    with transaction.atomic():
        assignment, task = lifecycle.lock(assignment_id)
        if assignment.state != Assignment.State.SUBMITTED:
            return None
        _close(assignment, Assignment.State.EXPIRED, reason)
        lifecycle.sync_status(task, f"The result of {assignment.worker.name} could not be verified; reassigning.")
        transaction.on_commit(partial(lifecycle.schedule_later, task.pk))
    return assignment


def reject(
    assignment_id: UUID, reason: str, *, penalise: bool = True, metrics: dict[str, object] | None = None
) -> Assignment | None:
    """Settle a rejected result, costing its worker reputation. With ``penalise`` False
    (a true claim short of the quality bar: see ``verification.Verdict``) the cost waits for
    another worker to meet the bar (``accept``), and the worker's provider is
    not offered the task again. The verdict's ``metrics`` are kept on the assignment, as an
    acceptance keeps them, so the task page can say what fell short and by how much.
    Returns None when it was already settled."""
    with transaction.atomic():
        assignment, task = lifecycle.lock(assignment_id)
        if assignment.state != Assignment.State.SUBMITTED:
            return None
        ledger.reject_result(task.pk, assignment.worker.address, reason, reference=f"reject:{assignment.pk}")
        if penalise:
            lifecycle.penalise(assignment.worker_id, REPUTATION_DOWN)
        elif Assignment.objects.filter(task=task, state=Assignment.State.ACCEPTED).exists():
            _penalise_short(assignment)  # another replica already met the bar: it is reachable
        else:
            assignment.shortfall = Shortfall.PENDING
        if metrics:
            assignment.metrics = {**assignment.metrics, **metrics}
        _close(assignment, Assignment.State.REJECTED, reason)
        lifecycle.sync_status(task, f"Result of {assignment.worker.name} rejected: {reason[:200]}")
        transaction.on_commit(partial(lifecycle.schedule_later, task.pk))
    return assignment


def _close(assignment: Assignment, state: str, reason: str = "") -> None:
    """Settle the (locked) assignment in ``state``; its worker's page redraws on commit."""
    assignment.state = state
    assignment.settled_at = timezone.now()
    assignment.reason = reason[:300]
    assignment.save(update_fields=["state", "settled_at", "reason", "metrics", "shortfall"])
    transaction.on_commit(partial(worker_changed, assignment.worker_id))
