"""Gas per transaction type: the one table. fee = gas_limit × gas_price, paid by the sender.

Types the platform sends on someone's behalf (deposits, escrow moves, rejections,
reversals of refunded payments) cost
no gas, so a requester who deposits N credits can lock exactly N. A worker pays for its
SUBMIT_RESULT out of the reward that settlement releases to it first.
"""

from __future__ import annotations

from protocol import encoding

GAS: dict[str, int] = {
    encoding.DEPOSIT: 0,
    encoding.TRANSFER: 21_000,
    encoding.ESCROW_LOCK: 0,
    encoding.ESCROW_RELEASE: 0,
    encoding.FEE: 0,
    encoding.REGISTER_WORKER: 0,
    encoding.SUBMIT_RESULT: 80_000,
    encoding.REJECT_RESULT: 0,
    encoding.PAYOUT: 21_000,
    encoding.REVERSAL: 0,
}


def gas_limit(tx_type: str) -> int:
    return GAS[tx_type]


def fee_for(tx_type: str, gas_price: int) -> int:
    return GAS[tx_type] * gas_price
