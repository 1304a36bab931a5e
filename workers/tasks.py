"""Celery tasks of the workers app, on the platform's trusted queues: verification on
``platform``, scheduling, expiry and the artifact purge on ``control`` (routes:
``CELERY_TASK_ROUTES`` in config/settings.py).

Each takes ids as JSON strings, re-reads the rows, and returns quietly when the work is
gone or already done, so a redelivered message is harmless.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import timedelta
from typing import Any

from celery import Task, shared_task
from django.conf import settings
from django.core.cache import cache
from django.db import OperationalError, connections
from django.db.models import F
from django.utils import timezone

from workers import verification
from workers.assignments import delegation, jobs, nodebroker, retention, scheduler, settlement, supply
from workers.assignments import market_pass as market
from workers.models import Assignment

log = logging.getLogger(__name__)


@shared_task(name="workers.schedule_task", ignore_result=True)
def schedule_task(task_id: str) -> int:
    """A task opened or one of its jobs ended (freeing a node): a market pass gives the free
    nodes to the waiting tasks by bid, then the task itself is scheduled (its status
    reason, or its failure once its attempts are used up)."""
    offered = _market_pass()
    return offered + len(scheduler.schedule(task_id))  # type: ignore[arg-type]


# Passes coalesce: an event arriving while a pass runs asks for one more after it instead
# of a pass of its own, so a burst of postings or finished jobs costs a few passes, not one
# each (a pass reads every waiting task). A wake-up lost between the last check and the
# lock's release waits for the periodic pass.
PASS_LOCK, PASS_AGAIN = "workers:market-pass:running", "workers:market-pass:again"
PASS_LOCK_SECONDS = 120  # longer than any pass; a crashed holder's lock expires


def _market_pass() -> int:
    if not cache.add(PASS_LOCK, 1, PASS_LOCK_SECONDS):
        cache.set(PASS_AGAIN, 1, PASS_LOCK_SECONDS)
        return 0
    offered = 0
    try:
        again = True
        while again:
            cache.delete(PASS_AGAIN)
            try:
                offered += market.offer_waiting()
            except Exception:
                log.exception("the market pass failed; the next one tries again")
                break
            again = bool(cache.get(PASS_AGAIN))
    finally:
        cache.delete(PASS_LOCK)
    return offered


@shared_task(name="workers.schedule_waiting", ignore_result=True)
def schedule_waiting() -> int:
    """Periodic: expire silent or overdue jobs, ask again for stalled verifications, try
    every waiting task again, then fail (with a refund) those that waited too long."""
    # Each step, and each task in the last, is on its own: one failing row must not stop
    # expiry, resends and scheduling for every other task.
    for step in (
        scheduler.expire_overdue,
        delegation.expire_overdue,
        jobs.resend_stalled_verifications,
        settlement.complete_stragglers,
    ):
        try:
            step()
        except Exception:
            log.exception("%s failed; the next pass tries again", step.__name__)
    offered = _market_pass()
    with supply.one_pass():  # why each task still waits: one read of the online workers
        for task_id in scheduler.open_tasks_waiting():
            try:
                offered += len(scheduler.schedule(task_id))
            except Exception:
                log.exception("scheduling task %s failed; the next pass tries again", task_id)
    # After scheduling, so a worker that came online just in time still takes the task.
    try:
        scheduler.give_up_waiting()
    except Exception:
        log.exception("give_up_waiting failed; the next pass tries again")
    return offered


# The node broker's management API was down when a worker's state changed: keep trying
# for about an hour (its token is refused meanwhile, and a suspended or retired worker is
# offered nothing).
@shared_task(
    name="workers.sync_node_broker",
    ignore_result=True,
    autoretry_for=(nodebroker.NodeBrokerError,),
    retry_backoff=5,
    retry_backoff_max=600,
    retry_jitter=True,
    max_retries=12,
)
def sync_node_broker(worker_id: str) -> None:
    """Make a node's broker user and permissions match its worker row (nodebroker.sync_node)."""
    nodebroker.sync_node(worker_id)


@shared_task(name="workers.purge_rejected_artifacts", ignore_result=True)
def purge_rejected_artifacts() -> int:
    """Periodic: delete rejected results' uploads once their retention period is over."""
    return retention.purge_rejected_artifacts()


# A database that is briefly unavailable or locked while settling must not strand the
# result in "submitted" (the message is acknowledged when the task ends): try again.
# Settling is idempotent, so a retry after a partial run is harmless.
@shared_task(
    bind=True,
    name="workers.verify_assignment",
    ignore_result=True,
    autoretry_for=(OperationalError,),
    retry_backoff=2,
    retry_backoff_max=120,
    max_retries=8,
)
def verify_assignment(self: Task, assignment_id: str) -> str:
    """Judge a submitted result and settle it; at most VERIFY_MAX_ATTEMPTS runs that die.

    A run whose process is killed (out of memory, a hard time limit) raises nothing here:
    the message comes back (late acks, reject on worker lost) or is sent again
    (``jobs.resend_stalled_verifications``), and every path starts here. So each run is
    counted when it starts and uncounted when it ends in an exception; the run that finds
    the count over the cap does not start the verifier again but rejects the result.
    Rejected, not given up: the verifiers read a worker's artifacts within what its task
    needs, so a result that kills the verifier again and again is the result's doing, and
    giving it up without penalty would let a worker do it for free. The task goes back to
    the scheduler, to be completed by another worker or failed with its refund.

    A retry of a run that raised (a database error: ``autoretry_for``) is the same run
    going on, not a new one: it is not counted, so a busy database (SQLite's "locked")
    cannot use the count up however often it makes the run retry.

    In delegated mode a trained result's first run offers its segments to a verifier node
    and ends ("delegated", uncounted); the node's answer, or its deadline, asks again
    (``workers.assignments.delegation``).
    """
    assignment = Assignment.objects.select_related("task", "worker").filter(pk=assignment_id).first()
    if assignment is None or assignment.state != Assignment.State.SUBMITTED:
        return "skipped"
    if delegation.waiting(assignment, ready=_chain_holds):
        # A verifier node has the segments: its answer, or its deadline, asks again.
        return "delegated"
    counted = not self.request.retries
    attempts = _start_attempt(assignment) if counted else _attempts(assignment)
    if attempts is None:
        return "skipped"
    if attempts > settings.VERIFY_MAX_ATTEMPTS:
        log.error("verification of %s did not finish %d times; rejecting the result", assignment_id, attempts - 1)
        reason = f"verification did not finish: the verifier was stopped {attempts - 1} times on this result."
        settled = settlement.reject(assignment.pk, reason)
        return "skipped" if settled is None else str(settled.state)
    try:
        with _lease(assignment.pk):
            return _verify_and_settle(assignment)
    except Exception:
        # The run ended (an error to retry or to ask again for later): not a run that died.
        # With the database down this fails too, and the run stays counted (once: its
        # retries are not counted).
        if counted:
            with suppress(OperationalError):
                _uncount(assignment.pk)
        raise


def _chain_holds(assignment: Assignment) -> bool:
    """Whether a result's proof of training passes what needs no re-execution, before its
    segments go to a verifier node; a fault says no, and the verification proper reports it."""
    try:
        return not verification.base.chain_problem(assignment)
    except Exception:
        log.exception("the chain of %s could not be checked before delegating it", assignment.pk)
        return False


@contextmanager
def _lease(assignment_id: Any) -> Iterator[None]:
    """Keep the result's ``verify_sent_at`` fresh while this run is alive.

    ``jobs.resend_stalled_verifications`` asks again for a result whose verification was
    last asked for (or last showed life) ``VERIFY_RESEND_AFTER`` ago: without renewal, a
    verification slower than that would be sent again while it runs, another run would
    start beside it every 15 minutes, each counted, and the count would reject a result
    whose first run is still working. A run that dies stops renewing, so its result is
    asked for again ``VERIFY_RESEND_AFTER`` after its last renewal. The renewal runs on its
    own thread (and database connection, closed when the run ends), every third of the
    resend period.
    """
    stop = threading.Event()
    interval = max(settings.VERIFY_RESEND_AFTER / 3, 0.05)

    def renew() -> None:
        try:
            while not stop.wait(interval):
                try:
                    Assignment.objects.filter(pk=assignment_id, state=Assignment.State.SUBMITTED).update(
                        verify_sent_at=timezone.now()
                    )
                except Exception:  # a busy or lost database: the next renewal tries again
                    log.warning("could not renew the verification lease of %s", assignment_id, exc_info=True)
        finally:
            connections.close_all()  # this thread's own connections

    thread = threading.Thread(target=renew, name=f"verify-lease-{assignment_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _uncount(assignment_id: Any) -> None:
    Assignment.objects.filter(pk=assignment_id, verify_attempts__gt=0).update(verify_attempts=F("verify_attempts") - 1)


def _attempts(assignment: Assignment) -> int | None:
    """The runs counted so far, or None when the result was settled meanwhile."""
    return (
        Assignment.objects.filter(pk=assignment.pk, state=Assignment.State.SUBMITTED)
        .values_list("verify_attempts", flat=True)
        .first()
    )


def _start_attempt(assignment: Assignment) -> int | None:
    """Count one more verification run of a submitted result: the count, or None when the
    result was settled meanwhile."""
    counted = Assignment.objects.filter(pk=assignment.pk, state=Assignment.State.SUBMITTED).update(
        verify_attempts=F("verify_attempts") + 1
    )
    if not counted:
        return None
    return Assignment.objects.filter(pk=assignment.pk).values_list("verify_attempts", flat=True).get()


def _verify_and_settle(assignment: Assignment) -> str:
    try:
        verdict = verification.verify(assignment)
    except OperationalError:
        raise  # the platform's database, not the worker's result: retried above
    except verification.PlatformFault as exc:
        # The platform's own data, not the worker's result: asked again later
        # (resend_stalled_verifications), until it has failed for too long.
        submitted = assignment.submitted_at or timezone.now()
        if timezone.now() - submitted < timedelta(seconds=settings.VERIFY_GIVE_UP_AFTER):
            raise
        log.error("giving up verifying %s: %s", assignment.pk, exc)
        settlement.give_up(assignment.pk, f"The platform could not verify this result: {exc}")
        return "given-up"
    except Exception as exc:  # a verifier crash on worker data is a rejection, not a lost job
        log.exception("verifier failed on %s", assignment.pk)
        verdict = verification.Verdict(False, f"verification error: {type(exc).__name__}")
    # A settle call returns None when another verifier (a redelivered message) or a
    # give-up settled the result meanwhile: then this run decided nothing.
    if verdict.ok:
        try:
            settled = settlement.accept(assignment.pk, verdict.metrics)
        except settlement.ResultVoid as exc:
            settled = settlement.reject(assignment.pk, f"The result cannot be sealed: {exc}.")
            return "skipped" if settled is None else str(settled.state)
        return "skipped" if settled is None else str(settled.state)  # expired if the task ended meanwhile
    settled = settlement.reject(
        assignment.pk, verdict.reason or "rejected", penalise=verdict.penalise, metrics=verdict.metrics
    )
    return "skipped" if settled is None else str(settled.state)
