"""Sweeping a worker's earnings into its owner's custodial account.

Verified work pays the worker's own address, whose key stays on the node; payouts take
credits from the provider's custodial account. A sweep is the bridge: a TRANSFER from
the worker address to its owner's account, built here as a template, signed on the
node with its key (``python -m workers.agent sweep``) and admitted through the ledger's
ordinary mempool admission (signature, exact next nonce, balance including the fee).

A worker with an unsettled assignment (offered, running or submitted) cannot sweep: the
SUBMIT_RESULT template it was handed for that job carries its next nonce, and a sweep
would take that nonce and void the result. The scheduler gives a worker one unsettled
job at a time, so the sweep window opens as soon as that job is settled. The check is
not serialised with the scheduler (which locks no worker or ledger row): a job offered
and fetched in the milliseconds between the check and the sweep's commit would carry a
taken nonce, its result would be refused, and the job would expire and be reassigned.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from rest_framework.exceptions import ValidationError

from ledger import gas
from ledger import services as ledger
from ledger.models import Transaction, TxStatus
from protocol import encoding
from workers.assignments.jobs import Conflict
from workers.models import UNSETTLED, Assignment, Worker

# A sweep moving less than this many times its fee gets a warning on the worker's page.
SMALL_SWEEP_FEES = 10


@dataclass(frozen=True)
class SweepState:
    """What a sweep would move now, for the worker's page and the template."""

    balance: int
    fee: int
    to: str
    blocked_by: Assignment | None

    @property
    def amount(self) -> int:
        return max(self.balance - self.fee, 0)

    @property
    def small(self) -> bool:
        """A sweep that would move less than ten times its fee: allowed, but the page
        warns, since waiting for more earnings makes the fee a smaller share."""
        return 0 < self.amount < SMALL_SWEEP_FEES * self.fee


def sweep_fee() -> int:
    """The TRANSFER fee at the platform's gas price, paid out of the swept balance."""
    return gas.fee_for(encoding.TRANSFER, settings.LEDGER_GAS_PRICE)


def unsettled_assignment(worker: Worker) -> Assignment | None:
    return Assignment.objects.filter(worker=worker, state__in=UNSETTLED).order_by("created_at").first()


def sweep_state(worker: Worker) -> SweepState:
    """The worker's spendable ledger balance, the fee, its owner's address, and the
    assignment that blocks a sweep now (if any). Writes nothing, except the owner's
    custodial account when it is missing (ensure_user_account)."""
    return SweepState(
        balance=ledger.address_balance(worker.address),
        fee=sweep_fee(),
        to=ledger.ensure_user_account(worker.owner).address,
        blocked_by=unsettled_assignment(worker),
    )


def _refuse_if_busy(state: SweepState) -> None:
    if state.blocked_by is not None:
        raise Conflict(
            {
                "state": [
                    f"This worker has an unsettled assignment ({state.blocked_by.state}); its SUBMIT_RESULT holds"
                    " the next nonce. Sweep once it is settled."
                ]
            }
        )


def sweep_template(worker: Worker) -> dict[str, Any]:
    """The unsigned TRANSFER of everything the worker address can spend, less the fee,
    to its owner's custodial account. 409 while an assignment is unsettled; 400 when the
    balance does not cover more than the fee."""
    state = sweep_state(worker)
    _refuse_if_busy(state)
    if state.amount <= 0:
        raise ValidationError(
            {
                "amount": [
                    f"Nothing to sweep: the balance ({state.balance} units) does not exceed the fee ({state.fee})."
                ]
            }
        )
    return {
        "chain_id": settings.LEDGER_CHAIN_ID,
        "type": encoding.TRANSFER,
        "from": worker.address,
        "to": state.to,
        "amount": state.amount,
        "fee": state.fee,
        "nonce": ledger.next_nonce(worker.address),
        "gas_price": settings.LEDGER_GAS_PRICE,
        "gas_limit": gas.gas_limit(encoding.TRANSFER),
        "payload": {"memo": "sweep"},
    }


def submit_sweep(worker: Worker, tx: encoding.Tx, signature: bytes) -> tuple[Transaction, bool]:
    """Admit the node-signed sweep. Returns (row, replayed): the row is pending, or
    refused with the mempool's reason (the caller turns that into a 400); ``replayed``
    when this exact signed transaction was admitted before, and nothing moved again.

    The platform checks what makes it a sweep (a TRANSFER from this worker to its
    owner's account, of a positive amount, with no unsettled assignment); the mempool
    checks the rest under its account locks: the signature, the exact next nonce, the
    balance including the fee. The amount need not be the template's: a reward that
    arrived since the template was fetched simply stays at the worker address.
    """
    if tx.type != encoding.TRANSFER:
        raise ValidationError({"type": ["A sweep is a TRANSFER."]})
    if tx.sender != worker.address:
        raise ValidationError({"from": [f"A sweep is sent from this worker's address, {worker.address}."]})
    state = sweep_state(worker)
    if tx.recipient != state.to:
        raise ValidationError({"to": [f"A sweep goes to the owner's account, {state.to}."]})
    if tx.amount <= 0:
        raise ValidationError({"amount": ["Nothing to sweep: the amount must be positive."]})
    try:
        tx_hash = tx.hash().hex()
    except encoding.EncodingError as exc:
        raise ValidationError({exc.field.split(".")[0]: [str(exc)]}) from None
    with transaction.atomic():
        # The scheduler locks a worker's row before offering it a job (scheduler.schedule),
        # so no job (and no SUBMIT_RESULT nonce) can be handed out between this check and
        # the sweep taking the nonce.
        Worker.objects.select_for_update().filter(pk=worker.pk).first()
        _refuse_if_busy(SweepState(state.balance, state.fee, state.to, unsettled_assignment(worker)))
        replayed = (
            Transaction.objects.filter(hash=tx_hash, signature=signature.hex())
            .exclude(status=TxStatus.REFUSED)
            .exists()
        )
        return ledger.submit_transaction(tx, signature), replayed
