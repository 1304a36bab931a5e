"""Names for the ledger's system accounts, shown beside their addresses on every page.

The treasury (it signs deposits and receives payouts) and the fee collector (the
validator: it seals blocks and collects fees) are known from their keys; an escrow
account is the ``escrow`` Account whose ``reference`` is its task's id."""

from __future__ import annotations

from collections.abc import Iterable

from ledger import custody
from ledger.models import Account, AccountKind

TREASURY = "Treasury"
FEE_COLLECTOR = "Fee collector (validator)"


def escrow_label(task_id: object) -> str:
    return f"Escrow of task {str(task_id)[:8]}"


def system_labels() -> dict[str, str]:
    """The treasury's and the fee collector's addresses and names (no query: from the keys)."""
    return {custody.treasury_keys().address: TREASURY, custody.validator_keys().address: FEE_COLLECTOR}


def labels_for(addresses: Iterable[str]) -> dict[str, str]:
    """address → name, for those of ``addresses`` that are system or escrow accounts.
    One query (on the unique address index) when any address is not a known system one."""
    wanted = set(addresses)
    labels = {address: name for address, name in system_labels().items() if address in wanted}
    rest = wanted - labels.keys()
    if rest:
        escrows = Account.objects.filter(kind=AccountKind.ESCROW, address__in=rest).values_list("address", "reference")
        labels.update((address, escrow_label(reference)) for address, reference in escrows)
    return labels
