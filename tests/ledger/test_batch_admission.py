"""Admitting a batch is admitting its transactions one at a time (hypothesis): the same
verdicts and reasons, the same accounts (balances, nonces, keys, empty rows) and, once
sealed, the same state root, on a chain that verifies."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings as django_settings
from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger import custody, gas
from ledger.mempool import Submission, admit, admit_batches
from ledger.models import Account, Transaction
from ledger.replay import verify_chain
from ledger.sealer import ensure_genesis, seal_all
from protocol import encoding
from protocol.keys import KeyPair
from tests.ledger.helpers import CREDIT, signed, worker_keys

pytestmark = pytest.mark.django_db

# Four keys with no account at first; index 4 is the treasury (a sender only).
KEYS = [worker_keys(300 + i) for i in range(4)]
TREASURY = 4
TRANSFER_FEE = gas.fee_for(encoding.TRANSFER, django_settings.LEDGER_GAS_PRICE)

keys_ = st.integers(0, len(KEYS) - 1)
# Mostly the nonce the sender would use if all its earlier transactions went in.
nonce_slips = st.sampled_from([0, 0, 0, 0, 1, -1])
# Small and large against deposits of up to 1 credit: overdrafts and exact spends.
amounts = st.sampled_from([1, 5, CREDIT // 2, CREDIT - TRANSFER_FEE, CREDIT, 2 * CREDIT])
new_batch = st.booleans()
operation = st.one_of(
    st.tuples(st.just("deposit"), keys_, amounts, nonce_slips, new_batch),
    st.tuples(st.just("transfer"), keys_, keys_, amounts, nonce_slips, new_batch),
    st.tuples(st.just("register"), keys_, nonce_slips, new_batch),
    st.tuples(st.just("resend"), st.integers(0, 30), new_batch),
)


def _pair(index: int) -> KeyPair:
    return custody.treasury_keys() if index == TREASURY else KEYS[index]


def _submissions(ops: list[tuple[Any, ...]]) -> list[tuple[Submission, bool]]:
    """The signed transactions, each with whether it starts a new batch."""
    sent = [0] * (len(KEYS) + 1)  # transactions built so far per sender
    out: list[tuple[Submission, bool]] = []
    for op in ops:
        kind, starts = op[0], op[-1]
        if kind == "resend":
            if out:
                out.append((out[op[1] % len(out)][0], starts))  # the same bytes again
            continue
        if kind == "deposit":
            sender, to, amount, slip = TREASURY, KEYS[op[1]].address, op[2], op[3]
            tx_type = encoding.DEPOSIT
        elif kind == "transfer":
            sender, to, amount, slip = op[1], KEYS[op[2]].address, op[3], op[4]
            tx_type = encoding.TRANSFER
        else:
            sender, to, amount, slip = op[1], KEYS[op[1]].address, 0, op[2]
            tx_type = encoding.REGISTER_WORKER
        nonce = max(sent[sender] + slip, 0)
        sent[sender] += 1
        out.append((signed(_pair(sender), tx_type, to, amount, nonce, {}), starts))
    return out


def _batches(subs: list[tuple[Submission, bool]]) -> list[list[Submission]]:
    batches: list[list[Submission]] = []
    for sub, starts in subs:
        if starts or not batches:
            batches.append([])
        batches[-1].append(sub)
    return batches


def _outcome(verdicts: list[tuple[str, str]]) -> dict[str, Any]:
    """What admission left, then what sealing it gives; the chain must verify."""
    accounts = list(
        Account.objects.order_by("address").values_list("address", "kind", "public_key", "available", "next_nonce")
    )
    stored = list(Transaction.objects.order_by("id").values_list("hash", "status", "reason"))
    blocks = seal_all()
    summary = verify_chain()  # raises Divergence at the first disagreement
    assert summary.pending == 0
    return {
        "verdicts": verdicts,
        "accounts": accounts,
        "stored": stored,
        "blocks": [(b.tx_count, b.tx_root, b.state_root) for b in blocks],
        "sealed": list(Account.objects.order_by("address").values_list("address", "balance", "nonce")),
        "summary": (summary.transactions, summary.accounts, summary.total_balance, summary.deposits),
    }


def _admitted(subs: list[tuple[Submission, bool]], batched: bool) -> dict[str, Any]:
    """Admit the transactions, in their batches or one at a time, seal them, and roll
    it all back once the outcome is read."""
    with transaction.atomic():
        if batched:
            rows = [row for batch in admit_batches(_batches(subs)) for row in batch]
        else:
            rows = [admit([sub])[0] for sub, _ in subs]
        outcome = _outcome([(r.status, r.reason) for r in rows])
        transaction.set_rollback(True)
    return outcome


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(operation, min_size=1, max_size=14))
def test_a_batch_admits_exactly_what_one_at_a_time_admits(db: Any, ops: list[tuple[Any, ...]]) -> None:
    ensure_genesis()
    subs = _submissions(ops)
    one_by_one = _admitted(subs, batched=False)
    assert _admitted(subs, batched=True) == one_by_one


def test_the_property_sees_new_accounts_overdrafts_and_bad_nonces(db: Any) -> None:
    """The sequence the property test is about, spelled out: it exercises every case
    named there, so the comparison above is not comparing two empty outcomes."""
    ensure_genesis()
    ops: list[tuple[Any, ...]] = [
        ("deposit", 0, CREDIT, 0, False),  # opens key 0
        ("transfer", 0, 1, 5, 0, False),  # opens key 1, in the same batch
        ("transfer", 1, 2, CREDIT, 0, False),  # key 1 overdraws; key 2 opened all the same
        ("transfer", 0, 2, 1, 1, True),  # a nonce too far ahead
        ("transfer", 3, 0, 1, 0, False),  # key 3 has no account
        ("resend", 1, False),  # a duplicate
        ("register", 3, -1, False),  # key 3 opens its own account (its refused one took no nonce)
    ]
    subs = _submissions(ops)
    batched = _admitted(subs, batched=True)
    assert [r for _, r in batched["verdicts"]] == [
        "",
        "",
        "insufficient_funds",
        "bad_nonce",
        "unknown_sender",
        "duplicate",
        "",
    ]
    opened = {a for a, *_ in batched["accounts"]}
    assert {k.address for k in KEYS} <= opened
    assert batched == _admitted(subs, batched=False)
