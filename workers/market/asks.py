"""Providers' asks: what each node takes per kind (``workers.models.Ask``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from uuid import UUID

from django.db import transaction
from rest_framework.exceptions import ValidationError

from ledger.units import format_credits
from marketplace import pricing
from marketplace.kinds import KINDS
from workers.models import Ask, Worker


def asks_of(worker_ids: Iterable[UUID]) -> dict[UUID, dict[str, pricing.Ask]]:
    """The asks the given nodes set, by node and kind (a kind missing: the reference ask)."""
    out: dict[UUID, dict[str, pricing.Ask]] = {}
    rows = Ask.objects.filter(worker_id__in=list(worker_ids)).values_list("worker_id", "kind", "per_tflop", "minimum")
    for worker_id, kind, per_tflop, minimum in rows:
        out.setdefault(worker_id, {})[kind] = pricing.Ask(per_tflop, minimum)
    return out


def ask_for(asks: dict[str, pricing.Ask] | None, kind: str) -> pricing.Ask:
    """A node's ask for ``kind``, from its asks by kind: its own, or the reference ask."""
    own = (asks or {}).get(kind)
    return own if own is not None else pricing.reference_ask()


def set_ask(worker: Worker, kind: Any, per_tflop: Any, minimum: Any) -> Ask:
    """Set the node's ask for ``kind`` (amounts in base units, already parsed). A 400 names
    the field: a kind the node does not offer, a minimum under the floor price."""
    if kind not in KINDS:
        raise ValidationError({"kind": [f"No kind {kind!r}; see /api/v1/kinds/."]})
    caps = worker.capabilities if isinstance(worker.capabilities, dict) else {}
    offered = caps.get("kinds")
    if not isinstance(offered, list) or kind not in offered:
        raise ValidationError({"kind": [f"This node does not offer {KINDS[kind].label} tasks."]})
    if type(per_tflop) is not int or per_tflop < 0:
        raise ValidationError({"per_tflop": ["A price per TFLOP is a number of credits, 0 or more."]})
    floor = pricing.floor_price()
    if type(minimum) is not int or minimum < floor:
        raise ValidationError({"minimum": [f"The least a node may take for a job is {format_credits(floor)} credits."]})
    with transaction.atomic():
        ask, _ = Ask.objects.update_or_create(
            worker=worker, kind=kind, defaults={"per_tflop": per_tflop, "minimum": minimum}
        )
    return ask


def clear_ask(worker: Worker, kind: str) -> bool:
    """Back to the reference ask for ``kind``; whether the node had one of its own."""
    deleted, _ = Ask.objects.filter(worker=worker, kind=kind).delete()
    return bool(deleted)
