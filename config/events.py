"""The one helper that sends to the channel layer from synchronous code.

Each app keeps its own typed payloads (a ``TypedDict`` with a ``Literal`` ``type`` tag)
and group names next to its code (``marketplace/events.py``, ``ledger/events.py``,
``workers/live/events.py``); every send from a service, a signal or a Celery task goes through
``send_event``. Consumers reply on their own socket's layer.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

log = logging.getLogger(__name__)


def send_event(group: str, payload: Mapping[str, object]) -> None:
    """Fan an event out to a group. Best effort: a broken layer never fails the caller (an
    event is advisory; pages recover their state over REST, nodes at their next message).

    Call it from ``transaction.on_commit`` so nobody sees a change that was rolled back.
    """
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(group, dict(payload))
    except Exception:
        log.exception("could not send %s to %s", payload.get("type"), group)
