"""A node's terms per kind it offers, as the provider's page and the API show them: its
own ask or the reference one, and what it is paid for the kind's default-spec job."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import transaction
from rest_framework import serializers

from marketplace import pricing
from marketplace.kinds import KINDS
from workers.market.asks import ask_for, asks_of, set_ask
from workers.models import Worker


def default_job_tflop(kind: str) -> float:
    """The work of the kind's default-spec job, the job its pages price asks at. A kind
    whose spec has a required field (an inference kind names its model) is measured on
    the defaults it has."""
    plugin = KINDS[kind]
    try:
        spec = plugin.validate_spec({})
    except serializers.ValidationError:
        fields = plugin.spec_serializer().fields
        spec = {name: f.default for name, f in fields.items() if f.default is not serializers.empty}
    return plugin.tflop(spec)


def offered_kinds(worker: Worker) -> list[str]:
    """The kinds the node reported it runs, in the platform's order (unknown ones left out)."""
    caps: Any = worker.capabilities
    offered = caps.get("kinds") if isinstance(caps, dict) else None
    if not isinstance(offered, list):
        return []
    return [kind for kind in KINDS if kind in offered]


@dataclass(frozen=True)
class KindAsk:
    """A node's ask for one kind it offers, priced for the kind's default-spec job."""

    kind: str
    label: str
    ask: pricing.Ask
    own: bool  # False: the node set none, and asks the platform's reference rate
    tflop: float
    pays: int  # what the node is paid for the default-spec job
    charge: int  # what a requester pays for it, the platform's fee included
    floor: int  # the least a minimum may be

    @property
    def reference(self) -> bool:
        return not self.own


def kind_asks(worker: Worker) -> list[KindAsk]:
    """The node's ask for each kind it offers."""
    own = asks_of([worker.pk]).get(worker.pk, {})
    floor = pricing.floor_price()
    rows = []
    for kind in offered_kinds(worker):
        ask = ask_for(own, kind)
        tflop = default_job_tflop(kind)
        pays = ask.price(tflop)
        rows.append(
            KindAsk(
                kind=kind,
                label=KINDS[kind].label,
                ask=ask,
                own=kind in own,
                tflop=tflop,
                pays=pays,
                charge=pricing.charge(pays),
                floor=floor,
            )
        )
    return rows


def set_asks(worker: Worker, asks: list[dict[str, Any]]) -> None:
    """Set several of the node's asks at once (``kind``, ``per_tflop``, ``minimum`` each, in
    base units): all or none. A refusal names the field, and the kind in its message."""
    with transaction.atomic():
        for item in asks:
            try:
                set_ask(worker, item["kind"], item["per_tflop"], item["minimum"])
            except serializers.ValidationError as exc:
                detail = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
                raise serializers.ValidationError(
                    {
                        field: [f"{item['kind']}: {message}" for message in messages]
                        for field, messages in detail.items()
                    }
                ) from None
