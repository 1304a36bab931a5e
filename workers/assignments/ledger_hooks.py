"""The answers the ledger asks of the workers app: may this SUBMIT_RESULT be admitted?
May this node's TRANSFER go where it is sent?"""

from __future__ import annotations

from uuid import UUID

from ledger.models import Account, AccountKind
from ledger.units import format_credits
from workers.models import Assignment, Worker


def check_assignment(task_id: UUID, worker_address: str) -> str | None:
    """None when (task, worker) has a submitted, unsettled assignment; else a refusal code."""
    states = list(
        Assignment.objects.filter(task_id=task_id, worker__address=worker_address).values_list("state", flat=True)
    )
    if not states:
        return "no_assignment"
    if Assignment.State.SUBMITTED in states:
        return None
    return "assignment_settled"


def check_node_transfer(sender: str, recipient: str) -> str | None:
    """A node whose provider owes credits (a refunded or disputed purchase) sends its
    earnings only to the provider's own account, where they pay the debt first (a sweep);
    None for any other sender, or when nothing is owed."""
    owner = Worker.objects.filter(address=sender).values_list("owner_id", flat=True).first()
    if owner is None:
        return None
    account = Account.objects.filter(user_id=owner, kind=AccountKind.USER).values_list("address", "owed").first()
    if account is None or account[1] <= 0 or account[0] == recipient:
        return None
    return (
        f"This node's provider owes {format_credits(account[1])} credits from a refunded or disputed purchase:"
        " its earnings go only to the provider's own account (a sweep), where they pay the debt first."
    )
