"""The node's side of job control: its reporter hands the platform's ``stop`` (and a
refusal of its socket) to the node, names the running job in its heartbeats, and what it
streams of the job's log is redacted, bounded and rate-limited (workers/agent/joblog.py).

The platform is a stand-in WebSocket server on 127.0.0.1 that answers the first
heartbeat naming a job with the messages a test gives it; the real consumer is covered
by test_job_control.py and the real processes by test_job_control_e2e.py.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection

from tests.workers.socket_stand_in import StandInServer, reporters
from tests.workers.test_agent_node import ASSIGNMENT, Platform, clock, node, platform
from training import stop
from workers.agent import joblog, runners
from workers.agent.jobs import Node
from workers.agent.reporter import LOG_BATCH, LOG_QUEUE, Reporter

JOB = "7d8c6a4e-0000-4000-8000-000000000001"
__all__ = ["clock", "node", "platform", "reporters"]  # fixtures, used by name


class Answering(StandInServer):
    """A stand-in platform that sends ``replies`` once a heartbeat names a job, then closes
    with ``close_code`` when one is given; ``received`` holds what the node sent."""

    def __init__(self, replies: list[Any], close_code: int | None = None) -> None:
        super().__init__()
        self.replies = replies
        self.close_code = close_code
        self.received: list[dict[str, Any]] = []

    async def handle(self, connection: ServerConnection) -> None:
        async for raw in connection:
            message = json.loads(raw)
            self.received.append(message)
            if message.get("type") == "heartbeat" and message.get("assignment_id") and self.replies:
                for reply in self.replies:
                    await connection.send(reply if isinstance(reply, str) else json.dumps(reply))
                self.replies = []
                if self.close_code is not None:
                    await connection.close(code=self.close_code)
                    return


def wait(condition: Any, seconds: float = 5.0) -> bool:
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        if condition():
            return True
        time.sleep(0.01)
    return bool(condition())


def test_a_stop_reaches_the_node_and_malformed_ones_are_ignored(reporters: list[Reporter]) -> None:
    stops: list[tuple[str, str]] = []
    replies = [
        "not json",
        [1, 2],
        {"type": "stop", "assignment_id": 7, "reason": "not a string id"},
        {"type": "stop", "assignment_id": JOB},  # no reason
        {"type": "stop", "assignment_id": JOB, "reason": "The requester cancelled the task." + "!" * 1000},
    ]
    with Answering(replies) as platform:
        reporter = Reporter(f"http://127.0.0.1:{platform.port}", "pww_test", heartbeat=0.2)
        reporter.on_stop = lambda aid, reason: stops.append((aid, reason))
        reporter.current = JOB  # the heartbeat names the running job: the platform answers it
        reporters.append(reporter.start())
        assert wait(lambda: stops)
        reporter.stop()
    assert len(stops) == 1
    assert stops[0][0] == JOB
    assert stops[0][1].startswith("The requester cancelled the task.")
    assert len(stops[0][1]) == 300
    assert {"type": "heartbeat", "assignment_id": JOB} in platform.received


@pytest.mark.parametrize("code", [4401, 4403])
def test_a_refused_socket_stops_the_running_job(reporters: list[Reporter], code: int) -> None:
    refused: list[int] = []
    with Answering([{"type": "noop"}], close_code=code) as platform:
        reporter = Reporter(f"http://127.0.0.1:{platform.port}", "pww_test", heartbeat=0.2)
        reporter.on_refused = refused.append
        reporter.current = JOB
        reporters.append(reporter.start())
        assert wait(lambda: refused)
        reporter.stop()
    assert refused[0] == code


def test_log_lines_are_coalesced_and_bounded_while_the_socket_is_down() -> None:
    reporter = Reporter("http://127.0.0.1:9", "pww_test")  # never started: everything stays queued
    for n in range(LOG_QUEUE + 120):
        reporter.log(JOB, f"line {n}")
    reporter.stopped(JOB)
    queued = reporter._logs
    lines = [line for item in queued if item["type"] == "log" for line in item["lines"]]
    assert len(lines) == LOG_QUEUE
    assert lines[0] == "line 120"  # the oldest went first
    assert all(len(item["lines"]) <= LOG_BATCH for item in queued if item["type"] == "log")
    assert queued[-1] == {"type": "stopped", "assignment_id": JOB}


class Sink:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def log(self, assignment_id: str, *lines: str) -> None:
        assert assignment_id == JOB
        self.lines.extend(lines)


BROKER = "amqps://w-cpc1abc:s3cret-Broker-Pass@broker.example:5671/nodes"
TOKEN = "pww_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789abcdefg"


def test_the_job_log_never_carries_a_secret_and_lines_are_bounded() -> None:
    sink = Sink()
    with joblog.streaming(sink, JOB, [TOKEN, BROKER, "s3cret-Broker-Pass"]):
        trainer = logging.getLogger("training.loop")
        trainer.info("epoch 1/3, step 18/54: train_loss=0.5 val_loss=0.4")
        logging.getLogger("workers.agent").warning("connecting with %s and %s", TOKEN, BROKER)
        logging.getLogger("workers.agent").error("the password is s3cret-Broker-Pass")
        logging.getLogger("training.cube").info("another token pww_%s and redis://:pw@host:6379/0", "Z" * 40)
        trainer.info("x" * 5000)
        # Not the job's: the socket's own lines, HTTP client and Celery chatter stay local.
        logging.getLogger("workers.agent.reporter").warning("socket dropped")
        logging.getLogger("httpx").warning("GET /secret")
        logging.getLogger("celery.worker").warning("celery says")
    logging.getLogger("training.loop").info("after the job")
    text = "\n".join(sink.lines)
    assert sink.lines[0] == "epoch 1/3, step 18/54: train_loss=0.5 val_loss=0.4"
    assert sink.lines[1].startswith("warning: connecting with [redacted] and ")
    assert sink.lines[2] == "error: the password is [redacted]"
    for secret in (TOKEN, "s3cret-Broker-Pass", "pww_ZZZZ", ":pw@"):
        assert secret not in text
    assert len(sink.lines[4]) == joblog.LINE_CHARS
    assert "socket dropped" not in text
    assert "GET /secret" not in text
    assert "celery says" not in text
    assert "after the job" not in text
    assert len(sink.lines) == 5


def test_a_flood_of_log_lines_is_rate_limited_and_counted() -> None:
    sink = Sink()
    with joblog.streaming(sink, JOB, []) as handler:
        for n in range(joblog.BURST + 50):
            logging.getLogger("training.loop").info("line %d", n)
        assert len(sink.lines) == joblog.BURST
        handler.last -= 1.0  # a second later: room for RATE more lines
        logging.getLogger("training.loop").info("later")
    assert sink.lines[-2] == f"(50 log lines not sent: over {joblog.RATE:.0f} a second)"
    assert sink.lines[-1] == "later"


# --- The node's job loop (workers/agent/jobs.py) against a stand-in platform ---------------


@pytest.fixture
def stoppable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[int]:
    """Replaces the kind's runner with one that reports up to 500 steps, a few ms apart,
    then returns an artifact; returns the steps it computed."""
    steps: list[int] = []

    def run(job: dict[str, Any], workdir: Path, progress: runners.Progress) -> runners.Outcome:
        for step in range(1, 501):
            progress(step, 500, {"loss": 1.0 / step})
            steps.append(step)
            time.sleep(0.002)
        artifact = tmp_path / "model.safetensors"
        artifact.write_bytes(b"weights")
        return runners.Outcome(result_hash="ab" * 32, proof={"steps": 500}, artifacts={"model.safetensors": artifact})

    monkeypatch.setattr(runners, "run", run)
    return steps


def stop_after(node: Node, step: int, assignment_id: str, reason: str) -> None:
    """Deliver a stop as the reporter's thread does, once the job reported ``step``."""
    report = node.reporter.progress

    def progress(aid: str, at: int, total: int, metrics: dict[str, float], eta: float | None) -> None:
        report(aid, at, total, metrics, eta)
        if at == step:
            threading.Thread(target=node._platform_stop, args=(assignment_id, reason)).start()

    node.reporter.progress = progress  # type: ignore[method-assign,assignment]


def test_a_job_the_platform_stops_uploads_and_submits_nothing(
    node: Node, platform: Platform, stoppable: list[int]
) -> None:
    stop_after(node, 3, ASSIGNMENT, "The requester cancelled the task.")
    assert node.run_assignment(ASSIGNMENT) == "stopped"
    assert len(stoppable) < 50  # it stopped within a few steps, not at step 500
    assert platform.paths("/artifacts/model.safetensors/") == []
    assert platform.paths("/result/") == []
    assert platform.paths("/fail/") == []  # the platform ended it already
    assert {"type": "stopped", "assignment_id": ASSIGNMENT} in node.reporter._logs
    assert node.reporter.current is None  # free for the next job
    assert stop.requested() is None


def test_a_stop_for_another_job_is_ignored(node: Node, platform: Platform, stoppable: list[int]) -> None:
    stop_after(node, 3, "7d8c6a4e-0000-4000-8000-0000000000ff", "not this one")
    assert node.run_assignment(ASSIGNMENT) == "submitted"
    assert stoppable[-1] == 500


def test_a_node_told_to_shut_down_mid_job_reports_it_abandoned(
    node: Node, platform: Platform, stoppable: list[int]
) -> None:
    node.stopping = lambda: len(stoppable) >= 3
    assert node.run_assignment(ASSIGNMENT) == "abandoned"
    assert len(stoppable) < 250  # within a poll of the stop flags (0.2 s), not at the job's end
    assert platform.bodies["fail"] == [{"reason": "abandoned: the node is shutting down"}]
    assert platform.paths("/result/") == []


def test_a_socket_refused_mid_job_stops_the_job(node: Node, platform: Platform, stoppable: list[int]) -> None:
    """Suspended or retired: the platform closes the socket with 4403 (and refuses the token)."""
    report = node.reporter.progress

    def progress(aid: str, at: int, total: int, metrics: dict[str, float], eta: float | None) -> None:
        report(aid, at, total, metrics, eta)
        if at == 3 and node.reporter.on_refused is not None:
            threading.Thread(target=node.reporter.on_refused, args=(4403,)).start()

    node.reporter.progress = progress  # type: ignore[method-assign,assignment]
    assert node.run_assignment(ASSIGNMENT) == "stopped"
    assert len(stoppable) < 50
    assert platform.paths("/result/") == []
