"""Celery tasks of the marketplace app, on the trusted ``platform`` queue."""

from __future__ import annotations

from celery import shared_task

from marketplace import dataset_uploads


@shared_task(name="marketplace.expire_dataset_uploads", ignore_result=True)
def expire_dataset_uploads() -> int:
    """Periodic (beat): delete unfinished dataset uploads past their expiry, bytes and all.
    Running it twice is harmless: the second run finds nothing expired."""
    return dataset_uploads.expire_dataset_uploads()
