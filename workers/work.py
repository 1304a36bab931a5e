"""The workers app's answers to the marketplace's questions about a task's work
(``marketplace.work.TaskWork``), installed from ``WorkersConfig.ready()``: those about its
jobs from ``assignments.work``, its verdict from ``verification.report``."""

from __future__ import annotations

from workers.assignments.work import (
    expected_run,
    expected_wait,
    ledger_trail,
    live_state,
    result_file,
    result_files,
    start_times,
    survey,
)
from workers.verification.report import verdict

__all__ = [
    "expected_run",
    "expected_wait",
    "ledger_trail",
    "live_state",
    "result_file",
    "result_files",
    "start_times",
    "survey",
    "verdict",
]
