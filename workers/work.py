"""The workers app's answers to the marketplace's questions about a task's work
(``marketplace.work.TaskWork``), installed from ``WorkersConfig.ready()``: those about its
jobs from ``assignments.work`` (every name in its ``__all__``), its verdict from
``verification.report``."""

from __future__ import annotations

from workers.assignments.work import *  # noqa: F403 (the answers about a task's jobs, by its __all__)
from workers.verification.report import verdict as verdict
