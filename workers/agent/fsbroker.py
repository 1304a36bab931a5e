"""Kombu's filesystem transport (the embedded broker), with message files that appear whole.

The stock transport creates a message file, then locks and writes it; a consumer polling
the same folder does not lock, so it can take the file between the two, read nothing and
die on the empty JSON ("Unrecoverable error: JSONDecodeError", kombu issue #1551). A
platform worker and an agent polling every 0.1 s met that within a minute of ``make run``.
Here a message is written under a hidden temporary name and renamed into place, which is
atomic within one folder, so a consumer sees either no file or the whole message; a file
that still cannot be read (left by an older writer) is skipped with a warning instead of
stopping the worker.

Used by the platform (``CELERY_BROKER_TRANSPORT``) and by the agent when the broker URL
is ``filesystem://``. No Django import: the agent has none.
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from time import monotonic_ns
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

log = logging.getLogger(__name__)

TRANSPORT = "workers.agent.fsbroker:Transport"


class Channel(filesystem.Channel):
    # kombu's own stubs disagree on the name (message / payload); this is filesystem.Channel's.
    def _put(self, queue: str, payload: dict[str, Any], **kwargs: Any) -> None:  # type: ignore[override]
        """Write the message under a name no consumer matches, then rename it into place."""
        # Consumers take files in name order: nanoseconds, zero-padded, keep a producer's
        # messages in the order sent (kombu's milliseconds left ties to the uuid).
        name = f"{monotonic_ns():020d}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        # A leading dot: the consumer matches everything after a name's first dot against
        # "<queue>.msg", and "<ms>_<uuid>.<queue>.msg.tmp" would follow that dot.
        temporary = os.path.join(self.data_folder_out, f".{name}.tmp")
        try:
            with open(temporary, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(temporary, final)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(temporary)  # a full disk must not leave half a message behind
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc

    def _get(self, queue: str, timeout: float | None = None) -> Any:
        while True:
            try:
                return super()._get(queue)
            except ValueError:  # JSONDecodeError; the file was already taken off the queue
                log.warning("skipped an unreadable message file on queue %s", queue)


class Transport(filesystem.Transport):
    Channel = Channel
