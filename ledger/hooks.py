"""Where the ledger asks another app a question: is this result's assignment real? And
may this address send a TRANSFER of its own (``check_transfer``)?

A SUBMIT_RESULT is admitted only if its task/worker pair has an assignment that exists,
belongs to that worker and is not settled. The ledger knows nothing of assignments, so
the workers app answers through a checker, a callable

    checker(task_id: UUID, worker_address: str) -> str | None

returning None when the result may be admitted, or a short refusal code
("no_assignment", "assignment_settled", …) that the transaction is refused with.

The workers app plugs it in either way:
- ``settings.LEDGER_ASSIGNMENT_CHECKER = "workers.assignments.ledger_hooks.check_assignment"``, or
- ``ledger.hooks.register_assignment_checker(fn)`` from its ``AppConfig.ready()``.
A registered checker wins over the setting. With neither, every SUBMIT_RESULT is refused
with ``assignment_unverifiable``: the ledger never pays for work nobody can vouch for.
The ledger itself also refuses a second SUBMIT_RESULT for the same task and worker.

A TRANSFER signed by its sender and submitted through the API is first put to the
transfer checker, ``checker(sender, recipient) -> str | None``: None lets it through, a
sentence refuses it (the workers app: a node whose provider owes credits sends its
earnings only to the provider's own account, where they pay the debt first). With none
registered, every such TRANSFER goes through to the mempool's own checks.
"""

from __future__ import annotations

from collections.abc import Callable
from uuid import UUID

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

AssignmentChecker = Callable[[UUID, str], "str | None"]

_registered: AssignmentChecker | None = None


def register_assignment_checker(checker: AssignmentChecker | None) -> AssignmentChecker | None:
    """Install (or, with None, remove) the assignment checker. Usable as a decorator."""
    global _registered
    _registered = checker
    return checker


def registered_assignment_checker() -> AssignmentChecker | None:
    """The checker installed with register_assignment_checker, if any."""
    return _registered


def get_assignment_checker() -> AssignmentChecker | None:
    if _registered is not None:
        return _registered
    path = getattr(settings, "LEDGER_ASSIGNMENT_CHECKER", "")
    if not path:
        return None
    try:
        checker = import_string(path)
    except ImportError as exc:
        raise ImproperlyConfigured(f"LEDGER_ASSIGNMENT_CHECKER={path!r} cannot be imported: {exc}") from None
    if not callable(checker):
        raise ImproperlyConfigured(f"LEDGER_ASSIGNMENT_CHECKER={path!r} is not callable")
    return checker


def check_assignment(task_id: UUID, worker_address: str) -> str | None:
    """None when a result for (task, worker) may be admitted, else the refusal code."""
    checker = get_assignment_checker()
    if checker is None:
        return "assignment_unverifiable"
    return checker(task_id, worker_address)


TransferChecker = Callable[[str, str], "str | None"]

_transfer_checker: TransferChecker | None = None


def register_transfer_checker(checker: TransferChecker | None) -> TransferChecker | None:
    """Install (or, with None, remove) the transfer checker."""
    global _transfer_checker
    _transfer_checker = checker
    return checker


def check_transfer(sender: str, recipient: str) -> str | None:
    """None when a TRANSFER its sender signed may go to the mempool, else why not."""
    return None if _transfer_checker is None else _transfer_checker(sender, recipient)
