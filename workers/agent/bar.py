"""The node's one-line progress bar for the running job."""

from __future__ import annotations

import sys
import time


class Bar:
    """A one-line progress bar on the node's terminal.

    Writes to the process's real stderr (Celery redirects ``sys.stderr`` into its logger,
    which would turn every redraw into a log record). On a terminal it redraws in place
    five times a second; under a process manager or into a log file it prints a plain line
    at most every ``LINE_INTERVAL`` seconds, so a long job does not flood the log.
    """

    LINE_INTERVAL = 10.0

    def __init__(self, label: str) -> None:
        self.label = label
        self.last = 0.0
        self.stream = sys.__stderr__ or sys.stderr
        self.tty = self.stream.isatty()

    def update(self, step: int, total: int, metrics: dict[str, float]) -> None:
        now = time.monotonic()
        if now - self.last < (0.2 if self.tty else self.LINE_INTERVAL) and step < total:
            return
        self.last = now
        filled = int(30 * step / max(total, 1))
        extra = " ".join(f"{k}={v:.4g}" for k, v in list(metrics.items())[:3])
        line = f"{self.label} [{'#' * filled}{'.' * (30 - filled)}] {step}/{total} {extra}"
        self.stream.write(f"\r{line}   " if self.tty else f"{line}\n")
        self.stream.flush()

    def done(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
