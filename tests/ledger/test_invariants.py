"""The double-entry invariant under random sequences of operations (hypothesis)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db import transaction
from django.db.models import Sum
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger import services
from ledger.models import Account
from ledger.replay import verify_chain
from ledger.sealer import seal_block
from tests.factories import UserFactory
from tests.ledger.helpers import worker_keys

pytestmark = pytest.mark.django_db

amounts = st.integers(min_value=1, max_value=5_000_000_000)
operation = st.one_of(
    st.tuples(st.just("deposit"), st.integers(0, 2), amounts),
    st.tuples(st.just("lock"), st.integers(0, 2), st.integers(0, 3), amounts),
    st.tuples(st.just("release"), st.integers(0, 3), st.integers(0, 2), amounts),
    st.tuples(st.just("refund"), st.integers(0, 3)),
    st.tuples(st.just("payout"), st.integers(0, 2), amounts),
    st.tuples(st.just("transfer"), st.integers(0, 2), st.integers(0, 2), amounts),
    st.tuples(st.just("seal")),
)


def _total(field: str) -> int:
    return int(Account.objects.aggregate(s=Sum(field))["s"] or 0)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(operation, min_size=1, max_size=20))
def test_sum_of_balances_is_deposits_minus_payouts(db: Any, ops: list[tuple[Any, ...]]) -> None:
    with transaction.atomic():
        users: list[Any] = [UserFactory(username=f"u{i}") for i in range(3)]
        workers = [worker_keys(100 + i).address for i in range(3)]
        tasks = [uuid.uuid4() for _ in range(4)]
        deposited = paid_out = 0
        for n, op in enumerate(ops):
            ref = f"op{n}"
            try:
                if op[0] == "deposit":
                    services.deposit(users[op[1]], op[2], ref)
                    deposited += op[2]
                elif op[0] == "lock":
                    services.lock_escrow(tasks[op[2]], users[op[1]], op[3], ref)
                elif op[0] == "release":
                    services.release_to_worker(tasks[op[1]], workers[op[2]], op[3], ref)
                elif op[0] == "refund":
                    services.refund(tasks[op[1]], ref)
                elif op[0] == "payout":
                    services.payout(users[op[1]], op[2], ref)
                    paid_out += op[2]
                elif op[0] == "transfer":
                    target = services.ensure_user_account(users[op[2]]).address
                    services.transfer(users[op[1]], target, op[3], ref)
                else:
                    seal_block()
            except services.LedgerError:
                pass  # refused: insufficient funds, another owner's task, a self-transfer…
            # Spendable money is conserved at every step, sealed or not.
            assert _total("available") == deposited - paid_out
        seal_block()
        assert _total("balance") == deposited - paid_out
        assert min(Account.objects.values_list("balance", flat=True), default=0) >= 0
        summary = verify_chain()
        assert summary.total_balance == summary.deposits - summary.payouts == deposited - paid_out
        transaction.set_rollback(True)
