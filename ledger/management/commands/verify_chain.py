"""``manage.py verify_chain``: replay the ledger from genesis; non-zero exit on divergence."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ledger.replay import Divergence, verify_chain
from ledger.units import format_credits


class Command(BaseCommand):
    help = "Replay every block from genesis and check every hash, root, signature and balance."

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            summary = verify_chain()
        except Divergence as exc:
            self.stderr.write(
                f"DIVERGENCE at block height {exc.height if exc.height is not None else '-'}"
                f" tx {exc.tx_hash or '-'} field {exc.field}: {exc.detail}"
            )
            raise CommandError("the chain does not verify", returncode=1) from None
        rate = summary.transactions / summary.seconds if summary.seconds else 0.0
        self.stdout.write(
            f"Chain OK: {summary.blocks} blocks, {summary.transactions} sealed transactions"
            f" ({summary.pending} pending), {summary.accounts} accounts;"
            f" total {format_credits(summary.total_balance)} credits ="
            f" deposits {format_credits(summary.deposits)} − payouts {format_credits(summary.payouts)}"
            f" − reversals {format_credits(summary.reversals)};"
            f" head {summary.head_hash[:16] or '-'}; replayed in {summary.seconds:.2f}s ({rate:,.0f} tx/s)"
        )
