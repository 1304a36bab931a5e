"""A task's verdict as its page shows it: which result decided, whether it passed or fell
short, the bars its verifier applied with the numbers it measured, and why, in words."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from marketplace.models import Task, TaskStatus
from workers.models import UNSETTLED, Assignment, Shortfall
from workers.verification.base import checks

PASSED, SHORT, REJECTED = "passed", "short", "rejected"
_LABELS = {PASSED: "Passed", SHORT: "Fell short of the bar", REJECTED: "Rejected"}


def verdict(task: Task) -> dict[str, Any] | None:
    """The verdict on the task's deciding result, or None while no result was judged.

    The deciding result is the task's latest accepted one once it completed, else its latest
    judged (accepted or rejected) one. ``checks`` are the quality bars its verifier applied
    (``base.checks``: none for kinds judged by recomputation alone, whose reason says it
    all); ``short`` and ``rejected`` count the task's results that fell short of the bar or
    were refused for another reason (``history`` says both in words); ``waiting`` is true when the task is open again with
    no worker on it after such a result."""
    judged = Assignment.objects.filter(
        task=task, state__in=(Assignment.State.ACCEPTED, Assignment.State.REJECTED)
    ).select_related("worker")
    if task.status == TaskStatus.COMPLETED:
        judged = judged.filter(state=Assignment.State.ACCEPTED)
    deciding = judged.order_by("-settled_at").first()
    if deciding is None:
        return None
    rejected = Assignment.objects.filter(task=task, state=Assignment.State.REJECTED)
    short = rejected.exclude(shortfall=Shortfall.NONE).count()
    if deciding.state == Assignment.State.ACCEPTED:
        outcome = PASSED
    elif deciding.shortfall != Shortfall.NONE:
        outcome = SHORT
    else:
        outcome = REJECTED
    bars = checks(task.kind, deciding.metrics)
    if outcome == PASSED:
        words = " ".join(c.words[:1].upper() + c.words[1:] for c in bars) or "The platform's check of the result held."
    else:
        words = deciding.reason or "The result was rejected."
    live = Assignment.objects.filter(task=task, state__in=UNSETTLED).exists()
    others = rejected.count() - short
    return {
        "outcome": outcome,
        "label": _LABELS[outcome],
        "worker": deciding.worker.name,
        "settled_at": deciding.settled_at,
        "words": words,
        "checks": [asdict(c) for c in bars],
        "short": short,
        "rejected": others,
        "history": _history(short, others),
        "waiting": task.status == TaskStatus.OPEN and outcome != PASSED and not live,
    }


def _history(short: int, others: int) -> str:
    """The task's refused results in words: "1 result fell short", "2 results fell short and
    1 was rejected"; "" when there is none."""
    parts = []
    if short:
        parts.append(f"{short} result{'s' if short != 1 else ''} fell short")
    if others:
        verb = "was" if others == 1 else "were"
        parts.append(
            f"{others} {verb} rejected" if short else f"{others} result{'s' if others != 1 else ''} {verb} rejected"
        )
    return " and ".join(parts)
