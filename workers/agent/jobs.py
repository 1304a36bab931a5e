"""The node's job loop: one assignment from fetch to signed result, every ending reported.

For each job the node fetches the assignment over REST, runs the kind's runner from
training/, uploads the artifacts, signs the ComputeResult and the SUBMIT_RESULT
transaction with the node's key (after checking the template, ``trust.py``), and submits
them. For a trained kind the platform answers with a challenge: the checkpoints of the run's
training trace it will re-execute, which the node then uploads from the run's folder, kept
until then (docs/proof-of-training.md). Any way a job ends here is reported. At start-up it first asks the platform to
abandon whatever an earlier process still had running (``/workers/me/abandon/``), so
those jobs are reassigned at once instead of at their deadline.

The platform can stop the running job at any time (docs/job-control.md): a ``stop`` on
the node's socket, or the socket refused because the worker was suspended or retired,
sets ``training.stop``, which the computation checks between its steps; the node then
neither uploads nor submits, tells the platform it stopped, and takes its next job. Told
to shut down (SIGTERM, Ctrl-C) mid-job, it stops the job the same way, reports it
abandoned (``/fail/``), and exits. While a job runs, its log lines stream to the task's
log (``joblog``).
"""

from __future__ import annotations

import logging
import re
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from protocol.encoding import ComputeResult, Tx
from protocol.keys import KeyPair
from protocol.signing import sign_compute_result, sign_tx
from training import stop
from training.plugin import SHARDS_FORMAT
from workers.agent import joblog, runners, trust
from workers.agent.bar import Bar
from workers.agent.identity import Credentials
from workers.agent.reporter import Reporter
from workers.agent.transfer import RETRY_MAX_DELAY, JobError, PlatformClient

log = logging.getLogger("workers.agent")
SHUTDOWN_POLL = 0.2  # seconds between checks of the Celery worker's stop flags while a job runs
SHUTTING_DOWN = "the node is shutting down"
REFUSED = "the platform refused this node's socket ({code}): the worker was suspended or retired"
DATASET_FORMAT = re.compile(r"[a-z0-9]{1,8}")  # spliced into a file name: nothing else may pass
ABANDON_PATH = "/api/v1/workers/me/abandon/"
CAPABILITIES_PATH = "/api/v1/workers/me/capabilities/"
# The platform's 409 for a result it already has (workers.assignments.jobs.wrong_state): one of these
# states in its ``assignment_state`` or, from a platform that sends no such field, this
# sentence in its ``state``.
_HAS_RESULT = frozenset({"submitted", "accepted", "rejected"})
_ALREADY_SUBMITTED = re.compile(r"\bis (submitted|accepted|rejected)\b")


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


class Node(PlatformClient):
    """One provider node: its key, its credentials, its HTTP client and its reporter."""

    def __init__(
        self, key: KeyPair, creds: Credentials, server: str, *, max_gas_price: int = trust.DEFAULT_MAX_GAS_PRICE
    ) -> None:
        super().__init__(server, creds.token)
        self.key = key
        self.creds = creds
        self.max_gas_price = max_gas_price
        self.reporter = Reporter(self.server, creds.token)
        self.reporter.on_stop = self._platform_stop
        self.reporter.on_refused = lambda code: self._platform_stop(self.reporter.current, REFUSED.format(code=code))
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

    def report_capabilities(self, caps: dict[str, Any]) -> bool:
        """Tell the platform what this node offers now (at start-up); True when it took them.

        Registration recorded what the agent offered then; an upgraded agent lists new
        features here, so it is offered the tasks that need them without registering again.
        A platform without the endpoint (404) keeps the registered ones.
        """
        try:
            response = self.request("POST", CAPABILITIES_PATH, json=caps, interruptible=True)
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
            response = self.request("POST", ABANDON_PATH, json={}, interruptible=True)
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
            response = self.request("GET", f"/api/v1/assignments/{assignment_id}/")
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
            started = self.request("POST", f"/api/v1/assignments/{assignment_id}/start/")
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
        bar = Bar(job["kind"])

        def progress(step: int, total: int, metrics: dict[str, float]) -> None:
            stop.check()
            elapsed = time.monotonic() - t0
            eta = elapsed / step * (total - step) if step else None
            self.reporter.progress(assignment_id, step, total, metrics, eta)
            bar.update(step, total, metrics)

        # The run's files stay until the job ends: a trained kind's checkpoints are uploaded
        # only once the platform, answering the signed result, says which it picked.
        with tempfile.TemporaryDirectory(prefix="proofwork-") as tmp:
            try:
                outcome = self._compute(assignment_id, job, progress, Path(tmp))
                body = self.sign_result(job, outcome)
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
            status, answer = self._submit(assignment_id, body, job.get("deadline"))
            challenge = answer.get("challenge")
            if status != "submitted" or challenge is None:
                return status
            try:
                return self._answer_challenge(assignment_id, outcome, challenge)
            except stop.Stopped as stopped:
                return self._stopped(assignment_id, stopped.reason)

    def _answer_challenge(self, assignment_id: str, outcome: runners.Outcome, challenge: Any) -> str:
        """Upload exactly the checkpoints the platform picked after the signed result
        (docs/proof-of-training.md); the last one starts the verification. A checkpoint
        this run does not have, or one the platform refuses, fails the job."""
        names = challenge.get("checkpoints") if isinstance(challenge, dict) else None
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            self.report_failure(assignment_id, f"the platform's challenge names no checkpoints: {challenge!r:.150}")
            return "failed"
        have = outcome.checkpoints
        unknown = [n for n in names if n not in have]
        if unknown:
            self.report_failure(
                assignment_id, f"the platform asked for checkpoints this run did not write: {', '.join(unknown[:5])}"
            )
            return "failed"
        segments = challenge.get("segments")
        self.reporter.log(
            assignment_id,
            f"the platform picked segments {segments} of the training trace to re-execute; "
            f"uploading checkpoints {', '.join(names)}",
        )
        for name in names:
            stop.check()
            up = self.upload(f"/api/v1/assignments/{assignment_id}/artifacts/{name}/", name, have[name])
            if up.status_code == 201 or _already_submitted(up):
                continue  # a 409 "submitted": the last upload's answer was lost, and it went through
            self.report_failure(assignment_id, f"upload of {name} refused: {up.text[:200]}")
            return "failed"
        self.reporter.log(assignment_id, f"uploaded the {len(names)} challenged checkpoints; verification starts")
        self.reporter.flush()
        return "submitted"

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

    def _submit(self, assignment_id: str, body: dict[str, Any], deadline: Any) -> tuple[str, dict[str, Any]]:
        """POST the signed result until the platform takes it or the deadline passes; the
        outcome (submitted, undelivered or refused) and the platform's answer.

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
                return "undelivered", {}
            log.warning("POST %s failed (%s); retrying in %.0f s", url, problem, min(delay, left))
            time.sleep(min(delay, left))
            delay, retried = min(delay * 2, RETRY_MAX_DELAY), True
        if response.status_code in (200, 202) or (retried and _already_submitted(response)):
            self.reporter.log(assignment_id, f"result submitted ({response.status_code})")
            self.reporter.flush()
            try:
                answer = response.json() if response.status_code in (200, 202) else {}
            except ValueError:
                answer = {}
            return "submitted", answer if isinstance(answer, dict) else {}
        log.error("result for %s refused: %s", assignment_id, response.text[:300])
        self.report_failure(
            assignment_id, f"the platform refused the result (HTTP {response.status_code}): {response.text[:200]}"
        )
        return "refused", {}

    def _compute(
        self, assignment_id: str, job: dict[str, Any], progress: runners.Progress, workdir: Path
    ) -> runners.Outcome:
        """Download, run, upload the artifacts (in ``workdir``): the run's outcome. Raises on any failure.

        The dataset lands at ``workdir/dataset.<format>``: a file, or for a dataset in
        shards the folder of its files, which the kind's runner reads as it would a zip
        (or, for a kind that ingests shards as they arrive, what its ingest left there)."""
        dataset = job["dataset"]
        if dataset:
            fmt = dataset.get("format")
            if not isinstance(fmt, str) or not DATASET_FORMAT.fullmatch(fmt):
                raise JobError(f"the platform sent a dataset format this node will not use: {fmt!r}")
            size = dataset.get("size_bytes")
            target, digest = workdir / f"dataset.{fmt}", str(dataset.get("sha256") or "")
            known = size if type(size) is int else None
            if fmt == SHARDS_FORMAT:
                self.download_folder(dataset["url"], target, sha256=digest, size=known, ingest=runners.ingest(job))
            else:
                self.download(dataset["url"], target, sha256=digest, size=known)
        # Inference runners fetch their model over the same authenticated client.
        outcome = runners.run({**job, "fetch": self.download}, workdir, progress)
        for name, path in outcome.artifacts.items():
            stop.check()
            up = self.upload(f"/api/v1/assignments/{assignment_id}/artifacts/{name}/", name, path)
            if up.status_code != 201:
                raise RuntimeError(f"upload of {name} refused: {up.text[:300]}")
        return outcome

    def report_failure(self, assignment_id: str, reason: str) -> None:
        """Tell the platform this job cannot be finished here, so it is reassigned now."""
        self.reporter.log(assignment_id, f"failed: {reason[:400]}")
        try:
            response = self.request("POST", f"/api/v1/assignments/{assignment_id}/fail/", json={"reason": reason[:250]})
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
