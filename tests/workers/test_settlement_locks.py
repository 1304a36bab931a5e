"""Settlement against a sealer on real PostgreSQL: accepting a result moves money in three
steps (pay the worker, admit its SUBMIT_RESULT, refund the rest), and a sealer locks the
same accounts in address order while it seals them. Neither may deadlock the other."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, connections, transaction

from ledger import services as ledger
from ledger.models import Account, AccountKind
from ledger.units import UNITS_PER_CREDIT
from marketplace.models import Task, TaskStatus
from protocol.bech32 import CHARSET, HRP
from tests.conftest import funded
from tests.factories import UserFactory, post_task
from tests.workers.test_jobs import Provider
from workers.assignments import scheduler, settlement
from workers.models import Assignment

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql",
        reason="row locks and deadlock detection need PostgreSQL (set DATABASE_URL); SQLite serialises every writer",
    ),
]


# The first data character of a bech32 address takes each of 32 values; these sort first.
_LOWER_HALF = "".join(sorted(CHARSET))[:16]


def _requester_in_the_lower_half() -> Any:
    """A funded requester whose ledger address sorts in the lower half of the address space,
    so that each new escrow address has at least an even chance of sorting after it (a
    requester near the top would leave no escrow after it, however many tasks it posts)."""
    for n in range(64):
        user = funded(UserFactory(username=f"requester{n}"))
        address = Account.objects.get(user=user, kind=AccountKind.USER).address
        if address.removeprefix(f"{HRP}1")[0] in _LOWER_HALF:
            return user
    raise AssertionError("64 random addresses all in the upper half")


def _task_whose_escrow_sorts_after(owner: Any) -> tuple[Task, str, str]:
    """A funded synthetic task whose escrow address sorts after its owner's: the order in
    which a sealer takes the owner's account first and then waits for the escrow's."""
    owner_address = Account.objects.get(user=owner, kind=AccountKind.USER).address
    for _ in range(64):
        task = post_task(owner, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
        escrow = ledger.escrow_account(task.pk)
        assert escrow is not None
        if owner_address < escrow.address:
            return task, owner_address, escrow.address
    raise AssertionError("64 random escrow addresses all sorted before the owner's")


def test_a_result_settles_while_a_sealer_holds_the_requesters_account(alice: Any, tmp_path: Path) -> None:
    node = Provider(alice, "node")
    requester = _requester_in_the_lower_half()
    task, first, second = _task_whose_escrow_sorts_after(requester)
    (assignment,) = scheduler.schedule(task.pk)
    assert node.submit(assignment, node.run_job(assignment, tmp_path)).status_code == 202

    held = threading.Event()
    sealer_error: list[BaseException] = []

    def sealer() -> None:
        # What seal_block does for a block with a transaction of the requester's and one of the
        # escrow's, slowed down between the two rows so settlement runs into it.
        try:
            with transaction.atomic():
                list(Account.objects.select_for_update().filter(address=first))
                held.set()
                time.sleep(1.5)
                list(Account.objects.select_for_update().filter(address=second))
        except BaseException as exc:  # asserted on below
            sealer_error.append(exc)
        finally:
            held.set()
            connections.close_all()

    thread = threading.Thread(target=sealer)
    thread.start()
    assert held.wait(10)
    try:
        # Before the fix: settlement locked the escrow to pay, then waited for the requester's
        # account to refund while the sealer waited for the escrow: "deadlock detected".
        settled = settlement.accept(assignment.pk, {})
    finally:
        thread.join(30)
    assert sealer_error == []
    assert settled is not None
    assert settled.state == Assignment.State.ACCEPTED
    task.refresh_from_db()
    assert task.status == TaskStatus.COMPLETED
    escrow = ledger.escrow_account(task.pk)
    assert escrow is not None
    assert escrow.available == 0
    assert ledger.address_balance(node.worker.address) > 0
