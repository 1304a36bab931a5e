"""``python -m workers.agent run``: the node's Celery worker and its job loop.

The node consumes only its own queue ``w.<address>`` (JSON messages carrying an
assignment id), one job at a time, acknowledging late, logged in to the platform's node
broker (RabbitMQ) as its own broker user, which may read that queue and nothing else
(docs/node-broker.md). Late acks redeliver a job lost with the process only where the
broker keeps unacknowledged messages (RabbitMQ, once the connection is gone; Redis, after
its visibility timeout); the filesystem broker deletes a message file as it is received,
so there a lost job is gone. Either way, a restarted node first asks the platform to
abandon whatever it still had running (``/workers/me/abandon/``), so those jobs are
reassigned at once instead of at their deadline. For each job it fetches the assignment
over REST, runs the kind's runner from training/, uploads the artifacts, signs the
ComputeResult and the SUBMIT_RESULT transaction with the node's key (after checking the
template, ``trust.py``), and submits them. Any way a job ends here is reported.

The platform can stop the running job at any time (docs/job-control.md): a ``stop`` on
the node's socket, or the socket refused because the worker was suspended or retired,
sets ``training.stop``, which the computation checks between its steps; the node then
neither uploads nor submits, tells the platform it stopped, and takes its next job. Told
to shut down (SIGTERM, Ctrl-C) mid-job, it stops the job the same way, reports it
abandoned (``/fail/``), and exits. While a job runs, its log lines stream to the task's
log (``joblog``).

Heartbeats start only once the Celery consumer is connected to its broker (the
``worker_ready`` signal), and stop whenever it loses that connection (a consumer step,
``broker_presence``): a node that cannot reach its broker never looks online, so the
platform offers it nothing it would not see.
"""

from __future__ import annotations

import hashlib
import logging
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from amqp.exceptions import AccessRefused, NotAllowed
from celery import Celery, bootsteps
from celery.signals import worker_init, worker_ready
from celery.worker import state as worker_state
from celery.worker.consumer import Consumer
from kombu import Queue
from kombu.transport import resolve_transport

from protocol.encoding import ComputeResult, Tx
from protocol.keys import KeyPair
from protocol.signing import sign_compute_result, sign_tx
from training import stop
from workers.agent import capabilities, fsbroker, joblog, runners, trust
from workers.agent.identity import Credentials, credentials_path, load_key
from workers.agent.reporter import Reporter

log = logging.getLogger("workers.agent")
UPLOAD_CHUNK = 1 << 20  # bytes a streamed request body reads from disk at a time
UPLOAD_PART = 32 << 20  # the largest single request; larger artifacts go in parts of this size
RETRY_ATTEMPTS = 8  # requests and downloads: 1+2+4+8+16+30+30 s of waiting, about 91 s, then give up
RETRY_MAX_DELAY = 30.0
SHUTDOWN_POLL = 0.2  # seconds between checks of the Celery worker's stop flags while a job runs
SHUTTING_DOWN = "the node is shutting down"
REFUSED = "the platform refused this node's socket ({code}): the worker was suspended or retired"
DATASET_FORMAT = re.compile(r"[a-z0-9]{1,8}")  # spliced into a file name: nothing else may pass
ABANDON_PATH = "/api/v1/workers/me/abandon/"
DEFAULT_BROKER_FOLDER = "var/celery/out"  # the platform's, from the checkout's root (embedded mode)
CAPABILITIES_PATH = "/api/v1/workers/me/capabilities/"
# The platform's 409 for a result it already has (workers.jobs.wrong_state): the states in
# its ``assignment_state``, and the sentence servers before that field sent alone.
_HAS_RESULT = frozenset({"submitted", "accepted", "rejected"})
_ALREADY_SUBMITTED = re.compile(r"\bis (submitted|accepted|rejected)\b")


class JobError(RuntimeError):
    """A job cannot go on here, for a reason worth reporting to the platform as it is."""


def _never() -> bool:
    return False


def shutting_down() -> bool:
    """Whether the Celery worker was told to stop (Ctrl-C, SIGTERM): its signal handlers
    only set these flags, which its loop reads between messages."""
    return worker_state.should_stop is not None or worker_state.should_terminate is not None


def _resume_point(response: httpx.Response, size: int) -> int | None:
    """Where the platform asks a part upload to continue (its 409's ``received``), if it does."""
    if response.status_code != 409:
        return None
    try:
        body = response.json()
    except ValueError:
        return None
    received = body.get("received") if isinstance(body, dict) else None
    return received if type(received) is int and 0 <= received < size else None


def _read(path: Path, start: int, stop: int) -> Iterator[bytes]:
    """Bytes ``start:stop`` of ``path`` in UPLOAD_CHUNK pieces."""
    with path.open("rb") as handle:
        handle.seek(start)
        left = stop - start
        while left > 0 and (chunk := handle.read(min(UPLOAD_CHUNK, left))):
            left -= len(chunk)
            yield chunk


def _already_submitted(response: httpx.Response) -> bool:
    """Whether a 409 from ``/result/`` says the assignment already has a result."""
    if response.status_code != 409:
        return False
    try:
        body = response.json()
    except ValueError:
        return False
    if not isinstance(body, dict):
        return False
    if "assignment_state" in body:
        return body["assignment_state"] in _HAS_RESULT
    messages = body.get("state")
    return isinstance(messages, list) and any(isinstance(m, str) and _ALREADY_SUBMITTED.search(m) for m in messages)


def _seconds_left(deadline: Any, default: float) -> float:
    """Seconds until an assignment's ISO 8601 ``deadline``; ``default`` when it names none."""
    try:
        when = datetime.fromisoformat(str(deadline))
    except ValueError:
        return default
    if when.tzinfo is None:
        return default
    return (when - datetime.now(UTC)).total_seconds()


class Node:
    """One provider node: its key, its credentials, its HTTP client and its reporter."""

    def __init__(
        self, key: KeyPair, creds: Credentials, server: str, *, max_gas_price: int = trust.DEFAULT_MAX_GAS_PRICE
    ) -> None:
        self.key = key
        self.creds = creds
        self.server = server.rstrip("/")
        self.max_gas_price = max_gas_price
        self.http = httpx.Client(base_url=self.server, headers={"Authorization": f"Worker {creds.token}"}, timeout=60)
        self.reporter = Reporter(self.server, creds.token)
        self.reporter.on_stop = self._platform_stop
        self.reporter.on_refused = lambda code: self._platform_stop(self.reporter.current, REFUSED.format(code=code))
        # Asked between retries of the start-up calls: a node told to stop while the
        # platform is down stops now, not after their minute and a half of retries each.
        self.stopping: Callable[[], bool] = _never
        self.secrets: list[str] = [creds.token]  # never streamed to the task log (joblog.redact)
        self._stopped_by_platform: str | None = None

    def _platform_stop(self, assignment_id: str | None, reason: str) -> None:
        """The platform ended ``assignment_id``: stop it if it is the job running here."""
        if assignment_id is None or assignment_id != self.reporter.current:
            return  # a job this node no longer runs (or never did)
        if self._stopped_by_platform is None:
            self._stopped_by_platform = reason
            log.warning("assignment %s stopped by the platform: %s", assignment_id, reason)
        stop.request(reason)

    def _watch_shutdown(self, done: threading.Event) -> None:
        """Until ``done``: once the node is told to stop, stop the running job too."""
        while not done.wait(SHUTDOWN_POLL):
            if self.stopping():
                stop.request(SHUTTING_DOWN)
                return

    def _pause(self, seconds: float, interruptible: bool) -> bool:
        """Sleep ``seconds``; False, at once, when ``interruptible`` and the node is stopping."""
        if not interruptible:
            time.sleep(seconds)
            return True
        until = time.monotonic() + seconds
        while (left := until - time.monotonic()) > 0:
            if self.stopping():
                return False
            time.sleep(min(0.1, left))
        return not self.stopping()

    def _request(
        self,
        method: str,
        url: str,
        body: Callable[[], Iterator[bytes]] | None = None,
        *,
        interruptible: bool = False,
        **kwargs: Any,
    ) -> httpx.Response:
        """HTTP with retries on connection errors and 5xx (the server may be restarting).

        ``body`` makes a fresh streamed request body for each attempt (a file read again
        from its start), for uploads too large to hold in memory. ``interruptible`` gives
        up between attempts once the node is stopping (``stopping``).
        """
        delay = 1.0
        for attempt in range(RETRY_ATTEMPTS):
            try:
                if body is not None:
                    kwargs["content"] = body()
                response = self.http.request(method, url, **kwargs)
                if response.status_code < 500:
                    return response
            except httpx.TransportError as exc:
                log.warning("%s %s failed (%s); retrying", method, url, exc)
            if attempt < RETRY_ATTEMPTS - 1:
                if not self._pause(delay, interruptible):
                    raise RuntimeError(f"{method} {url}: given up, the node is stopping")
                delay = min(delay * 2, RETRY_MAX_DELAY)
        raise RuntimeError(f"{method} {url}: the platform is unreachable")

    def report_capabilities(self, caps: dict[str, Any]) -> bool:
        """Tell the platform what this node offers now (at start-up); True when it took them.

        Registration recorded what the agent offered then; an upgraded agent lists new
        features here, so it is offered the tasks that need them without registering again.
        A platform without the endpoint (404) keeps the registered ones.
        """
        try:
            response = self._request("POST", CAPABILITIES_PATH, json=caps, interruptible=True)
        except RuntimeError as exc:
            log.error("could not report this node's capabilities: %s", exc)
            return False
        if response.status_code == 404:
            return False
        if response.status_code != 200:
            log.error(
                "the platform refused this node's capabilities: HTTP %s %s", response.status_code, response.text[:300]
            )
            return False
        return True

    def abandon_running(self) -> list[str]:
        """Ask the platform to fail whatever this worker still had running (at start-up).

        A node that starts cannot be running anything, so such an assignment was lost with
        an earlier process: failing it now reassigns it at once rather than at its
        deadline. A platform without the endpoint (404) has nothing to abandon.
        """
        try:
            response = self._request("POST", ABANDON_PATH, json={}, interruptible=True)
        except RuntimeError as exc:
            log.error("could not ask the platform to abandon earlier jobs: %s", exc)
            return []
        if response.status_code == 404:
            return []
        try:
            abandoned = response.json().get("abandoned") if response.status_code == 200 else None
        except (ValueError, AttributeError):
            abandoned = None
        if not isinstance(abandoned, list):
            log.error("abandoning earlier jobs was refused: HTTP %s %s", response.status_code, response.text[:300])
            return []
        ids = [str(a) for a in abandoned]
        if ids:
            log.warning("abandoned %d job(s) an earlier run of this node left running: %s", len(ids), ", ".join(ids))
        return ids

    def run_assignment(self, assignment_id: str) -> str:
        """Run one job to its end: submitted, failed (reported), refused, gone or already-<state>.

        Every way the job can end here is reported to the platform, so that none waits for
        its deadline: a fetch, start or computation that fails is sent to ``/fail/``, and a
        finished result is retried for as long as its deadline allows.
        """
        try:
            response = self._request("GET", f"/api/v1/assignments/{assignment_id}/")
        except RuntimeError as exc:
            self.report_failure(assignment_id, f"could not fetch the assignment: {exc}")
            return "failed"
        if response.status_code != 200:
            log.error("assignment %s: %s", assignment_id, response.text[:300])
            return "gone"
        job = response.json()
        if job["state"] not in ("offered", "running"):
            return "already-" + job["state"]
        problem = trust.submit_tx_problem(
            job.get("submit"), self.key.address, chain_id=self.creds.chain_id, max_gas_price=self.max_gas_price
        )
        if problem is not None:  # checked again when signing; here it costs no computation
            self.report_failure(assignment_id, f"refused to sign the platform's SUBMIT_RESULT template: {problem}")
            return "failed"
        try:
            started = self._request("POST", f"/api/v1/assignments/{assignment_id}/start/")
        except RuntimeError as exc:
            self.report_failure(assignment_id, f"could not start: {exc}")
            return "failed"
        if started.status_code != 200:
            log.error("assignment %s could not start: %s", assignment_id, started.text[:300])
            return "refused"
        self.reporter.log(assignment_id, f"{job['kind']} started on {self.key.address}")
        done = threading.Event()
        watcher = threading.Thread(target=self._watch_shutdown, args=(done,), name="shutdown-watch", daemon=True)
        try:
            with stop.watching(), joblog.streaming(self.reporter, assignment_id, self.secrets):
                self._stopped_by_platform = None
                self.reporter.current = assignment_id  # from now on a stop for it stops it
                watcher.start()
                return self._run_started(assignment_id, job)
        finally:
            done.set()
            self.reporter.current = None

    def _run_started(self, assignment_id: str, job: dict[str, Any]) -> str:
        """Compute, then submit, a started job; a stop ends it without either (see the module docstring)."""
        t0 = time.monotonic()
        bar = _Bar(job["kind"])

        def progress(step: int, total: int, metrics: dict[str, float]) -> None:
            stop.check()
            elapsed = time.monotonic() - t0
            eta = elapsed / step * (total - step) if step else None
            self.reporter.progress(assignment_id, step, total, metrics, eta)
            bar.update(step, total, metrics)

        try:
            body = self._compute(assignment_id, job, progress)
            stop.check()
        except stop.Stopped as stopped:
            bar.done()
            return self._stopped(assignment_id, stopped.reason)
        except Exception as exc:  # any failure of the job itself is reported, never left to the deadline
            bar.done()
            log.exception("assignment %s failed", assignment_id)
            self.report_failure(assignment_id, f"{type(exc).__name__}: {exc}")
            return "failed"
        bar.done()
        # The last progress (the end of the loss curve) must land while the job still runs.
        self.reporter.flush()
        return self._submit(assignment_id, body, job.get("deadline"))

    def _stopped(self, assignment_id: str, reason: str) -> str:
        """The computation stopped: the platform ended the job ("stopped"), or the node is
        shutting down (reported as abandoned, so the job is reassigned now)."""
        if self._stopped_by_platform is not None:
            log.warning(
                "assignment %s: stopped by the platform: %s; nothing is uploaded or submitted", assignment_id, reason
            )
            self.reporter.stopped(assignment_id)
            self.reporter.flush()
            return "stopped"
        log.warning("assignment %s abandoned: %s", assignment_id, reason)
        self.report_failure(assignment_id, f"abandoned: {reason}")
        return "abandoned"

    def _submit(self, assignment_id: str, body: dict[str, Any], deadline: Any) -> str:
        """POST the signed result until the platform takes it or the deadline passes.

        The signed body stays valid until the assignment's deadline, so a platform that is
        down for minutes does not cost finished work: transport errors and 5xx are retried
        with capped backoff. After an attempt whose answer was lost, a 409 saying the
        assignment is already submitted (or settled) means that attempt went through.
        """
        url = f"/api/v1/assignments/{assignment_id}/result/"
        until = time.monotonic() + _seconds_left(deadline, default=RETRY_MAX_DELAY * 3)
        delay, retried = 1.0, False
        while True:
            try:
                response = self.http.post(url, json=body)
                if response.status_code < 500:
                    break
                problem = f"HTTP {response.status_code}"
            except httpx.TransportError as exc:
                problem = str(exc) or type(exc).__name__
            left = until - time.monotonic()
            if left <= 0:
                log.error("result for %s not delivered before its deadline (%s); giving up", assignment_id, problem)
                self.reporter.log(assignment_id, f"result not delivered before the deadline ({problem})")
                self.reporter.flush()
                return "undelivered"
            log.warning("POST %s failed (%s); retrying in %.0f s", url, problem, min(delay, left))
            time.sleep(min(delay, left))
            delay, retried = min(delay * 2, RETRY_MAX_DELAY), True
        if response.status_code in (200, 202) or (retried and _already_submitted(response)):
            self.reporter.log(assignment_id, f"result submitted ({response.status_code})")
            self.reporter.flush()
            return "submitted"
        log.error("result for %s refused: %s", assignment_id, response.text[:300])
        self.report_failure(
            assignment_id, f"the platform refused the result (HTTP {response.status_code}): {response.text[:200]}"
        )
        return "refused"

    def _compute(self, assignment_id: str, job: dict[str, Any], progress: runners.Progress) -> dict[str, Any]:
        """Download, run, upload: returns the signed result body. Raises on any failure."""
        with tempfile.TemporaryDirectory(prefix="proofwork-") as tmp:
            workdir = Path(tmp)
            dataset = job["dataset"]
            if dataset:
                fmt = dataset.get("format")
                if not isinstance(fmt, str) or not DATASET_FORMAT.fullmatch(fmt):
                    raise JobError(f"the platform sent a dataset format this node will not use: {fmt!r}")
                size = dataset.get("size_bytes")
                self._download(
                    dataset["url"],
                    workdir / f"dataset.{fmt}",
                    sha256=str(dataset.get("sha256") or ""),
                    size=size if type(size) is int else None,
                )
            # Inference runners fetch their model over the same authenticated client.
            outcome = runners.run({**job, "fetch": self._download}, workdir, progress)
            for name, path in outcome.artifacts.items():
                stop.check()
                up = self._upload(f"/api/v1/assignments/{assignment_id}/artifacts/{name}/", name, path)
                if up.status_code != 201:
                    raise RuntimeError(f"upload of {name} refused: {up.text[:300]}")
        return self.sign_result(job, outcome)

    def _upload(self, url: str, name: str, path: Path) -> httpx.Response:
        """PUT one file, streamed from disk; in UPLOAD_PART parts when it is larger.

        Each request streams UPLOAD_CHUNK pieces with its Content-Length, never the file as
        one bytes object: that cost its size in memory, and httpx re-slices the unsent rest
        of such a buffer after every socket write (a 1.6 GB product took two minutes on
        loopback). Parts (``workers/uploads.py``) bound what one request costs the platform's
        web process, which holds a whole body in memory; a part the platform says it did not
        expect (409) is resent from where it says it is. Returns the last response: 201
        once the whole file is in.
        """
        size = path.stat().st_size
        headers = {"Content-Disposition": f'attachment; filename="{name}"'}
        if size <= UPLOAD_PART:
            return self._request(
                "PUT", url, body=partial(_read, path, 0, size), headers={**headers, "Content-Length": str(size)}
            )
        start, attempts = 0, 0
        while True:
            end = min(size, start + UPLOAD_PART) - 1
            response = self._request(
                "PUT",
                url,
                body=partial(_read, path, start, end + 1),
                headers={
                    **headers,
                    "Content-Length": str(end - start + 1),
                    "Content-Range": f"bytes {start}-{end}/{size}",
                },
            )
            resume = _resume_point(response, size)
            if resume is not None and attempts < 3:
                # A part whose answer was lost was applied after all, or one went missing.
                attempts, start = attempts + 1, resume
                continue
            if response.status_code != 202:
                return response
            attempts, start = 0, end + 1

    def report_failure(self, assignment_id: str, reason: str) -> None:
        """Tell the platform this job cannot be finished here, so it is reassigned now."""
        self.reporter.log(assignment_id, f"failed: {reason[:400]}")
        try:
            response = self._request(
                "POST", f"/api/v1/assignments/{assignment_id}/fail/", json={"reason": reason[:250]}
            )
        except RuntimeError as exc:  # the platform is down; the heartbeat timeout will expire the job instead
            log.error("could not report the failure of %s: %s", assignment_id, exc)
            return
        if response.status_code != 200:
            log.error("failure report for %s refused: %s", assignment_id, response.text[:300])
        self.reporter.flush()

    def sign_result(self, job: dict[str, Any], outcome: runners.Outcome) -> dict[str, Any]:
        """The ComputeResult and the SUBMIT_RESULT transaction, both signed by this node.

        Raises JobError, signing nothing, when the platform's template is not a plain
        SUBMIT_RESULT of this node on its chain at a sane gas price (``trust.py``).
        """
        template = job["submit"]
        problem = trust.submit_tx_problem(
            template, self.key.address, chain_id=self.creds.chain_id, max_gas_price=self.max_gas_price
        )
        if problem is not None:
            raise JobError(f"refused to sign the platform's SUBMIT_RESULT template: {problem}")
        compute = sign_compute_result(
            ComputeResult(
                task_id=job["task_id"],
                worker_address=self.key.address,
                result_hash=outcome.result_hash,
                proof=outcome.proof,
                nonce=int(template["nonce"]),
            ),
            self.key,
        )
        payload = {"compute_result": compute.to_json()}
        tx = Tx(
            chain_id=template["chain_id"],
            type=template["type"],
            sender=template["from"],
            recipient=template["to"],
            amount=int(template["amount"]),
            fee=int(template["fee"]),
            nonce=int(template["nonce"]),
            gas_price=int(template["gas_price"]),
            gas_limit=int(template["gas_limit"]),
            payload=payload,
        )
        signed, signature = sign_tx(tx, self.key)
        return {
            "compute_result": compute.to_json(),
            "transaction": {
                **{
                    k: template[k]
                    for k in ("chain_id", "type", "from", "to", "amount", "fee", "nonce", "gas_price", "gas_limit")
                },
                "payload": payload,
                "public_key": signed.public_key.hex(),
                "signature": signature.hex(),
            },
        }

    def _download(self, url: str, dest: Path, *, sha256: str = "", size: int | None = None) -> None:
        """GET a file the platform serves this worker into ``dest``, checked against what it said.

        Only from the node's own server (``trust.on_own_server``). Transport errors and 5xx
        (the platform restarting, a proxy's 502) are retried like ``_request``, starting
        the file again; any other status fails at once. With ``size`` and ``sha256`` (the
        job's dataset entry) a body that differs fails the job, naming both.
        """
        try:
            url = trust.on_own_server(url, self.server)
        except ValueError as exc:
            raise JobError(f"refused to download: {exc}") from None
        delay = 1.0
        for attempt in range(RETRY_ATTEMPTS):
            digest, received = hashlib.sha256(), 0
            try:
                with self.http.stream("GET", url) as response:
                    if response.status_code < 500:
                        if response.status_code != 200:
                            response.read()
                            raise JobError(f"GET {url}: HTTP {response.status_code} {response.text[:200]}")
                        with dest.open("wb") as out:
                            for chunk in response.iter_bytes(1 << 20):
                                stop.check()
                                out.write(chunk)
                                digest.update(chunk)
                                received += len(chunk)
                        break
                    problem = f"HTTP {response.status_code}"
            except httpx.TransportError as exc:
                problem = str(exc) or type(exc).__name__
            log.warning("GET %s failed (%s); starting the file again", url, problem)
            if attempt < RETRY_ATTEMPTS - 1:
                time.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_DELAY)
        else:
            raise JobError(f"GET {url}: the platform is unreachable")
        if size is not None and received != size:
            raise JobError(
                f"{dest.name} is {received} bytes, but the platform said {size}: the download is not the file"
            )
        if sha256 and digest.hexdigest() != sha256.lower():
            raise JobError(f"{dest.name} has sha256 {digest.hexdigest()}, but the platform said {sha256}")


class _Bar:
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


_BLUEPRINT_RUNNING = bootsteps.RUN  # type: ignore[attr-defined]  # missing from celery-types


def broker_presence(reporter: Reporter) -> type[bootsteps.StartStopStep]:
    """A consumer step that tells ``reporter`` whether the node holds its broker connection.

    Celery starts the consumer's steps once it is connected and consuming (this one after
    ``Tasks``, the queue's consumer) and stops them all when the connection is lost, before
    it reconnects; while the broker stays away, the steps are not started again. With the
    solo pool a running job blocks the consumer, so a loss is seen only between jobs,
    never in the middle of one (whose progress keeps flowing).
    """

    class BrokerPresence(bootsteps.StartStopStep):
        requires = ("celery.worker.consumer.tasks:Tasks",)

        def start(self, consumer: Any) -> None:
            reporter.broker_back()

        def stop(self, consumer: Any) -> None:
            # A restart after a lost connection stops the steps with the blueprint still
            # running; a shutdown closes it first (and run_node stops the reporter then).
            if consumer.blueprint.state == _BLUEPRINT_RUNNING:
                reporter.broker_lost()

    return BrokerPresence


def amqp_tls(broker: str, ca: str | None) -> dict[str, Any] | None:
    """TLS options for an amqps:// broker: the server's certificate checked against the
    system's CAs, or ``ca`` alone, and its host name against the URL's; None for others."""
    if not broker.startswith("amqps://"):
        return None
    context: dict[str, Any] = {"check_hostname": True}
    if ca:
        context["cafile"] = ca
    return {"context": context, "server_hostname": urlsplit(broker).hostname}


LOGIN_RETRY_MAX = 30.0  # seconds between logins the broker refuses, at most


class PatientConsumer(Consumer):
    """Celery's consumer, waiting longer and longer (up to LOGIN_RETRY_MAX) between logins
    the broker refuses, instead of trying about five times a second.

    RabbitMQ refuses a node's login while the node is suspended or its owner's account
    deactivated (NOT_ALLOWED: no access to the vhost), and for good once it is retired or
    registered again elsewhere (ACCESS_REFUSED: the user or password is gone). Celery
    treats both as a lost connection and reconnects at once. Waits end early when the
    node is told to stop.
    """

    refusals = 0

    def connect(self) -> Any:
        connection = super().connect()
        self.refusals = 0
        return connection

    def on_connection_error_before_connected(self, exc: Exception) -> None:
        super().on_connection_error_before_connected(exc)
        if not isinstance(exc, AccessRefused | NotAllowed):
            return
        self.refusals += 1
        delay = min(2.0**self.refusals, LOGIN_RETRY_MAX)
        log.warning(
            "the broker refuses this node's login: it is suspended or retired, or was registered again"
            " elsewhere (a new login); trying again in %.0f s",
            delay,
        )
        until = time.monotonic() + delay
        while time.monotonic() < until and not shutting_down():
            time.sleep(0.2)


def make_app(broker: str, queue: str, broker_folder: str | None = None, broker_ca: str | None = None) -> Celery:
    """The node's Celery app: JSON only, its own queue, late acks, one job at a time.

    On RabbitMQ the node's broker user may only read its own queue, which the platform
    declared: the app declares nothing (``no_declare``), and the features that need more
    (remote control, events, and gossip, mingle and heartbeats: ``run_node``) are off.
    """
    app = Celery("proofwork-agent", broker=broker)
    options: dict[str, Any] = {}
    amqp = broker.split("://", 1)[0] in ("amqp", "amqps")
    if broker.startswith("filesystem://"):
        folder = broker_folder or DEFAULT_BROKER_FOLDER
        control = str(Path(folder).parent / "control")
        options = {
            "data_folder_in": folder,
            "data_folder_out": folder,
            "control_folder": control,
            "store_processed": False,
            "polling_interval": 0.1,  # as the platform's (config/settings.py): 1 s by default
        }
    if options:
        app.conf.broker_transport = fsbroker.TRANSPORT  # whole message files (fsbroker.py)
    elif broker.split("://", 1)[0] in ("redis", "rediss"):
        # A job may run past Redis's default visibility timeout (an hour): it would be
        # delivered again. A node that died gives its job up when it starts (abandon).
        options = {"visibility_timeout": 24 * 3600}
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_backend=None,
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        worker_concurrency=1,
        task_queues=[Queue(queue, routing_key=queue, no_declare=amqp)],
        task_default_queue=queue,
        broker_transport_options=options,
        broker_connection_retry_on_startup=True,
        broker_use_ssl=amqp_tls(broker, broker_ca),
        worker_hijack_root_logger=False,
        worker_consumer="workers.agent.node:PatientConsumer",
        worker_enable_remote_control=False,
        worker_send_task_events=False,
        task_send_sent_event=False,
    )
    return app


def run_node(
    key_path: Path,
    *,
    broker: str | None,
    server: str | None,
    broker_folder: str | None = None,
    broker_ca: str | None = None,
    max_gas_price: int = trust.DEFAULT_MAX_GAS_PRICE,
) -> int:
    """Run the node until it is told to stop. ``broker`` None: the node's own broker login
    from registration (``worker.json``)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    key = load_key(key_path)
    creds = Credentials.load(credentials_path(key_path))
    if creds.address != key.address:
        print(f"error: {credentials_path(key_path)} belongs to {creds.address}, not this key", file=sys.stderr)
        return 2
    if broker is None:
        if not creds.broker_url:
            print(
                f"error: {credentials_path(key_path)} holds no broker login (the platform runs its embedded broker):"
                " pass --broker filesystem:// --broker-folder <the platform's var/celery/out>",
                file=sys.stderr,
            )
            return 2
        broker = creds.broker_url
    problem = broker_problem(broker, broker_folder, broker_ca)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        node = Node(key, creds, server or creds.server, max_gas_price=max_gas_price)
    except httpx.InvalidURL as exc:
        print(f"error: {server or creds.server} is not a valid server URL: {exc}", file=sys.stderr)
        return 2
    node.stopping = shutting_down
    for url in {broker, creds.broker_url} - {""}:  # an overridden login is a secret all the same
        node.secrets.extend(broker_secrets(url))
    if warning := trust.insecure_server(node.server):
        print(warning, file=sys.stderr)
    if not creds.chain_id:
        log.warning("%s records no chain id (registered by an older agent): register again to pin it", key_path)
    queue = f"w.{key.address}"
    app = make_app(broker, queue, broker_folder, broker_ca)

    def on_ready(**_: Any) -> None:
        # Celery sends this once the consumer is connected to the broker and subscribed to
        # the queue, before its loop takes the first message: only now may the node look
        # online, and anything an earlier run left running is given up first.
        node.report_capabilities(capabilities.detect())
        node.abandon_running()
        if not node.stopping():  # told to stop meanwhile: it must not look online on its way out
            node.reporter.start()

    workers: list[Any] = []

    def on_init(sender: Any, **_: Any) -> None:
        workers.append(sender)

    worker_init.connect(on_init)
    worker_ready.connect(on_ready)
    app.steps["consumer"].add(broker_presence(node.reporter))

    @app.task(name="agent.run_assignment", bind=True, acks_late=True)
    def run_assignment(self: Any, assignment_id: str) -> str:
        try:
            return node.run_assignment(str(assignment_id))
        except runners.UnsupportedKind as exc:
            log.error("%s", exc)
            return "unsupported"

    where = urlsplit(broker)
    shown = f"{where.scheme}://{where.hostname or ''}{f':{where.port}' if where.port else ''}{where.path}"
    print(f"Worker {key.address} consuming {queue} from {shown}; reporting to {node.server}", flush=True)
    # Gossip, mingle and worker heartbeats are broadcasts between Celery workers (exchanges
    # a node's broker user may not declare nor write to); a node talks to no other worker.
    quiet = ["--without-gossip", "--without-mingle", "--without-heartbeat"]
    try:
        app.worker_main(
            ["worker", "--pool", "solo", "--loglevel", "INFO", "-Q", queue, "-n", f"{key.address[:16]}@%h", *quiet]
        )
    finally:
        worker_ready.disconnect(on_ready)
        worker_init.disconnect(on_init)
        node.reporter.stop()
    # worker_main drops the worker's exit status: an unrecoverable error exited 0, so a
    # process manager saw a clean stop and did not restart the node.
    return int(workers[0].exitcode or 0) if workers else 1


def broker_secrets(broker: str) -> list[str]:
    """The broker URL and its password: never streamed to a task's log."""
    try:
        password = urlsplit(broker).password
    except ValueError:
        password = None
    return [broker, *([password] if password else [])]


def broker_problem(broker: str, broker_folder: str | None, broker_ca: str | None = None) -> str | None:
    """Why ``run`` cannot use this broker, said before Celery starts (it printed a
    traceback instead). The URL itself is not repeated: it may hold a password."""
    scheme = broker.split("://", 1)[0] if "://" in broker else ""
    if not scheme:
        return "--broker is not a broker URL (amqps://user:password@host/vhost, or filesystem:// in embedded mode)"
    if broker_ca is not None and not Path(broker_ca).is_file():
        return f"--broker-ca: {broker_ca} is not a file"
    try:
        resolve_transport(scheme)
    except KeyError:
        return f"--broker: there is no {scheme}:// broker transport (amqps://, amqp://, filesystem://)"
    except ImportError as exc:
        return f"--broker: the {scheme}:// transport needs a module that is not installed ({exc})"
    if scheme == "filesystem":
        folder = Path(broker_folder or DEFAULT_BROKER_FOLDER)
        if not folder.is_dir():
            return f"the broker folder {folder} does not exist (--broker-folder: the platform's var/celery/out)"
    return None


__all__ = ["Node", "make_app", "run_node"]
