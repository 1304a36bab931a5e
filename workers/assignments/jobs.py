"""What a worker does with an assignment: read it, start it, upload, submit.

The platform trusts nothing here: every call is bound to the calling worker's own
assignment, state changes are conditional updates, and a submitted ComputeResult must
carry the worker's signature over exactly this task, this worker and this result
before anything else looks at it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import IO, Any
from uuid import UUID

from django.conf import settings
from django.core.files.storage import default_storage
from django.core.files.uploadedfile import UploadedFile
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from rest_framework.exceptions import NotFound, ValidationError

from config.api.uploads import parse_content_range
from config.celery import enqueue
from ledger import gas
from ledger import services as ledger
from ledger.models import Transaction
from marketplace.kinds import KINDS
from marketplace.models import Task, TaskStatus
from protocol import encoding
from protocol.encoding import EncodingError, parse_compute_result
from protocol.signing import verify_compute_result, verify_tx
from training.plugin import SHARDS_FORMAT
from training.trace import TraceError, is_checkpoint_name
from workers.assignments import heldout, lifecycle, proof, uploads
from workers.assignments.control import GAVE_UP
from workers.assignments.lifecycle import FAIL_PENALTY
from workers.live.dashboard import worker_changed
from workers.models import Assignment, Worker

log = logging.getLogger(__name__)

_ARTIFACT_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class Conflict(ValidationError):
    status_code = 409


def wrong_state(state: str, consequence: str) -> Conflict:
    """409 for an assignment in a state that forbids the request. Besides the sentence
    under ``state``, ``assignment_state`` names the state, so a client (the agent, after a
    result whose answer was lost) can act on it without parsing prose."""
    return Conflict({"state": [f"This assignment is {state}; {consequence}"], "assignment_state": state})


# Spec fields the platform alone reads (its acceptance bars): a worker has no use for
# them, and an agent that predates one would refuse the spec as unknown.
PLATFORM_SPEC_FIELDS = frozenset({"min_loss_reduction"})


def worker_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The task's spec as its worker gets it."""
    return {key: value for key, value in spec.items() if key not in PLATFORM_SPEC_FIELDS}


def node_spec(assignment: Assignment) -> dict[str, Any]:
    """The spec the assignment's node runs, as it is sent and as its result is checked: the
    worker's spec with what it leaves to the node's hardware fixed by the kind from the
    capabilities the node registered (``Kind.node_spec``). A node reports its capabilities
    when its agent starts, and an agent that starts abandons the jobs it held, so a job's
    node spec does not change while the job runs."""
    task = assignment.task
    caps = assignment.worker.capabilities if isinstance(assignment.worker.capabilities, dict) else {}
    return dict(KINDS[task.kind].node_spec(worker_spec(task.spec), caps))


def dataset_url(assignment: Assignment) -> str:
    """The path, on this server, of the assignment's dataset (a folder's file: ``<name>/`` after it)."""
    return f"/api/v1/assignments/{assignment.pk}/dataset/"


def folder_manifest(split: heldout.Prepared, url_of: Callable[[str], str]) -> bytes:
    """What a node is served for a worker-facing folder: each file's name, size, sha256 and
    URL (``url_of(name)``), as canonical JSON (the same bytes every time: the job names
    their sha256)."""
    files = [{**f, "url": url_of(f["name"])} for f in split.worker_files]
    return json.dumps({"format": SHARDS_FORMAT, "files": files}, sort_keys=True, separators=(",", ":")).encode()


def data_entry(split: heldout.Prepared, url: str, fmt: str) -> dict[str, Any]:
    """The job's ``dataset`` entry for a split's worker part served at ``url``: a file's
    sha256 and size, or for a folder its manifest's (format ``shards``)."""
    if not split.worker_files:
        return {"url": url, "sha256": split.worker_sha256, "size_bytes": split.worker_size, "format": fmt}
    manifest = folder_manifest(split, lambda name: f"{url}{name}/")
    return {
        "url": url,
        "sha256": hashlib.sha256(manifest).hexdigest(),
        "size_bytes": len(manifest),
        "format": SHARDS_FORMAT,
    }


@dataclass(frozen=True)
class ServedFile:
    """A file the dataset endpoint sends: its storage opener, size and download name."""

    open: Callable[[], IO[bytes]]
    size: int
    filename: str


def served_dataset(assignment: Assignment, name: str | None = None) -> ServedFile | bytes:
    """What the assignment's worker downloads: the dataset file, a folder's manifest
    (bytes), or, with ``name``, one file of the folder. The one place that decides what a
    worker may download of its task's data: only while it works on the job, only the
    worker-facing part of a held-out split (never the upload), only files the split listed.

    ``assignment`` is the calling worker's own. Raises NotFound or a 409 Conflict."""
    if assignment.state not in (Assignment.State.OFFERED, Assignment.State.RUNNING):
        # The job is over: the requester's data goes to a worker only while it works on it.
        raise wrong_state(assignment.state, "its dataset is closed.")
    task = assignment.task
    dataset = task.dataset
    if dataset is None:
        raise NotFound("This task has no dataset.")
    filename = f"{dataset.pk}.{dataset.format}"
    if not heldout.needs_preparation(task):
        if name is not None:
            raise NotFound("This task's dataset is one file.")
        return ServedFile(partial(dataset.file.open, "rb"), dataset.size_bytes, filename)
    # Only the worker-facing part: the held-out rows never leave the platform.
    split = heldout.prepared(task)
    if split is None or split.worker is None:
        raise NotFound("This task's data is not prepared yet.")
    return served_part(task, split, name, filename, dataset_url(assignment))


def served_part(task: Task, split: heldout.Prepared, name: str | None, filename: str, url: str) -> ServedFile | bytes:
    """``task``'s split's worker-facing part as a node downloads it from ``url``: the file (as
    ``filename``), a folder's manifest, or with ``name`` one file the folder lists (a virtual
    shard assembled from the upload: ``heldout.open_file``); NotFound for any other
    name. The held-out part, and the upload itself, are never among them."""
    assert split.worker is not None
    if name is None:
        if split.worker_files:
            return folder_manifest(split, lambda listed: f"{url}{listed}/")
        return ServedFile(partial(default_storage.open, split.worker, "rb"), split.worker_size, filename)
    listed = split.worker_file(name)
    if listed is None:
        raise NotFound("No such file in this task's dataset.")
    return ServedFile(partial(heldout.open_file, task, split.worker, name), listed["size_bytes"], name)


def describe(assignment: Assignment) -> dict[str, Any]:
    """Everything the node needs to run the job and sign its result.

    For a kind with a held-out split the dataset is the prepared worker-facing part, never
    the upload (see workers.assignments.heldout); a folder's is format ``shards``, whose URL
    serves the folder's manifest (``data_entry``, ``folder_manifest``).
    The ``url`` is a path on this server: the node asks the server it registered with,
    whatever Host or scheme a proxy in between saw."""
    task = assignment.task
    dataset = task.dataset
    entry: dict[str, Any] | None = None
    if dataset is not None:
        url = dataset_url(assignment)
        entry = {"url": url, "sha256": dataset.sha256, "size_bytes": dataset.size_bytes, "format": dataset.format}
        if heldout.needs_preparation(task):
            split = heldout.prepared(task)
            if split is None or split.worker is None:
                raise Conflict({"dataset": ["This task's data is not prepared yet."]})
            entry = data_entry(split, url, dataset.format)
    return {
        "id": str(assignment.pk),
        "task_id": str(task.pk),
        "kind": task.kind,
        "spec": node_spec(assignment),
        "attempt": assignment.attempt,
        "state": assignment.state,
        "deadline": assignment.deadline.isoformat(),
        "seed": {
            "block_hash": assignment.seed_block_hash,
            "worker_address": assignment.worker.address,
            "task_id": str(task.pk),
        },
        "dataset": entry,
        "artifacts": list(KINDS[task.kind].artifacts),
        "submit": submit_template(assignment.worker),
    }


def submit_template(worker: Worker) -> dict[str, Any]:
    """The SUBMIT_RESULT fields the worker signs: everything but the payload is fixed here."""
    return {
        "chain_id": settings.LEDGER_CHAIN_ID,
        "type": encoding.SUBMIT_RESULT,
        "from": worker.address,
        "to": worker.address,
        "amount": 0,
        "fee": gas.fee_for(encoding.SUBMIT_RESULT, settings.LEDGER_GAS_PRICE),
        "nonce": ledger.next_nonce(worker.address),
        "gas_price": settings.LEDGER_GAS_PRICE,
        "gas_limit": gas.gas_limit(encoding.SUBMIT_RESULT),
    }


def start(worker: Worker, assignment_id: UUID) -> Assignment:
    """offered → running; the task becomes running with its first started replica."""
    with transaction.atomic():
        assignment, task = lifecycle.lock(assignment_id, worker=worker)
        if assignment.state == Assignment.State.RUNNING:
            return assignment
        if assignment.state != Assignment.State.OFFERED:
            raise wrong_state(assignment.state, "it cannot start.")
        if assignment.deadline <= timezone.now():
            raise Conflict({"state": ["This assignment's deadline has passed."]})
        assignment.state = Assignment.State.RUNNING
        assignment.started_at = timezone.now()
        assignment.save(update_fields=["state", "started_at"])
        transaction.on_commit(partial(worker_changed, worker.pk))
        lifecycle.sync_status(task, f"{worker.name} started.", reason=None)
    return assignment


def fail(worker: Worker, assignment_id: UUID, reason: Any) -> Assignment:
    """The node gives up on a job it cannot finish: offered/running → expired, task reopened.

    Reporting costs the worker less reputation than going silent (which the scheduler
    finds only at the heartbeat timeout), so an honest node reports. Repeating the call
    on the now expired assignment is harmless: 409, nothing changes.
    """
    if not isinstance(reason, str) or not reason.strip():
        raise ValidationError({"reason": ["Say why the job failed (a non-empty string)."]})
    reason = " ".join(reason.split())[:250]
    with transaction.atomic():
        assignment, task = lifecycle.lock(assignment_id, worker=worker)
        if assignment.state not in (Assignment.State.OFFERED, Assignment.State.RUNNING):
            raise wrong_state(assignment.state, "it cannot fail now.")
        assignment.state = Assignment.State.EXPIRED
        assignment.settled_at = timezone.now()
        assignment.reason = f"{GAVE_UP}{reason}"
        assignment.save(update_fields=["state", "settled_at", "reason"])
        transaction.on_commit(partial(worker_changed, worker.pk))
        transaction.on_commit(partial(uploads.discard, assignment.pk))
        lifecycle.penalise(worker.pk, FAIL_PENALTY)
        lifecycle.sync_status(task, f"{worker.name} could not finish ({reason[:150]}); reassigning.")
        transaction.on_commit(partial(lifecycle.schedule_later, task.pk))
    return assignment


def abandon_running(worker: Worker) -> list[Assignment]:
    """A node that (re)starts runs nothing: its running jobs were lost with the old process.

    Each is given up as ``fail`` would (reported, so the lighter penalty) and reassigned
    at once, instead of waiting for the deadline while the node heartbeats again. Offered
    jobs stay: their messages are still on the node's queue. Returns what was given up.
    """
    abandoned = []
    for pk in Assignment.objects.filter(worker=worker, state=Assignment.State.RUNNING).values_list("pk", flat=True):
        try:
            abandoned.append(fail(worker, pk, "the node restarted and lost the job"))
        except Conflict:
            continue  # settled meanwhile
    return abandoned


def artifact_path(assignment: Assignment | UUID, name: str) -> str:
    pk = assignment.pk if isinstance(assignment, Assignment) else assignment
    return f"{uploads.artifact_dir(pk)}/{name}"


def store_artifact(
    worker: Worker, assignment_id: UUID, name: str, upload: UploadedFile | None, content_range: str | None = None
) -> dict[str, Any]:
    """Keep one of the kind's declared artifacts for this running assignment, whole or in
    ordered parts (``workers/assignments/uploads.py``); ``complete`` says whether it is all there.

    Once the result is signed the declared artifacts are closed, and a trained kind's node
    uploads only the checkpoints its challenge names (``workers.assignments.proof``): each
    must hash to its leaf of trace.json, and the last one moves the assignment to submitted
    (``state`` in the answer)."""
    try:
        assignment = Assignment.objects.select_related("task").get(pk=assignment_id, worker=worker)
        allowed = KINDS[assignment.task.kind].artifacts
        checkpoint = is_checkpoint_name(name) and proof.proves_training(assignment.task.kind)
        if not _ARTIFACT_NAME.match(name) or (name not in allowed and not checkpoint):
            raise ValidationError({"name": [f"Expected one of: {', '.join(allowed)}."]})
        if upload is None or not upload.size:
            raise ValidationError({"file": ["The artifact is empty."]})
        part = parse_content_range(content_range)
        limit = settings.CHECKPOINT_MAX_BYTES if checkpoint else settings.ARTIFACT_MAX_BYTES
        uploads.check_size(upload.size if part is None else part[2], limit)
        path = artifact_path(assignment, name)
        with uploads.exclusive(assignment.pk):
            # Read under the lock: a submission or expiry that got there first closed them.
            assignment.refresh_from_db(fields=["state", "result", "challenge"])
            if assignment.state != Assignment.State.RUNNING:
                raise wrong_state(assignment.state, "artifacts are closed.")
            if checkpoint:
                proof.check_challenged(name, bool(assignment.result), list(assignment.challenge))
            elif assignment.result:
                raise Conflict({"name": [f"The result is signed; {name} can no longer change."]})
            if part is None:
                uploads.save_whole(path, upload)
                info = {"name": name, "size_bytes": upload.size, "complete": True}
            else:
                info = {"name": name, **uploads.save_part(path, upload, *part)}
            if checkpoint and info["complete"]:
                proof.check_checkpoint(assignment, name)
                if not proof.missing_checkpoints(assignment):
                    info["state"] = _challenge_answered(worker, assignment.pk).state
                    uploads.close(assignment.pk)
            return info
    finally:
        if upload is not None:
            # After the storage moved a large upload's temporary file into place: close it
            # here, where Django tolerates the missing file, not in the garbage collector.
            upload.close()


def submit(worker: Worker, assignment_id: UUID, body: Any) -> Assignment:
    """Accept a signed result for verification: running → submitted, task → verifying.

    The ComputeResult must name this task and this worker and carry a valid signature by
    the worker's registered key; the SUBMIT_RESULT transaction must be the template the
    platform gave, signed by the same key. A second submission for a settled or already
    submitted assignment is refused with 409 and changes nothing.

    A trained kind's result must commit to its training trace (``proof.commitment``). Its
    assignment then stays running with the drawn challenge (``Assignment.challenge``,
    ``proof.answer``) until the challenged checkpoints are uploaded (``store_artifact``); the
    same signed result sent again is answered with the same challenge, a different one is
    refused.
    """
    if not isinstance(body, dict):
        raise ValidationError({"non_field_errors": ["Expected a JSON object."]})
    try:
        result = parse_compute_result(body.get("compute_result"))
    except EncodingError as exc:
        raise ValidationError({"compute_result": [str(exc)]}) from None
    tx_body = body.get("transaction")
    if not isinstance(tx_body, dict):
        raise ValidationError({"transaction": ["Expected the signed SUBMIT_RESULT transaction."]})
    # The artifact lock first: an upload still writing finishes before the artifacts close.
    with uploads.exclusive(assignment_id):
        assignment = _close_with_result(worker, assignment_id, result, tx_body)
        if assignment.state != Assignment.State.RUNNING:
            uploads.close(assignment_id)
    return assignment


def _close_with_result(worker: Worker, assignment_id: UUID, result: Any, tx_body: dict[str, Any]) -> Assignment:
    with transaction.atomic():
        assignment, task = lifecycle.lock(assignment_id, worker=worker)
        if assignment.state != Assignment.State.RUNNING:
            raise wrong_state(assignment.state, "it takes no result.")
        if assignment.result:
            if assignment.result == {"compute_result": result.to_json(), "transaction": tx_body}:
                return assignment  # its answer was lost: the same challenge again
            raise Conflict({"state": ["This assignment's result is signed; upload the checkpoints it was asked for."]})
        if result.task_id != str(assignment.task_id):
            raise ValidationError({"compute_result": ["task_id is not this assignment's task."]})
        if result.worker_address != worker.address:
            raise ValidationError({"compute_result": ["worker_address is not this worker."]})
        if not verify_compute_result(result, bytes.fromhex(worker.public_key)):
            raise ValidationError({"compute_result": ["The signature does not verify with this worker's key."]})
        _check_submit_tx(worker, tx_body, result, pay=_job_pay(assignment, task))
        commit = proof.commitment(result.proof) if proof.proves_training(task.kind) else None
        missing = [n for n in KINDS[task.kind].artifacts if not default_storage.exists(artifact_path(assignment, n))]
        if missing:
            raise ValidationError({"artifacts": [f"Upload {', '.join(missing)} before submitting."]})
        assignment.result = {"compute_result": result.to_json(), "transaction": tx_body}
        if commit is not None and _trace_matches(assignment):
            assignment.challenge = proof.draw(commit)
            assignment.save(update_fields=["result", "challenge"])
            count = len(proof.checkpoint_names(assignment.challenge))
            lifecycle.sync_status(
                task,
                f"{worker.name} signed its result; it uploads the {count} checkpoints the platform picked to re-execute.",
                reason=None,
            )
            return assignment
        # Without a trace that matches its signed root there is nothing to challenge: its
        # verification rejects it, saying why.
        return _to_verification(assignment, task, f"{worker.name} submitted a result.")


def submission_answer(assignment: Assignment) -> dict[str, Any]:
    """The answer to a result: the assignment's state and, while a trained kind's challenge
    is open, the segments picked and the checkpoint files to upload."""
    if assignment.state == Assignment.State.RUNNING and assignment.result:
        return {"state": assignment.state, "challenge": proof.answer(assignment)}
    return {"state": assignment.state}


def _trace_matches(assignment: Assignment) -> bool:
    try:
        proof.committed_trace(assignment)
    except TraceError:
        return False
    return True


def _to_verification(assignment: Assignment, task: Task, message: str) -> Assignment:
    """running → submitted and ask for the verification (task and assignment rows locked)."""
    assignment.state = Assignment.State.SUBMITTED
    assignment.submitted_at = assignment.verify_sent_at = timezone.now()
    assignment.save(update_fields=["state", "submitted_at", "verify_sent_at", "result"])
    transaction.on_commit(partial(worker_changed, assignment.worker_id))
    lifecycle.sync_status(task, message, reason=None)
    transaction.on_commit(lambda: _enqueue_verification(assignment.pk))
    return assignment


def _challenge_answered(worker: Worker, assignment_id: UUID) -> Assignment:
    """Every challenged checkpoint is in: running → submitted, verification asked for
    (call under the assignment's artifact lock)."""
    with transaction.atomic():
        assignment, task = lifecycle.lock(assignment_id, worker=worker)
        if assignment.state != Assignment.State.RUNNING or not assignment.result:
            return assignment
        count = len(proof.checkpoint_names(list(assignment.challenge)))
        return _to_verification(
            assignment, task, f"{worker.name} uploaded the {count} checkpoints the platform picked; verifying."
        )


def signed_tx_from_json(body: dict[str, Any]) -> tuple[encoding.Tx, bytes]:
    """A transaction and its signature from the JSON form a node submits (``protocol.encoding.tx_from_json``
    with the hex signature beside it); ValidationError naming ``transaction`` on bad shape."""
    try:
        tx = encoding.tx_from_json(body)
        signature = bytes.fromhex(str(body["signature"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValidationError({"transaction": [f"Malformed transaction: {exc}"]}) from None
    return tx, signature


def reward_per_replica(task: Task) -> int:
    """What an accepted replica offered before the market earns: the task's price estimate,
    bounded by the budget share, the platform's fee out of it."""
    return min(task.price_estimate, task.budget // task.replication)


def _job_pay(assignment: Assignment, task: Task) -> int:
    """What the job pays its node if verified: its ask (before the market: the reward less
    the platform's share, as ``ledger.release_to_worker`` splits it)."""
    if assignment.price is not None:
        return assignment.price
    reward = reward_per_replica(task)
    return reward - reward * settings.LEDGER_PLATFORM_FEE_BPS // 10_000


def _check_submit_tx(worker: Worker, tx_body: dict[str, Any], result: Any, *, pay: int) -> None:
    """The transaction must be exactly the template plus this result, signed by the worker.

    Except its gas price: a node signs the template it fetched when its job started, and
    the platform's gas price may have changed since (docs/protocol.md). Any price from
    today's up is taken, the fee matching it, as long as the fee fits in what the job pays
    (settlement charges it to the reward it releases first)."""
    template = submit_template(worker)
    price = tx_body.get("gas_price")
    if type(price) is int and price != template["gas_price"] and price >= template["gas_price"]:
        fee = price * template["gas_limit"]
        if fee > pay:
            raise ValidationError(
                {"transaction": [f"gas_price {price} makes a fee of {fee} units, more than the job pays ({pay})."]}
            )
        template = {**template, "gas_price": price, "fee": fee}
    unknown = sorted(str(key)[:40] for key in set(tx_body) - {*template, "payload", "public_key", "signature"})
    if unknown:
        # Stored with the result as sent: nothing unchecked may ride along.
        raise ValidationError({"transaction": [f"Unknown field(s): {', '.join(unknown[:5])}."]})
    for key, value in template.items():
        got = tx_body.get(key)
        # Exact types too: false == 0 and 1.0 == 1 in Python, but not in the template.
        if type(got) is not type(value) or got != value:
            raise ValidationError({"transaction": [f"{key} must be {value!r}."]})
    # Compared as canonical JSON, not with ==: in Python true == 1, so == would let a payload
    # signed with "nonce": true through here, for settlement to refuse for good.
    try:
        same = encoding.canonical_json(tx_body.get("payload")) == encoding.canonical_json(
            {"compute_result": result.to_json()}
        )
    except EncodingError:
        same = False
    if not same:
        raise ValidationError({"transaction": ["payload must be {'compute_result': <the ComputeResult>}."]})
    tx, signature = signed_tx_from_json(tx_body)
    try:
        signed = tx.public_key.hex() == worker.public_key and verify_tx(tx, signature)
    except EncodingError as exc:  # e.g. a proof that makes the payload larger than a transaction may carry
        raise ValidationError({"transaction": [str(exc)]}) from None
    if not signed:
        raise ValidationError({"transaction": ["The signature does not verify with this worker's key."]})


def _enqueue_verification(assignment_id: UUID) -> None:
    enqueue("workers.verify_assignment", str(assignment_id))


def resend_stalled_verifications(now: datetime | None = None) -> int:
    """Ask again for the verification of results still unsettled VERIFY_RESEND_AFTER
    seconds after it was last asked for; returns how many.

    A verification message can be lost (a broker restarted without its data, retries
    used up on a database outage), and then nothing else would ever settle the result:
    the worker unpaid, the requester's escrow locked. A message sent again for a result
    whose verification is merely slow is harmless: settling is idempotent, and the
    second run finds it settled. Each result is claimed with a conditional update, so
    two control workers never both send it.
    """
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.VERIFY_RESEND_AFTER)
    stalled = Assignment.objects.filter(state=Assignment.State.SUBMITTED).filter(
        Q(verify_sent_at__lt=cutoff) | Q(verify_sent_at__isnull=True, submitted_at__lt=cutoff)
    )
    sent = 0
    for pk in list(stalled.values_list("pk", flat=True)[:100]):
        claimed = (
            Assignment.objects.filter(pk=pk, state=Assignment.State.SUBMITTED)
            .filter(Q(verify_sent_at__lt=cutoff) | Q(verify_sent_at__isnull=True))
            .update(verify_sent_at=now)
        )
        if claimed:
            log.warning("verification of %s stalled; asking for it again", pk)
            _enqueue_verification(pk)
            sent += 1
    return sent


def get_for_worker(worker: Worker, assignment_id: Any) -> Assignment:
    found = Assignment.objects.filter(pk=assignment_id, worker=worker).first()
    if found is None:
        raise NotFound("No such assignment for this worker.")
    return found


def source_model_file(assignment: Assignment, name: str) -> str:
    """Storage name of one file of the model an inference assignment runs.

    The model is the accepted artifacts of the spec's ``source_task``; only the source
    kind's model files are served, and only while the assignment is offered or running.
    Anything else is reported missing.
    """
    if assignment.state not in (Assignment.State.OFFERED, Assignment.State.RUNNING):
        raise wrong_state(assignment.state, "its model is closed.")
    source_id = assignment.task.spec.get("source_task") if isinstance(assignment.task.spec, dict) else None
    source = (
        Task.objects.filter(pk=source_id, owner_id=assignment.task.owner_id, status=TaskStatus.COMPLETED).first()
        if source_id
        else None
    )
    if source is None or name not in KINDS[source.kind].model_files:
        raise NotFound("No such model file for this assignment.")
    path = _accepted_artifact(source, name)
    if path is None:
        raise NotFound("No such model file for this assignment.")
    return path


def _accepted_artifact(task: Task, name: str) -> str | None:
    """Storage name of artifact ``name`` of the task's first accepted result, if it exists."""
    accepted = Assignment.objects.filter(task=task, state=Assignment.State.ACCEPTED).order_by("settled_at").first()
    path = artifact_path(accepted, name) if accepted is not None else ""
    return path if path and default_storage.exists(path) else None


def ledger_trail(task: Task) -> list[Transaction]:
    """The task's transactions on the ledger (ledger.services.task_transactions), for the
    workers that were ever assigned to it."""
    workers = Assignment.objects.filter(task=task).values_list("worker__address", flat=True).distinct()
    return ledger.task_transactions(task.pk, list(workers))


def result_files(task: Task) -> list[str]:
    """Names of the verified result's files the requester can download (none until completed)."""
    if task.status != TaskStatus.COMPLETED or task.kind not in KINDS:
        return []
    return [name for name in KINDS[task.kind].artifacts if _accepted_artifact(task, name) is not None]


def result_file(task: Task, name: str) -> str:
    """Storage name of one file of a completed task's verified result.

    The caller has already checked that the task is the requester's own (a tenant-scoped
    queryset). Only the kind's declared artifacts of an accepted assignment are served.
    """
    if task.status != TaskStatus.COMPLETED:
        raise Conflict({"status": [f"This task is {task.status}; results are served once it is completed."]})
    path = _accepted_artifact(task, name) if task.kind in KINDS and name in KINDS[task.kind].artifacts else None
    if path is None:
        raise NotFound(f"This task has no result file named {name!r}.")
    return path
