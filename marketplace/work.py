"""What the marketplace asks of the app that runs its tasks.

The workers app sits above the marketplace: it imports the marketplace, never the other
way. The pages and endpoints of a task still show what only the workers app knows (who
could take a task now, the live state of its jobs, its result files, its ledger trail), so
the marketplace names the questions here, as a ``TaskWork`` protocol, and the workers app
answers them with ``install(...)`` from its ``AppConfig.ready()`` (``workers/work.py``).
"""

from __future__ import annotations

from collections.abc import Sized
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from django.core.exceptions import ImproperlyConfigured

if TYPE_CHECKING:
    from ledger.models import Transaction
    from marketplace.models import Task


class Supply(Protocol):
    """The online workers, by whether they could take a task now."""

    @property
    def online(self) -> int: ...

    @property
    def fitting(self) -> int: ...

    @property
    def free(self) -> Sized: ...

    @property
    def lowest_asks(self) -> list[int]:
        """What the cheapest fitting workers, free or busy, would cost (fee included)."""
        ...

    @property
    def at_bid(self) -> int:
        """Fitting workers, free or busy, whose ask fits the bid."""
        ...

    def posting_warning(self, replication: int) -> str:
        """Why a task not posted yet would wait, or "" when enough workers fit."""
        ...

    def bid_advice(self) -> str:
        """When no fitting worker takes the task at its bid: the bid that one would take."""
        ...


class TaskWork(Protocol):
    """The questions about a task's work that the marketplace asks the workers app."""

    def survey(self, kind: str, spec: dict[str, Any], min_reputation: int, bid: int | None = None) -> Supply:
        """Which online workers could take a task of ``kind`` and ``spec`` now (at ``bid``)."""
        ...

    def expected_wait(self, kind: str, bid: int, at_bid: int, free: int) -> float | None:
        """Seconds a task of ``kind`` bidding ``bid`` would likely wait for a node, with
        ``at_bid`` fitting nodes taking that bid, ``free`` of them free now; None when no
        node takes it or there is no history of the kind's jobs to estimate from."""
        ...

    def expected_run(self, kind: str, tflop: float) -> float | None:
        """Seconds a job of ``tflop`` of ``kind``'s work would likely take once a node has
        it, from the kind's recent verified jobs; None with no history to estimate from."""
        ...

    def live_state(self, task: Task) -> dict[str, Any]:
        """The live part of the task page (its jobs' progress, history and log tail)."""
        ...

    def start_times(self, task: Task) -> list[datetime]:
        """When each of the task's jobs started."""
        ...

    def ledger_trail(self, task: Task) -> list[Transaction]:
        """The task's transactions on the ledger."""
        ...

    def result_files(self, task: Task) -> list[str]:
        """Names of the verified result's files (none until the task completed)."""
        ...

    def verdict(self, task: Task) -> dict[str, Any] | None:
        """The verdict on the task's deciding result (passed, short of the bar, rejected),
        with the bars its verifier applied and why, in words; None while none was judged."""
        ...

    def result_file(self, task: Task, name: str) -> str:
        """Storage name of one result file: DRF's NotFound when there is none of that
        name, a 409 APIException while the task is not completed."""
        ...


_installed: TaskWork | None = None


def install(work: TaskWork) -> None:
    """Answer the marketplace's questions with ``work`` (the workers app, at ready())."""
    global _installed
    _installed = work


def work() -> TaskWork:
    """The installed answers; the platform cannot run without them."""
    if _installed is None:
        raise ImproperlyConfigured("No app answers marketplace.work: add the workers app to INSTALLED_APPS.")
    return _installed
