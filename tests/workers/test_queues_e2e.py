"""The platform's two trusted queues with real Celery worker processes: sealing and
scheduling (``control``) go on while verification (``platform``) has no free worker,
and a verification waits for a platform worker however many control workers run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ledger import services as ledger
from ledger.models import Block, Transaction, TxStatus
from ledger.tasks import seal_pending
from ledger.units import UNITS_PER_CREDIT
from tests.factories import make_worker, post_task
from tests.workers import processes as p
from workers.models import Assignment
from workers.tasks import verify_assignment

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_blocks_and_scheduling_do_not_wait_for_verification(alice: Any, bob: Any, tmp_path: Path) -> None:
    node, _, _ = make_worker(alice, name="node")
    ledger.deposit(bob, 10 * UNITS_PER_CREDIT, reference="test-deposit")
    with p.platform_worker(tmp_path, queues="control"):
        # A submitted result whose verification nobody can take: no platform worker runs.
        first = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
        p.wait_for(lambda: Assignment.objects.filter(task=first).exists(), 60, "the control worker never scheduled")
        submitted = Assignment.objects.get(task=first, worker=node)
        Assignment.objects.filter(pk=submitted.pk).update(state=Assignment.State.SUBMITTED)
        verify_assignment.delay(str(submitted.pk))

        # Meanwhile the ledger keeps sealing: the deposit and escrow go into a block.
        seal_pending.delay()

        def sealed() -> bool:
            return not Transaction.objects.filter(status=TxStatus.PENDING).exists()

        def explain() -> str:
            return (tmp_path / "control.log").read_text(errors="replace")[-2500:]

        p.wait_for(sealed, 60, "the control worker sealed no block", explain=explain)
        assert Block.objects.filter(height__gte=1).exists()
        assert Assignment.objects.get(pk=submitted.pk).state == Assignment.State.SUBMITTED

    # A platform worker takes the waiting verification. The result has no artifact, so
    # it is rejected, which is all this test needs: the message was there and it ran.
    with p.platform_worker(tmp_path, queues="platform"):
        p.wait_for(
            lambda: Assignment.objects.get(pk=submitted.pk).state != Assignment.State.SUBMITTED,
            60,
            "the platform worker never verified the waiting result",
            explain=lambda: (tmp_path / "platform.log").read_text(errors="replace")[-2500:],
        )
    assert Assignment.objects.get(pk=submitted.pk).state == Assignment.State.REJECTED
