"""The node's log lines while a job runs, streamed to the task page's log.

``streaming(reporter, assignment_id, secrets)`` attaches a handler to the root logger for
the job's duration: records of the trainers (``training.*``), the agent (``workers.agent``,
but not its socket's own ``workers.agent.reporter``) and Python warnings, at INFO and
above, go to the reporter as lines of that job. Every line is redacted first (the node's
token, the broker URL and its password, and anything shaped like a worker token or a URL
with credentials), cut to ``LINE_CHARS``, and admitted at most ``RATE`` a second with a
burst of ``BURST``; what is dropped is counted in the next line that goes out.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Protocol

LINE_CHARS = 300
RATE = 5.0  # lines a second, sustained
BURST = 30
STREAMED = ("training", "workers.agent", "py.warnings")
NOT_STREAMED = ("workers.agent.reporter",)
_TOKEN = re.compile(r"pw[wrk]_[A-Za-z0-9_\-]{8,}")
_URL_CREDENTIALS = re.compile(r"([a-zA-Z][a-zA-Z0-9+.\-]*://)[^/\s@]+@")


class LineSink(Protocol):
    def log(self, assignment_id: str, *lines: str) -> None: ...


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each secret, worker-token-shaped string and URL credential replaced."""
    for secret in sorted((s for s in secrets if s and len(s) >= 4), key=len, reverse=True):
        text = text.replace(secret, "[redacted]")
    text = _TOKEN.sub("[redacted]", text)
    return _URL_CREDENTIALS.sub(r"\1[redacted]@", text)


class JobLogHandler(logging.Handler):
    """Sends the job's log records to the platform, redacted, bounded and rate-limited."""

    def __init__(self, sink: LineSink, assignment_id: str, secrets: Iterable[str]) -> None:
        super().__init__(logging.INFO)
        self.sink = sink
        self.assignment_id = assignment_id
        self.secrets = [s for s in secrets if s]
        self.tokens = float(BURST)
        self.last = time.monotonic()
        self.dropped = 0
        self.guard = threading.Lock()

    def streamed(self, name: str) -> bool:
        named = any(name == n or name.startswith(n + ".") for n in STREAMED)
        return named and not any(name == n or name.startswith(n + ".") for n in NOT_STREAMED)

    def emit(self, record: logging.LogRecord) -> None:
        if not self.streamed(record.name):
            return
        try:
            text = record.getMessage()
        except Exception:  # a bad format string in someone's log call is not worth a job
            text = str(record.msg)
        prefix = "" if record.levelno == logging.INFO else f"{record.levelname.lower()}: "
        line = redact(" ".join(f"{prefix}{text}".split()), self.secrets)[:LINE_CHARS]
        with self.guard:
            now = time.monotonic()
            self.tokens = min(float(BURST), self.tokens + (now - self.last) * RATE)
            self.last = now
            if self.tokens < 1.0:
                self.dropped += 1
                return
            self.tokens -= 1.0
            lines = [line]
            if self.dropped:
                lines.insert(0, f"({self.dropped} log lines not sent: over {RATE:.0f} a second)")
                self.dropped = 0
        self.sink.log(self.assignment_id, *lines)


@contextmanager
def streaming(sink: LineSink, assignment_id: str, secrets: Iterable[str]) -> Iterator[JobLogHandler]:
    """Stream the job's log lines for the block (see the module docstring)."""
    handler = JobLogHandler(sink, assignment_id, secrets)
    root = logging.getLogger()
    lowered = root.level > logging.INFO
    saved = root.level
    if lowered:
        root.setLevel(logging.INFO)
    logging.captureWarnings(True)
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        logging.captureWarnings(False)
        if lowered:
            root.setLevel(saved)


__all__ = ["JobLogHandler", "redact", "streaming"]
