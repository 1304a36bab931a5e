"""``/ws/worker/``: a provider node's live channel (heartbeats, progress, log lines).

The node authenticates with its worker token (``Authorization: Worker pww_…``) on
connect. Progress and log lines are accepted only for the node's own running
assignments, and every number in them is bounded before use. What reaches the database
and the browsers is rate-limited per assignment, whichever of the node's sockets sent it
(see ``workers.api.socket_limits``):

- progress is fanned out to the task's group (which the owner's browser follows on
  ``/ws/tasks/<id>/``) at most every ``FANOUT_INTERVAL``, coalesced to the latest event;
  an isolated event goes out at once;
- progress is written at most once per ``PERSIST_INTERVAL`` per assignment, plus once for
  the last step; the row's ``last_progress_at`` holds the interval across web processes;
- log lines are fanned out like progress and buffered, then written at most once per
  ``LOG_FLUSH_INTERVAL`` and when the socket closes, to the job's log
  (``workers.live.log``: the newest ``LOG_KEEP`` lines of ``LOG_LINE_CHARS`` are kept).

A node sending more than ``MESSAGE_RATE`` messages a second, sustained (a burst of
``MESSAGE_BURST`` is allowed), has the socket that went over closed with 4429: honest
nodes send a few a second. The budget is the node's, shared by all its sockets in this
process, and a node holds at most ``MAX_SOCKETS`` of them here (one is normal; a
reconnect may overlap the old one for a moment): a newer one closes the oldest with 4429
(see ``workers.api.socket_limits.Openings``). Both limits are per web process, so N processes allow
N times as much.

The platform controls the node's running job over the same socket (``workers.assignments.control``):
when one of its live jobs ends without it (cancelled, failed, expired, the worker
suspended or retired) the node gets ``{"type": "stop", "assignment_id", "reason"}``. The
node's next heartbeat (which names the job it runs), progress or log line about such an
ended job is answered with the same ``stop``, so a stop sent while its socket was down is
not lost; its ``{"type": "stopped", "assignment_id"}`` puts "stopped by the platform:
<reason>" on the job's log, in the platform's words, once.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
import unicodedata
from datetime import timedelta
from typing import Any, TypeGuard

from channels.db import database_sync_to_async
from channels.exceptions import ChannelFull
from django.db import transaction
from django.utils import timezone

from config.api.parsers import text_error
from marketplace.consumers import LiveConsumer
from marketplace.events import DashboardTaskEvent, dashboard_group, task_group
from marketplace.lifecycle import lock_task
from marketplace.models import Task, TaskStatus
from workers.api.socket_limits import Allowance, Coalescer, Openings, Throttle, WriteBuffer
from workers.assignments.control import ended_by_platform
from workers.identity.authentication import token_from_header
from workers.identity.services import authenticate_worker
from workers.live import log as job_log
from workers.live.dashboard import worker_changed
from workers.live.events import worker_group
from workers.live.log import LOG_LINE_CHARS, LOG_TAIL
from workers.models import Assignment, Worker

PERSIST_INTERVAL = 1.0  # seconds between progress writes per assignment
FANOUT_INTERVAL = 0.1  # seconds between events of one type per assignment to its browsers
LOG_FLUSH_INTERVAL = 1.0  # seconds between log writes per assignment
HISTORY_LIMIT = 500  # points kept per assignment for charts
LOG_LINES = LOG_TAIL  # lines one browser event carries (the job's row keeps as many)
LOG_BATCH = 50  # lines one message may add
# Lines held per job between two writes: an honest node sends a few a second; past this
# (a flood within one LOG_FLUSH_INTERVAL) the oldest held lines are dropped.
LOG_BUFFER = 1_000
HEARTBEAT_WRITE_INTERVAL = timedelta(seconds=5)
MAX_METRICS = 32
MAX_EXACT = 2**53  # the largest integer every JSON reader (and a float) holds exactly
# A metric's bound: any two such values differ by a finite float, so the task page's chart
# can scale between them (±1.7e308 and ∓1.7e308 span an infinite range and draw nothing).
MAX_METRIC = 1e300
# A chart point's own keys (``_persist``): a metric of that name would overwrite them.
RESERVED_METRICS = frozenset({"t", "step"})
# The node's last progress point travels on this socket while its result goes over HTTP,
# so it may arrive just after the result: a submitted job still takes its reports.
REPORTABLE = (Assignment.State.OFFERED, Assignment.State.RUNNING, Assignment.State.SUBMITTED)
MESSAGE_RATE = 50.0  # per second, sustained, per worker (all its sockets in this process)
MESSAGE_BURST = 250
MAX_SOCKETS = 4  # open at once per worker in this process
STOPPED_LINE = "stopped by the platform: {reason}"
# The platform's own line: a node's log line may not begin like it (see ``_log``).
PLATFORM_PREFIX = STOPPED_LINE.split("{", 1)[0]


def platform_words(line: str) -> str | None:
    """Why a node's log line would read as the platform's own, or None.

    The page keeps a line's breaks (``white-space: pre-wrap``) and ``log.txt`` writes one
    stored line a line, so a line holding a break could start a forged line below it.
    Where a line starts is judged as a reader sees it: invisible characters (format,
    control, combining) and spaces dropped, full-width and other compatibility forms folded
    (NFKC), case ignored. Look-alike letters of other scripts still pass."""
    if line.splitlines() not in ([], [line]):
        return "log lines may not hold line breaks; send each line on its own."
    folded = unicodedata.normalize("NFKC", line)
    shown = "".join(c for c in folded if unicodedata.category(c)[0] not in "CM").lstrip().casefold()
    for prefix in (PLATFORM_PREFIX, job_log.HEADER_MARK):
        if shown.startswith(prefix):
            return f"log lines may not begin with {prefix!r}."
    return None


def number(value: Any, low: float = -math.inf, high: float = math.inf) -> float | None:
    """``value`` as a float if it is a finite JSON number within [low, high], else None.

    Bools are not numbers here, and ints must be within ±2**53: a larger one is not held
    exactly by a float (or by JavaScript), and past ~1.8e308 ``float()`` raises.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int) and abs(value) > MAX_EXACT:
        return None
    result = float(value)
    return result if math.isfinite(result) and low <= result <= high else None


def is_count(value: Any) -> TypeGuard[int]:
    """An int (not a bool) in [0, 2**53]."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_EXACT


def percent(step: int, total: int) -> float:
    """Percent done, 100.0 only at the last step: 99,996 of 100,000 is not shown as done,
    and the stored 100.0 marks that the last step was written (see ``_persist``)."""
    return 100.0 if step >= total else min(round(100.0 * step / total, 2), 99.99)


def clean_metrics(raw: Any) -> dict[str, float] | None:
    """Metrics as at most 32 named numbers within ±1e300; None when anything else was sent
    (or a name a history point uses itself, ``t`` or ``step``).

    Refusing the whole event (rather than dropping bad values) keeps a buggy runner
    visible to its operator instead of charting a silently partial series.
    """
    if raw is None:
        return {}
    if not isinstance(raw, dict) or len(raw) > MAX_METRICS:
        return None
    out = {}
    for key, value in raw.items():
        cleaned = number(value, -MAX_METRIC, MAX_METRIC)
        named = isinstance(key, str) and 0 < len(key) <= 64 and key not in RESERVED_METRICS
        if not (named and text_error(key) is None and cleaned is not None):
            return None
        out[key] = cleaned
    return out


def progress_error(content: dict[str, Any]) -> str | None:
    """Why the numbers of a progress message are refused, or None when they are all sound."""
    step, total = content.get("step"), content.get("total")
    if not (is_count(step) and is_count(total) and step <= total and total > 0):
        return "progress needs integers 0 ≤ step ≤ total ≤ 2**53, total > 0."
    if clean_metrics(content.get("metrics")) is None:
        return "metrics must map at most 32 names (not t or step) to numbers within ±1e300 (integers within ±2**53)."
    if content.get("eta") is not None and number(content["eta"], 0, MAX_EXACT) is None:
        return "eta must be a number of seconds between 0 and 2**53, or null."
    if content.get("sent_at") is not None and number(content["sent_at"], 0, MAX_EXACT) is None:
        return "sent_at must be a Unix time in seconds between 0 and 2**53, or null."
    return None


def _merge(held: dict[str, Any], newer: dict[str, Any]) -> dict[str, Any]:
    """A newer progress event replaces a held one; held log lines are sent with the newer."""
    if newer["type"] == "task.log":
        return {**newer, "lines": (held["lines"] + newer["lines"])[-LOG_LINES:]}
    return newer


def append_log(assignment_id: str, lines: list[str]) -> None:
    """Store lines of the job's log (``workers.live.log.append``)."""
    job_log.append(assignment_id, lines)


def append_log_once(assignment_id: str, line: str) -> bool:
    """Store ``line`` on the job's log unless its tail holds it already; True when it was added."""
    return job_log.append(assignment_id, [line], once=True)


# Process-wide: every socket of this process shares them (see workers.api.socket_limits).
fanout = Coalescer(_merge)
progress_writes = Throttle()
log_writes = WriteBuffer(database_sync_to_async(append_log), limit=LOG_BUFFER)
message_budget = Allowance()
open_sockets = Openings()


class WorkerConsumer(LiveConsumer):
    worker_id: Any = None  # set once the socket is accepted as one of the worker's
    _flooded = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """The socket's whole life: its place under ``MAX_SOCKETS`` is given back however it
        ends, a crash included (``disconnect`` does not run when a handler raises)."""
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self.worker_id is not None:
                open_sockets.close(self.worker_id, self.channel_name)

    async def connect(self) -> None:
        headers = dict(self.scope.get("headers") or [])
        raw = token_from_header(headers.get(b"authorization", b""))
        worker = await database_sync_to_async(authenticate_worker)(raw) if raw else None
        if worker is None:
            await self.refuse(4401)
            return
        self.worker_id = worker.pk
        for oldest in open_sockets.open(worker.pk, self.channel_name, MAX_SOCKETS):
            # Its inbox may be full (it is stuck): it is no longer counted either way.
            with contextlib.suppress(ChannelFull):
                await self.channel_layer.send(oldest, {"type": "worker.displaced"})
        self._logged: set[str] = set()  # assignments whose buffered lines to write on close
        await self.channel_layer.group_add(worker_group(worker.pk), self.channel_name)
        # Checked again now that the socket is in the group: a suspension (or retirement, or
        # the owner's deactivation) committed since the token check sent its close to a group
        # this socket was not in yet, and the node would go on reporting.
        if not await self._usable():
            await self.channel_layer.group_discard(worker_group(worker.pk), self.channel_name)
            await self.refuse(4401)
            return
        await self.accept()
        await self._heartbeat()
        await database_sync_to_async(worker_changed)(worker.pk)  # the owner's dashboard: online

    async def disconnect(self, code: int) -> None:
        if self.worker_id is not None:
            await self.channel_layer.group_discard(worker_group(self.worker_id), self.channel_name)
            for key in self._logged:
                await log_writes.flush(key)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        """Budget first, then decode: neither a flood nor an undecodable frame (bad JSON, a
        5,000-digit number, nesting past the recursion limit) costs more than a reply."""
        if self._flooded or self.refused or self.worker_id is None:
            return  # closing (flooded, or refused at connect): what was queued is not worth reading
        if not message_budget.take(self.worker_id, MESSAGE_RATE, MESSAGE_BURST):
            self._flooded = True
            await self.close(code=4429, reason=f"Too many messages: over {MESSAGE_RATE:.0f} a second, sustained.")
            return
        try:
            content = json.loads(text_data) if text_data is not None else None
        except (ValueError, RecursionError):
            content = None
        if not isinstance(content, dict):
            await self.send_json({"type": "error", "detail": "Each message must be one JSON object, as text."})
            return
        await self.receive_json(content, **kwargs)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        kind = content.get("type") if isinstance(content, dict) else None
        if kind == "heartbeat":
            if not await self._heartbeat():
                await self.close(code=4403)
            elif content.get("assignment_id") is not None:
                await self._stop_if_ended(await self._own(content["assignment_id"]))
        elif kind == "stopped":
            await self._stopped(content)
        elif kind == "progress":
            await self._progress(content)
        elif kind == "log":
            await self._log(content)
        else:
            await self.send_json({"type": "error", "detail": "Unknown message type."})

    async def worker_close(self, event: dict[str, Any]) -> None:
        """Sent by the platform when the worker is suspended or retired."""
        await self.close(code=4403)

    async def worker_stop(self, event: dict[str, Any]) -> None:
        """Sent by the platform when one of this worker's live jobs ended without it
        (``workers.assignments.control.send_stop``): only this worker's sockets are in its group."""
        await self.send_json({"type": "stop", "assignment_id": event["assignment_id"], "reason": event["reason"]})

    async def worker_displaced(self, event: dict[str, Any]) -> None:
        """Sent by a newer socket of the same worker that took this one's place."""
        await self.close(code=4429, reason=f"Too many open sockets: over {MAX_SOCKETS}, the oldest is closed.")

    @database_sync_to_async
    def _usable(self) -> bool:
        return Worker.objects.usable().filter(pk=self.worker_id).exists()

    @database_sync_to_async
    def _heartbeat(self) -> bool:
        now = timezone.now()
        mine = Worker.objects.usable().filter(pk=self.worker_id)
        mine.filter(last_heartbeat_at__lt=now - HEARTBEAT_WRITE_INTERVAL).update(last_heartbeat_at=now)
        mine.filter(last_heartbeat_at__isnull=True).update(last_heartbeat_at=now)
        return mine.exists()

    @database_sync_to_async
    def _own(self, assignment_id: Any) -> Assignment | None:
        """One of this worker's assignments in any state (its id, task, state and reason), or None."""
        try:
            return (
                Assignment.objects.filter(pk=assignment_id, worker_id=self.worker_id)
                .only("pk", "task_id", "state", "reason")
                .first()
            )
        except (ValueError, TypeError, Exception):  # a malformed id is simply not ours
            return None

    async def _stop_if_ended(self, assignment: Assignment | None) -> bool:
        """Answer ``stop`` when ``assignment`` (this worker's) was ended by the platform."""
        if assignment is None or not ended_by_platform(assignment.state, assignment.reason):
            return False
        await self.send_json({"type": "stop", "assignment_id": str(assignment.pk), "reason": assignment.reason})
        return True

    async def _stopped(self, content: dict[str, Any]) -> None:
        """The node stopped a job the platform ended: the job's log says so, once, with the
        platform's own reason (nothing the node wrote)."""
        assignment = await self._own(content.get("assignment_id"))
        if assignment is None or not ended_by_platform(assignment.state, assignment.reason):
            await self.send_json({"type": "error", "detail": "stopped names one of your jobs the platform ended."})
            return
        line = STOPPED_LINE.format(reason=assignment.reason)[:LOG_LINE_CHARS]
        if not await database_sync_to_async(append_log_once)(str(assignment.pk), line):
            return
        key = str(assignment.pk)
        event = {"type": "task.log", "task_id": str(assignment.task_id), "assignment_id": key, "lines": [line]}
        await fanout.send(self.channel_layer, task_group(assignment.task_id), (key, "task.log"), event, FANOUT_INTERVAL)

    @database_sync_to_async
    def _own_running(self, assignment_id: Any) -> Assignment | None:
        try:
            return (
                Assignment.objects.filter(pk=assignment_id, worker_id=self.worker_id, state__in=REPORTABLE)
                .only("pk", "task_id")  # not the history: it is read once a second, by _persist
                .first()
            )
        except (ValueError, TypeError, Exception):  # a malformed id is simply not ours
            return None

    async def _progress(self, content: dict[str, Any]) -> None:
        assignment = await self._own_running(content.get("assignment_id"))
        if assignment is None and await self._stop_if_ended(await self._own(content.get("assignment_id"))):
            return
        if assignment is None:
            await self.send_json({"type": "error", "detail": "Not one of your running assignments."})
            return
        error = progress_error(content)
        if error is not None:
            await self.send_json({"type": "error", "detail": error})
            return
        step, total = content["step"], content["total"]
        eta, sent_at = content.get("eta"), content.get("sent_at")
        event = {
            "type": "task.progress",
            "task_id": str(assignment.task_id),
            "assignment_id": str(assignment.pk),
            "step": step,
            "total": total,
            "percent": percent(step, total),
            "metrics": clean_metrics(content.get("metrics")),
            "eta": None if eta is None else float(eta),
            "sent_at": None if sent_at is None else float(sent_at),
        }
        key = str(assignment.pk)
        await fanout.send(
            self.channel_layer, task_group(assignment.task_id), (key, "task.progress"), event, FANOUT_INTERVAL
        )
        final = step == total
        if not progress_writes.admit(key, PERSIST_INTERVAL, final=final):
            return
        try:
            stored = await self._persist(assignment, event, final)
        finally:
            progress_writes.done(key)
        if stored is not None:
            summary = DashboardTaskEvent(
                type="dashboard.task",
                task_id=str(assignment.task_id),
                status=stored[1],
                status_label=TaskStatus(stored[1]).label,
                progress=event["percent"],
            )
            await self.channel_layer.group_send(dashboard_group(stored[0]), dict(summary))

    @database_sync_to_async
    def _persist(self, assignment: Assignment, event: dict[str, Any], final: bool) -> tuple[Any, str] | None:
        """Store the progress; return the task's (owner id, status) for the dashboard.

        One transaction with the task and assignment rows locked, so two sockets of one node (a
        reconnect landing on another web process) cannot lose each other's history points.
        Nothing is written if the assignment was settled since ``_own_running``, or if the
        row was written less than ``PERSIST_INTERVAL`` ago (by another process: this one's
        ``progress_writes`` already held its own sockets back), unless this is the last
        step and no last step was written yet (the row's progress is below 100).
        """
        with transaction.atomic():
            # The task row first, then the assignment's (marketplace.lifecycle's lock order), so
            # an expiry or a cancellation at the same moment cannot deadlock with this write.
            task = lock_task(assignment.task_id, "owner", "status")
            row = (
                Assignment.objects.select_for_update()
                .filter(pk=assignment.pk, state__in=REPORTABLE)
                .values("history", "progress", "last_progress_at")
                .first()
            )
            if row is None or task is None:
                return None
            now = timezone.now()
            last = row["last_progress_at"]
            recent = last is not None and now - last < timedelta(seconds=PERSIST_INTERVAL)
            if recent and not (final and row["progress"] < 100.0):
                return None
            history = list(row["history"] or [])
            if history and isinstance(history[-1], dict) and history[-1].get("step", 0) > event["step"]:
                # A lower step than the last one stored: the run started over (a node that
                # restarted runs the redelivered job again). The chart shows this run.
                history = []
            history.append({"t": time.time(), "step": event["step"], **event["metrics"]})
            if len(history) > HISTORY_LIMIT:
                history = history[::2]  # keep the whole run's shape at half the resolution
            Assignment.objects.filter(pk=assignment.pk).update(
                progress=event["percent"], metrics=event["metrics"], history=history, last_progress_at=now
            )
            Task.objects.filter(pk=assignment.task_id).update(progress=event["percent"], metrics=event["metrics"])
            return task.owner_id, task.status

    async def _log(self, content: dict[str, Any]) -> None:
        lines = content.get("lines")
        # A line PostgreSQL cannot store (U+0000, an unpaired surrogate) would fail the
        # buffered write and lose every line batched with it: refused like a non-string.
        sound = isinstance(lines, list) and all(
            isinstance(line, str) and text_error(line) is None for line in lines[:LOG_BATCH]
        )
        assignment = await self._own_running(content.get("assignment_id")) if sound else None
        if assignment is None and await self._stop_if_ended(await self._own(content.get("assignment_id"))):
            return
        if assignment is None or not isinstance(lines, list):
            await self.send_json({"type": "error", "detail": "log needs your assignment_id and a list of strings."})
            return
        # One message adds at most LOG_BATCH lines of LOG_LINE_CHARS; the rest is cut.
        clean = [line[:LOG_LINE_CHARS] for line in lines[:LOG_BATCH]]
        # The platform's stop line is written by the platform alone, once: a node's copy of it
        # would put words in its mouth and keep the real one out (``append_log_once``); nor
        # may a node write log.txt's header naming a job (``platform_words``).
        if forged := next(filter(None, map(platform_words, clean)), None):
            await self.send_json({"type": "error", "detail": forged})
            return
        key = str(assignment.pk)
        # The assignment lets the task page merge these lines with the stored tail it reads
        # later, which may not hold them yet (they are buffered), without losing or repeating any.
        event = {"type": "task.log", "task_id": str(assignment.task_id), "assignment_id": key, "lines": clean}
        await fanout.send(self.channel_layer, task_group(assignment.task_id), (key, "task.log"), event, FANOUT_INTERVAL)
        self._logged.add(key)
        await log_writes.add(key, clean, LOG_FLUSH_INTERVAL)
