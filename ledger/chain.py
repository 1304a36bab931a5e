"""This chain's identity from settings: chain id, treasury, validator, gas price."""

from __future__ import annotations

from django.conf import settings

from ledger import custody
from ledger.rules import ChainContext


def context() -> ChainContext:
    """The ChainContext the rules check against (cheap: keys are derived once per call)."""
    return ChainContext(
        chain_id=settings.LEDGER_CHAIN_ID,
        treasury=custody.treasury_keys().address,
        validator=custody.validator_keys().address,
        min_gas_price=settings.LEDGER_GAS_PRICE,
    )
