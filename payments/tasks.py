"""Celery tasks of payments, on the trusted ``platform`` queue. Each takes an id,
re-reads the row and returns quietly when the work is gone or done."""

from __future__ import annotations

from celery import shared_task

from payments import services
from payments.stripe_client import ProviderError


@shared_task(
    name="payments.send_payout",
    ignore_result=True,
    autoretry_for=(ProviderError,),  # only transient ones reach here: refusals are handled
    retry_backoff=5,
    retry_backoff_max=600,
    retry_jitter=True,
    max_retries=8,
)
def send_payout(payout_id: str) -> str:
    return services.send_payout(payout_id)
