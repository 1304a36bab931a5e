"""A transaction as one account's history line: in or out, the signed amount, and what it
was in plain words ("Escrow for task 1a2b3c4d", "Refund from task …", "Payout")."""

from __future__ import annotations

import dataclasses
import uuid

from ledger.models import Transaction, TxType

IN, OUT, OWN = "in", "out", ""


@dataclasses.dataclass(frozen=True)
class Entry:
    """``tx`` as seen from one address. ``amount`` is signed: what arrived (+) or what
    left the account, fee included (−); ``task_id`` is the task it is about, if any."""

    tx: Transaction
    direction: str
    amount: int
    words: str
    task_id: str | None


def task_of(tx: Transaction) -> str | None:
    """The task a transaction is about (its payload's task_id, or its ComputeResult's),
    when that is a well-formed UUID."""
    payload = tx.payload if isinstance(tx.payload, dict) else {}
    result = payload.get("compute_result")
    value = payload.get("task_id") or (result.get("task_id") if isinstance(result, dict) else None)
    try:
        return str(uuid.UUID(str(value))) if value else None
    except ValueError:
        return None


def _words(tx: Transaction, direction: str, task: str) -> str:
    kind = tx.payload.get("kind") if isinstance(tx.payload, dict) else None
    incoming = direction == IN
    match tx.type:
        case TxType.DEPOSIT:
            return "Deposit (card payment)" if incoming else "Deposit made"
        case TxType.TRANSFER:
            return "Transfer received" if incoming else "Transfer sent"
        case TxType.ESCROW_LOCK:
            return f"Escrow locked for task {task}" if incoming else f"Escrow for task {task}"
        case TxType.ESCROW_RELEASE if kind == "refund":
            return f"Refund from task {task}" if incoming else f"Refund of task {task}"
        case TxType.ESCROW_RELEASE:
            return f"Reward for task {task}" if incoming else f"Reward paid for task {task}"
        case TxType.FEE:
            return f"Platform fee for task {task}"
        case TxType.PAYOUT:
            return "Payout received" if incoming else "Payout to your bank"
        case TxType.REVERSAL:
            return "Card payment refunded or disputed"
        case TxType.REGISTER_WORKER:
            return "Worker registered"
        case TxType.SUBMIT_RESULT:
            return f"Result submitted for task {task}"
        case TxType.REJECT_RESULT:
            return f"Result rejected for task {task}"
    return tx.get_type_display()


def entry(tx: Transaction, address: str) -> Entry:
    """``tx`` as a line of ``address``'s history."""
    if tx.sender == tx.recipient:
        direction, amount = OWN, -tx.fee if tx.sender == address else 0
    elif tx.recipient == address:
        direction, amount = IN, tx.amount
    else:
        direction, amount = OUT, -(tx.amount + tx.fee)
    task_id = task_of(tx)
    return Entry(tx, direction, amount, _words(tx, direction, (task_id or "?")[:8]), task_id)
