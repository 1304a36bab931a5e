"""How long workers' uploads are kept.

- Accepted: as long as the task. They are the requester's deliverable (``result_files``)
  and the synthetic kind's row proofs are read from them.
- Expired: deleted at expiry (``uploads.discard`` from the scheduler and ``jobs.fail``).
- Rejected: kept ``REJECTED_ARTIFACT_RETENTION_DAYS`` after the rejection, for an operator
  to look into it, then deleted here (hourly on beat). Nothing hands a rejected result
  out, so only disk is at stake: a rejected 8192×6 product is 1.6 GB.

The assignment row and its REJECT_RESULT transaction stay; ``artifacts_deleted_at``
records when the files went, so each is deleted once and never looked at again.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from workers.assignments import uploads
from workers.models import Assignment

BATCH = 200


def purge_rejected_artifacts(now: datetime | None = None) -> int:
    """Delete the uploads of up to BATCH results rejected before the retention period,
    oldest first; returns how many. One batch a run: the purge shares the control queue
    with sealing and scheduling, so a backlog (the first run, a shorter retention) is
    worked off an hourly batch at a time instead of holding that queue up."""
    now = now or timezone.now()
    cutoff = now - timedelta(days=settings.REJECTED_ARTIFACT_RETENTION_DAYS)
    due = Assignment.objects.filter(
        state=Assignment.State.REJECTED, settled_at__lt=cutoff, artifacts_deleted_at__isnull=True
    )
    ids = list(due.order_by("settled_at").values_list("pk", flat=True)[:BATCH])
    for pk in ids:
        uploads.discard(pk)  # a missing folder is fine: the node may have uploaded nothing
    return Assignment.objects.filter(pk__in=ids).update(artifacts_deleted_at=now)
