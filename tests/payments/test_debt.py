"""Money that cannot slip away: credits of a purchase that is disputed or refunded after
they were escrowed come back from the escrow only to pay the debt the reversal left, a
later purchase pays that debt first, and a debtor can neither open tasks nor be paid out
until it is paid. A dispute the platform wins gives back what was burnt and forgets the
rest. Events are signed and delivered to the webhook as in test_reversals; tasks are
posted and cancelled through the REST API."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command
from django.db import transaction
from django.db.models import Q
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from ledger import services as ledger
from ledger.models import Transaction
from ledger.units import UNITS_PER_CREDIT
from marketplace import lifecycle
from marketplace.models import Task, TaskStatus
from payments.models import Payment, PayoutRequest
from tests.payments.conftest import event
from tests.payments.helpers import chain_agrees, charge_of, credited, dispute

pytestmark = pytest.mark.django_db

CREDIT = UNITS_PER_CREDIT
SPEC = {"n": 256, "count": 2}


@pytest.fixture
def carol_client(carol: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(carol)
    return client


def post(client: APIClient, credits: int) -> Task:
    """Post a synthetic task with ``credits`` of budget that no worker will take."""
    body = {"kind": "synthetic", "spec": SPEC, "budget": str(credits), "min_reputation": 100}
    response = client.post("/api/v1/tasks/", body, format="json")
    assert response.status_code == 201, response.content
    return Task.objects.get(pk=response.json()["id"])


def history(user: Any) -> list[tuple[str, int, str]]:
    """The user's ledger transactions in the order they were made: (type, amount, reference)."""
    address = ledger.ensure_user_account(user).address
    rows = Transaction.objects.filter(Q(sender=address) | Q(recipient=address)).order_by("id")
    return [(t.type, t.amount, str(t.reference)) for t in rows]


def audited() -> None:
    """The chain, sealed, replays from genesis (and the operator's command agrees)."""
    chain_agrees()
    call_command("verify_chain")


def cannot_escrow(user: Any) -> None:
    """Nothing the user holds can be locked in escrow."""
    with pytest.raises(ledger.InsufficientFunds):
        ledger.lock_escrow(Task.objects.filter(owner=user).first().pk, user, 1, reference="try-again")  # type: ignore[union-attr]


def test_a_dispute_of_escrowed_credits_keeps_them_when_the_task_is_cancelled(
    carol: Any, carol_client: APIClient, ls: Any, deliver: Any
) -> None:
    payment, charge = credited(ls, carol, deliver, credits=10)
    task = post(carol_client, 10)
    assert (ledger.balance(carol), ledger.escrowed(carol)) == (0, 10 * CREDIT)

    outcome = deliver(event("charge.dispute.created", dispute(payment, charge["id"]))).json()["outcome"]
    assert outcome == f"reversed 0 units, shortfall {10 * CREDIT}"

    response = carol_client.post(f"/api/v1/tasks/{task.pk}/cancel/")
    assert response.status_code == 200, response.content
    task.refresh_from_db()
    assert task.status == TaskStatus.CANCELLED
    # The escrow came back and paid the debt at once: nothing of it is spendable.
    assert (ledger.balance(carol), ledger.escrowed(carol)) == (0, 0)
    assert ledger.owed(carol) == 0
    release = Transaction.objects.get(type="ESCROW_RELEASE", payload__task_id=str(task.pk))
    assert history(carol)[-2:] == [
        ("ESCROW_RELEASE", 10 * CREDIT, f"refund:{task.pk}"),
        ("REVERSAL", 10 * CREDIT, f"debt:{release.hash}"),
    ]
    cannot_escrow(carol)
    wallet = carol_client.get("/api/v1/ledger/wallet/").json()
    assert (wallet["balance"], wallet["owed"]) == (0, 0)
    audited()


def test_a_refund_with_half_escrowed_keeps_the_escrow_when_the_task_fails(
    carol: Any, carol_client: APIClient, ls: Any, deliver: Any
) -> None:
    payment, charge = credited(ls, carol, deliver, credits=10)
    task = post(carol_client, 5)
    ls.post("/v1/refunds", data={"charge": charge["id"]}).raise_for_status()
    outcome = deliver(event("charge.refunded", charge_of(ls, charge["id"]))).json()["outcome"]
    assert outcome == f"reversed {5 * CREDIT} units, shortfall {5 * CREDIT}"
    assert ledger.balance(carol) == 0

    with transaction.atomic():
        row = lifecycle.lock_task(task.pk)
        assert row is not None
        lifecycle.fail_locked(row, "No worker took it.", reason="A test failed it.")
    assert (ledger.balance(carol), ledger.escrowed(carol)) == (0, 0)
    assert ledger.owed(carol) == 0
    payment.refresh_from_db()
    assert (payment.status, payment.reversed_units, payment.shortfall_units) == ("refunded", 5 * CREDIT, 5 * CREDIT)
    cannot_escrow(carol)
    audited()


def test_a_later_purchase_pays_the_debt_first(carol: Any, carol_client: APIClient, ls: Any, deliver: Any) -> None:
    payment, charge = credited(ls, carol, deliver, credits=10)
    post(carol_client, 10)
    deliver(event("charge.dispute.created", dispute(payment, charge["id"])))

    later, _ = credited(ls, carol, deliver, credits=15)
    assert later.status == "succeeded"
    assert ledger.balance(carol) == 5 * CREDIT
    assert ledger.owed(carol) == 0
    deposit = Transaction.objects.get(reference=f"payment:{later.pk}")
    assert history(carol)[-2:] == [
        ("DEPOSIT", 15 * CREDIT, f"payment:{later.pk}"),
        ("REVERSAL", 10 * CREDIT, f"debt:{deposit.hash}"),
    ]
    # Paid: the account may open tasks again, with what the purchase left.
    assert post(carol_client, 5).status == TaskStatus.OPEN
    audited()


def test_a_debtor_can_neither_post_nor_request_a_payout(
    carol: Any, carol_client: APIClient, ls: Any, deliver: Any
) -> None:
    payment, charge = credited(ls, carol, deliver, credits=10)
    post(carol_client, 10)
    deliver(event("charge.dispute.created", dispute(payment, charge["id"])))
    tasks = Task.objects.count()

    body = {"kind": "synthetic", "spec": SPEC, "budget": "1"}
    response = carol_client.post("/api/v1/tasks/", body, format="json")
    assert response.status_code == 400
    assert "owes 10 credits" in " ".join(response.json()["budget"]), response.json()

    web = Client()
    web.force_login(carol)
    form = {"title": "t", "spec_n": "256", "spec_count": "2", "spec_entry_bound": "4", "budget": "1"}
    form |= {"min_reputation": "0", "replication": "1", "max_attempts": "3"}
    page = web.post(reverse("task-post", args=["synthetic"]), form)
    assert page.status_code == 400
    assert "owes 10 credits" in page.content.decode()
    assert Task.objects.count() == tasks

    assert carol_client.post("/api/v1/payments/account/", {}, format="json").status_code == 201
    account_id = carol.stripe_account.account_id
    deliver(event("account.updated", ls.post(f"/_config/proofwork/accounts/{account_id}/enable").json()))
    response = carol_client.post("/api/v1/payments/payouts/", {"amount": "60"}, format="json")
    assert response.status_code == 400
    assert "owes 10 credits" in " ".join(response.json()["amount"]), response.json()
    assert not PayoutRequest.objects.exists()

    # The debt shows where the user looks at their money.
    wallet = carol_client.get("/api/v1/ledger/wallet/").json()
    assert (wallet["balance"], wallet["owed"], wallet["owed_credits"]) == (0, 10 * CREDIT, "10")
    assert "owes 10 credits" in web.get("/wallet/").content.decode()
    audited()


@pytest.mark.parametrize("cancel_first", [True, False], ids=["escrow-back-first", "won-first"])
def test_a_dispute_won_after_the_freeze_gives_everything_back(
    carol: Any, carol_client: APIClient, ls: Any, deliver: Any, cancel_first: bool
) -> None:
    payment, charge = credited(ls, carol, deliver, credits=10)
    task = post(carol_client, 10)
    opened = dispute(payment, charge["id"])
    deliver(event("charge.dispute.created", opened))

    def cancel() -> None:
        assert carol_client.post(f"/api/v1/tasks/{task.pk}/cancel/").status_code == 200

    if cancel_first:
        cancel()
        assert ledger.balance(carol) == 0
        assert ledger.owed(carol) == 0
        outcome = deliver(event("charge.dispute.closed", {**opened, "status": "won"})).json()["outcome"]
        # What paid the debt is given back.
        assert outcome == f"restored {10 * CREDIT} units"
    else:
        outcome = deliver(event("charge.dispute.closed", {**opened, "status": "won"})).json()["outcome"]
        # Nothing had been burnt: the debt is forgotten, and the escrow is the user's again.
        assert outcome == "restored 0 units"
        assert ledger.owed(carol) == 0
        cancel()
    assert (ledger.balance(carol), ledger.escrowed(carol), ledger.owed(carol)) == (10 * CREDIT, 0, 0)
    payment.refresh_from_db()
    assert (payment.status, payment.reversed_units, payment.shortfall_units) == ("succeeded", 0, 0)
    assert Payment.objects.get(pk=payment.pk).dispute_status == "won"
    audited()


def test_a_dispute_won_after_a_purchase_paid_part_of_its_debt(
    carol: Any, carol_client: APIClient, ls: Any, deliver: Any
) -> None:
    payment, charge = credited(ls, carol, deliver, credits=10)
    task = post(carol_client, 10)
    opened = dispute(payment, charge["id"])
    deliver(event("charge.dispute.created", opened))
    credited(ls, carol, deliver, credits=6)  # pays 6 of the 10 owed
    assert ledger.balance(carol) == 0
    assert ledger.owed(carol) == 4 * CREDIT

    deliver(event("charge.dispute.closed", {**opened, "status": "won"}))
    # The 4 still owed are forgotten, the 6 paid come back; the escrow is the user's again.
    assert (ledger.balance(carol), ledger.owed(carol)) == (6 * CREDIT, 0)
    assert carol_client.post(f"/api/v1/tasks/{task.pk}/cancel/").status_code == 200
    assert ledger.balance(carol) == 16 * CREDIT
    audited()
