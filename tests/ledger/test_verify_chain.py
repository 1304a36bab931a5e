"""verify_chain on a clean chain and on chains tampered with directly in the database."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from ledger.models import Account, Block, Transaction
from tests.ledger.chain import build_chain
from tests.ledger.helpers import CREDIT

pytestmark = pytest.mark.django_db


@pytest.fixture
def chain(assignments: set) -> dict[str, Any]:
    return build_chain(assignments)


def _run() -> str:
    out = io.StringIO()
    call_command("verify_chain", stdout=out)
    return out.getvalue()


def _diverges() -> str:
    err = io.StringIO()
    with pytest.raises(CommandError) as exc:
        call_command("verify_chain", stderr=err)
    assert exc.value.returncode == 1
    return err.getvalue()


def test_a_clean_chain_verifies_with_a_summary(chain: dict[str, Any]) -> None:
    out = _run()
    assert "Chain OK: 4 blocks, 8 sealed transactions (1 pending)" in out
    # 20 + 5 deposited, 2 paid out; the pending deposit is not sealed yet.
    assert "total 23 credits = deposits 25 − payouts 2" in out


def test_changing_an_amount_is_detected(chain: dict[str, Any]) -> None:
    tx = Transaction.objects.get(reference=f"reward:{chain['task']}")
    Transaction.objects.filter(pk=tx.pk).update(amount=tx.amount + 1)
    err = _diverges()
    assert f"block height {tx.block.height} tx {tx.hash} field hash" in err  # type: ignore[union-attr]


def test_changing_a_payload_is_detected(chain: dict[str, Any]) -> None:
    tx = Transaction.objects.get(hash=chain["result_hash"])
    payload = tx.payload
    payload["compute_result"]["result_hash"] = "cd" * 32
    Transaction.objects.filter(pk=tx.pk).update(payload=payload)
    assert f"tx {tx.hash} field hash" in _diverges()


def test_rehashing_a_forged_transaction_still_fails_on_its_signature(chain: dict[str, Any]) -> None:
    tx = Transaction.objects.get(reference="d-bob")
    forged = tx.as_tx().__class__(**{**tx.as_tx().__dict__, "amount": 500 * CREDIT})
    Transaction.objects.filter(pk=tx.pk).update(amount=forged.amount, hash=forged.hash().hex())
    assert f"tx {forged.hash().hex()} field signature" in _diverges()


def test_changing_a_signature_is_detected(chain: dict[str, Any]) -> None:
    a, b = Transaction.objects.filter(block__height=1).order_by("index_in_block")[:2]
    Transaction.objects.filter(pk=a.pk).update(signature=b.signature)
    assert f"block height 1 tx {a.hash} field signature" in _diverges()


@pytest.mark.parametrize(
    ("field", "value", "reported"),
    [
        ("state_root", "00" * 32, "state_root"),
        ("tx_root", "11" * 32, "tx_root"),
        ("compute_root", "22" * 32, "compute_root"),
        ("tx_count", 99, "tx_count"),
        ("gas_used", 1, "gas_used"),
        ("prev_hash", "33" * 32, "prev_hash"),
        ("signature", "44" * 64, "signature"),
    ],
)
def test_changing_a_header_field_is_detected(chain: dict[str, Any], field: str, value: Any, reported: str) -> None:
    Block.objects.filter(height=2).update(**{field: value})
    assert f"block height 2 tx - field {reported}" in _diverges()


def test_changing_a_timestamp_breaks_the_block_hash(chain: dict[str, Any]) -> None:
    block = Block.objects.get(height=2)
    Block.objects.filter(pk=block.pk).update(
        timestamp=block.timestamp.replace(microsecond=(block.timestamp.microsecond + 1) % 10**6)
    )
    assert "block height 2 tx - field hash" in _diverges()


def test_changing_a_balance_is_detected(chain: dict[str, Any]) -> None:
    Account.objects.filter(user=chain["alice"]).update(balance=10**15, available=10**15)
    assert "field balance" in _diverges()


def test_removing_a_transaction_from_a_block_is_detected(chain: dict[str, Any]) -> None:
    tx = Transaction.objects.filter(block__height=3).order_by("-index_in_block").first()
    assert tx is not None
    Transaction.objects.filter(pk=tx.pk).update(block=None, index_in_block=None, status="refused")
    assert "block height 3 tx - field tx_count" in _diverges()


def test_an_empty_chain_verifies(db: Any) -> None:
    assert "Chain OK: 0 blocks" in _run()


@pytest.mark.parametrize(
    ("height", "field"),
    [(2, "signature"), (0, "prev_hash"), (0, "state_root"), (0, "signature")],
)
def test_a_header_field_that_is_not_hex_is_a_divergence(chain: dict[str, Any], height: int, field: str) -> None:
    """Garbage in a column is reported like any other tampering, naming the field, not
    a traceback."""
    Block.objects.filter(height=height).update(**{field: "zz" * (64 if field == "signature" else 32)})
    assert f"block height {height} tx - field {field}" in _diverges()


def test_a_public_key_that_is_not_hex_is_a_divergence(chain: dict[str, Any]) -> None:
    tx = Transaction.objects.get(hash=chain["result_hash"])
    Transaction.objects.filter(pk=tx.pk).update(public_key="zz" * 32)
    assert f"block height 2 tx {tx.hash} field public_key" in _diverges()


def test_raising_the_gas_price_leaves_the_chain_verifying(chain: dict[str, Any], settings: Any) -> None:
    """LEDGER_GAS_PRICE is the least admission accepts from now on; the transactions
    sealed (and pending) at the old price stay valid and must still replay."""
    settings.LEDGER_GAS_PRICE *= 2
    assert "Chain OK: 4 blocks" in _run()
