"""What a task cost, read from its transactions on the ledger.

Every number is a sum of amounts or fees the ledger recorded (admitted: pending or
sealed), never a formula over settings: the platform's fee is whatever FEE transactions
left the escrow, whichever way the fee is charged, and the gas is the fee each worker's
SUBMIT_RESULT paid at the gas price it was signed at.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ledger.models import Transaction, TxStatus
from protocol import encoding


@dataclass(frozen=True)
class TaskCosts:
    """Where a task's escrow went, in base units.

    ``escrowed`` = ``paid_to_workers`` + ``platform_fee`` + ``refunded`` + ``held``. The
    workers' gas is paid by the workers out of what they were paid: it is part of
    ``paid_to_workers``, not a further cost to the requester."""

    escrowed: int
    paid_to_workers: int
    platform_fee: int
    worker_gas: int
    refunded: int

    @property
    def held(self) -> int:
        """Still in escrow (nothing once the task is settled and refunded)."""
        return self.escrowed - self.paid_to_workers - self.platform_fee - self.refunded

    @property
    def spent(self) -> int:
        """What the requester paid for the work: the workers' rewards and the platform's fee."""
        return self.paid_to_workers + self.platform_fee

    @property
    def workers_kept(self) -> int:
        """What the workers were paid, less the gas of their results."""
        return self.paid_to_workers - self.worker_gas


def task_costs(txs: Iterable[Transaction]) -> TaskCosts:
    """Sum a task's transactions (``ledger.services.task_transactions``) into its costs.

    The escrow is the recipient of the ESCROW_LOCK transactions; what leaves it is a
    reward (ESCROW_RELEASE of kind ``reward``), a refund (kind ``refund``) or the
    platform's fee (FEE). The gas is the fee of each SUBMIT_RESULT in the list. Refused
    transactions moved nothing and are skipped."""
    escrowed = paid = fee = gas = refunded = 0
    escrows: set[str] = set()
    rows = [t for t in txs if t.status != TxStatus.REFUSED]
    for t in rows:
        if t.type == encoding.ESCROW_LOCK:
            escrowed += t.amount
            escrows.add(t.recipient)
    for t in rows:
        if t.type == encoding.ESCROW_RELEASE and t.sender in escrows:
            kind = t.payload.get("kind") if isinstance(t.payload, dict) else None
            if kind == "refund":
                refunded += t.amount
            else:
                paid += t.amount
        elif t.type == encoding.FEE and t.sender in escrows:
            fee += t.amount
        elif t.type == encoding.SUBMIT_RESULT:
            gas += t.fee
    return TaskCosts(escrowed=escrowed, paid_to_workers=paid, platform_fee=fee, worker_gas=gas, refunded=refunded)
