"""Delegated re-execution: a trained result's challenged segments re-executed by a node of
another provider, with canaries, and the platform as referee (docs/proof-of-training.md).

With ``PROOFWORK_SEGMENT_REEXECUTION=delegated``, once a trained result's challenged
checkpoints are in, its verification (``workers.tasks.verify_assignment``) first offers a
``VerificationJob`` to one online node, drawn at random, of a provider that is neither the
worker's nor the requester's, whose agent runs the kind and takes verification jobs
(``FEATURE``). The job's slots are the challenged segments under random names, with
``PROOFWORK_DELEGATE_CANARIES`` of them replaced by canaries: the segment's real start with
an end the platform trained again from it, some of its steps on another step's rows
(``training.replay.canary_state``): a genuine training state, which an honest re-execution
finds at least ``CANARY_DISTANCE`` steps' updates away. The segment after a canary, when it
was challenged too, starts from that state (a decoy: a verifier cannot find the canary by a
checkpoint that differs where two slots meet); the platform re-executes the real segments
behind the canaries and decoys itself. The verifier downloads the spec, the
worker's data and each slot's two checkpoints (``workers.api.verification_views``), and
answers with each slot's distance, signed with its node key (``answer_message``).

The verdict (``referee``, from ``workers.verification.base.training_proof_problem``):

1. the platform re-executes the segments behind the canaries; one that fails rejects the
   worker's result, and the verifier's answer is not judged (``MOOT``);
2. a canary the verifier passed: it did not compute. Its answer is discarded (``CAUGHT``),
   its node loses reputation, and the platform re-executes every segment itself;
3. a real segment the verifier failed: the platform re-executes the disputed segments
   (referee). One that fails there rejects the result (``UPHELD``); if all pass, the
   verifier was wrong: answer discarded (``OVERRULED``), reputation lost, and the platform
   re-executes the rest itself;
4. otherwise the verifier's passes stand for the real segments (``AGREED``).

No eligible verifier, an answer not in by ``PROOFWORK_DELEGATE_WAIT``, or a kind without a
canary: the platform re-executes every segment itself, as in ``platform`` mode. Verifier
nodes are not paid yet.
"""

from __future__ import annotations

import logging
import secrets
import shutil
from collections.abc import Callable
from contextlib import nullcontext
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

from django.conf import settings
from django.core.files.storage import default_storage
from django.db import transaction
from django.db.models import Case, F, Value, When
from django.utils import timezone
from rest_framework.exceptions import NotFound, ValidationError

from config.celery import enqueue
from marketplace.models import Task
from protocol import keys
from protocol.encoding import EncodingError, canonical_json
from training import kinds as plugin_kinds
from training.artifacts import ArtifactError
from training.replay import TOLERANCE, within
from training.trace import Leaf, Segment, checkpoint_name, file_sha256
from workers.assignments import heldout, lifecycle, nodebroker, proof, supply
from workers.assignments.jobs import Conflict, ServedFile, artifact_path, data_entry, node_spec, served_part
from workers.models import UNSETTLED, Assignment, VerificationJob, Worker

log = logging.getLogger(__name__)

# The capability an agent lists (``features``) once it takes verification jobs.
FEATURE = "verify_segments"
# What a verifier node signs: this prefix, then the canonical JSON of its answer.
ANSWER_DOMAIN = b"proofwork/verification-answer/v1\n"
# Reputation a verifier found wrong loses (as a rejected result's worker does).
VERIFIER_PENALTY = 10
MAX_PROBLEM_CHARS = 300
# Segments tried for a canary before the platform gives up delegating a result and
# re-executes it itself: each try re-executes the segment once or more.
CANARY_TRIES = 3
REAL, CANARY, DECOY = "real", "canary", "decoy"

Job = VerificationJob
# Which verifier, which segments become canaries and the slots' order: unpredictable to
# every node (the operating system's randomness).
_random = secrets.SystemRandom()
Replay = Callable[[list[int]], str]


def delegated(assignment: Assignment) -> bool:
    """Whether this result's segments go to a verifier node: delegated mode, a kind with a
    measure and a canary, and a challenge to delegate."""
    kind = plugin_kinds.KINDS.get(assignment.task.kind)
    return (
        settings.SEGMENT_REEXECUTION == "delegated"
        and kind is not None
        and kind.measure is not None
        and kind.canary is not None
        and bool(assignment.challenge)
    )


def waiting(
    assignment: Assignment, now: datetime | None = None, *, ready: Callable[[Assignment], bool] | None = None
) -> bool:
    """Whether the result's verification waits for a verifier node (called first by each
    verification run of a submitted result): the job is offered here when there is none
    yet and ``ready(assignment)`` holds (the chain passes what needs no re-execution), and
    one past its deadline expires here (the platform then re-executes itself)."""
    if not delegated(assignment):
        return False
    job = Job.objects.filter(assignment=assignment).first()
    if job is None:
        return (ready is None or ready(assignment)) and offer(assignment) is not None
    if job.state != Job.State.OFFERED:
        return False
    if job.deadline > (now or timezone.now()):
        return True
    _expire(job.pk, ask_again=False)  # this run goes on to re-execute them
    return False


def eligible_verifiers(assignment: Assignment) -> tuple[list[Worker], list[Worker]]:
    """Online nodes that may verify the result, as (free, busy): of neither the worker's
    provider nor the requester, registered for the kind (memory included) and taking
    verification jobs. A busy node holds a job of its own or an offered verification; it
    takes this one after it."""
    task = assignment.task
    # The run as its worker ran it: a batch the spec left to that node's GPU needs its memory.
    need = supply.Need.of(task.kind, node_spec(assignment), 0)
    pool = Worker.objects.online().exclude(owner_id__in={assignment.worker.owner_id, task.owner_id})
    fitting = [w for w in pool if supply.misfit(w, need) is None and FEATURE in _features(w)]
    busy = set(
        Assignment.objects.filter(worker__in=fitting, state__in=UNSETTLED).values_list("worker_id", flat=True)
    ) | set(Job.objects.filter(verifier__in=fitting, state=Job.State.OFFERED).values_list("verifier_id", flat=True))
    return [w for w in fitting if w.pk not in busy], [w for w in fitting if w.pk in busy]


def _features(worker: Worker) -> set[str]:
    caps = worker.capabilities if isinstance(worker.capabilities, dict) else {}
    features = caps.get("features")
    return {f for f in features if isinstance(f, str)} if isinstance(features, list) else set()


def offer(assignment: Assignment) -> Job | None:
    """Offer the result's challenged segments, canaries mixed in, to a verifier node drawn
    at random (among the free ones when there are any); None when there is none, or the
    challenge is too short to hide a canary in: the platform then re-executes itself."""
    free, busy = eligible_verifiers(assignment)
    if not free and not busy:
        log.info("no verifier node for %s: the platform re-executes its segments", assignment.pk)
        return None
    verifier = _random.choice(free or busy)
    job_id = uuid4()
    try:
        slots = _slots(assignment, job_id)
    except Exception:  # a checkpoint the canary cannot be made from: the platform's own replay says why
        log.exception("no canary could be made for %s: the platform re-executes its segments", assignment.pk)
        _discard_files(job_id)
        return None
    if slots is None:
        _discard_files(job_id)
        return None
    with transaction.atomic():
        locked, _ = lifecycle.lock(assignment.pk)
        earlier = Job.objects.filter(assignment=locked).first()
        if locked.state != Assignment.State.SUBMITTED or earlier is not None:
            # Settled meanwhile, or another run of its verification offered it first.
            transaction.on_commit(partial(_discard_files, job_id))
            return earlier if locked.state == Assignment.State.SUBMITTED else None
        job = Job.objects.create(
            id=job_id,
            assignment=locked,
            verifier=verifier,
            slots=slots,
            deadline=timezone.now() + timedelta(seconds=settings.DELEGATE_WAIT),
        )
        transaction.on_commit(partial(_publish, verifier.address, str(job_id)))
    log.info("verification of %s offered to %s (job %s)", assignment.pk, verifier.address, job_id)
    return job


def _publish(address: str, job_id: str) -> None:
    try:
        nodebroker.publish_verification(address, job_id)
    except nodebroker.PUBLISH_ERRORS:
        # Unanswered, the job expires at its deadline and the platform re-executes itself.
        log.exception("verification job %s could not be sent to %s", job_id, address)


def job_dir(job_id: UUID | str) -> str:
    """Where a verification job's canary files are kept: not among the result's artifacts."""
    return f"verifications/{job_id}"


def _discard_files(job_id: UUID | str) -> None:
    shutil.rmtree(default_storage.path(job_dir(job_id)), ignore_errors=True)


def _leaf(leaf: Leaf, file: str) -> dict[str, Any]:
    return {
        "index": leaf.index,
        "step": leaf.step,
        "state_sha256": leaf.state_sha256,
        "weights_sha256": leaf.weights_sha256,
        "file": file,
    }


def _slots(assignment: Assignment, job_id: UUID) -> list[dict[str, Any]] | None:
    """The job's slots, shuffled, canary files written; None when no canary can be made
    (``CANARY_TRIES`` segments tried) or no real segment would be left for the verifier."""
    segments = sorted(int(i) for i in assignment.challenge)
    trace = proof.committed_trace(assignment)
    canary = plugin_kinds.KINDS[assignment.task.kind].canary
    assert canary is not None  # delegated() checked it
    folder = Path(default_storage.path(job_dir(job_id)))
    folder.mkdir(parents=True, exist_ok=True)
    data = data_file(assignment.task)
    canaries: set[int] = set()
    decoys: set[int] = set()
    moved: dict[int, dict[str, Any]] = {}  # checkpoint index → the canary end standing for it
    failed = 0
    for base in _random.sample(segments, len(segments)):
        if len(canaries) >= settings.DELEGATE_CANARIES or failed >= CANARY_TRIES:
            break
        taken = canaries | decoys
        follower = {base + 1} & set(segments)
        if base in taken or base - 1 in canaries or follower & taken:
            continue
        if not set(segments) - taken - {base} - follower:
            continue  # nothing real left for the verifier
        start, end = trace.leaves[base], trace.leaves[base + 1]
        name = f"{job_dir(job_id)}/{secrets.token_hex(8)}.safetensors"
        committed = Segment(
            start=Path(default_storage.path(artifact_path(assignment, checkpoint_name(base)))),
            start_leaf=start,
            end=Path(default_storage.path(artifact_path(assignment, checkpoint_name(base + 1)))),
            end_leaf=end,
        )
        try:
            # The worker's share as the training layer reads it (virtual shards: from the upload).
            with nullcontext(None) if data is None else heldout.readable(assignment.task, data[0]) as share:
                weights = canary(node_spec(assignment), share, committed, Path(default_storage.path(name)))
        except (ValueError, ArtifactError) as exc:
            log.info("no canary of segment %d of %s: %s", base, assignment.pk, exc)
            failed += 1
            continue
        canaries.add(base)
        decoys |= follower
        moved[base + 1] = {
            "index": end.index,
            "step": end.step,
            "state_sha256": file_sha256(Path(default_storage.path(name))),
            "weights_sha256": weights,
            "file": name,
        }
    if not canaries:
        return None

    def point(index: int) -> dict[str, Any]:
        return moved.get(index) or _leaf(trace.leaves[index], artifact_path(assignment, checkpoint_name(index)))

    slots = [
        {
            "id": secrets.token_hex(8),
            "segment": i,
            "role": CANARY if i in canaries else DECOY if i in decoys else REAL,
            "start": point(i),
            "end": point(i + 1),
        }
        for i in segments
    ]
    _random.shuffle(slots)
    return slots


# --- what the verifier node sees --------------------------------------------------------


def for_verifier(worker: Worker, job_id: Any) -> Job:
    """The verifier's own job, still open; 404 for anyone else's, 409 once closed."""
    job = Job.objects.select_related("assignment__task__dataset").filter(pk=job_id, verifier=worker).first()
    if job is None:
        raise NotFound("No such verification job for this node.")
    if job.state != Job.State.OFFERED:
        raise Conflict({"state": [f"This verification job is {job.state}; its files are closed."]})
    if job.deadline <= timezone.now():
        raise Conflict({"state": ["This verification job's deadline has passed."]})
    if job.assignment.state != Assignment.State.SUBMITTED:
        raise Conflict({"state": ["The result this job verifies is settled; its files are closed."]})
    return job


def describe(job: Job) -> dict[str, Any]:
    """What the verifier node needs, and nothing that names the worker, the task or which
    slot is a canary: the kind, the spec, the worker's data and each slot's two checkpoints."""
    task = job.assignment.task
    data = data_file(task)
    base = f"/api/v1/verifications/{job.pk}"
    return {
        "id": str(job.pk),
        "kind": task.kind,
        "spec": node_spec(job.assignment),  # the run as its worker ran it, not as this node would
        "deadline": job.deadline.isoformat(),
        "tolerance": TOLERANCE,
        "dataset": None if data is None else data_entry_of(task, data, f"{base}/dataset/"),
        "slots": [
            {
                "id": slot["id"],
                **{
                    end: {
                        **{k: v for k, v in slot[end].items() if k != "file"},
                        "url": f"{base}/slots/{slot['id']}/{end}/",
                    }
                    for end in ("start", "end")
                },
            }
            for slot in job.slots
        ],
    }


def data_file(task: Task) -> tuple[str, str, int, str] | None:
    """The worker-facing data the task's worker trained on, as (storage name, sha256, size,
    format); the held-out part never leaves the platform. None: the spec generates its data."""
    dataset = task.dataset
    if dataset is None:
        return None
    if heldout.needs_preparation(task):
        split = heldout.prepared(task)
        if split is None or split.worker is None:
            raise NotFound("This task's data is not prepared.")
        return split.worker, split.worker_sha256, split.worker_size, dataset.format
    return str(dataset.file.name), dataset.sha256, dataset.size_bytes, dataset.format


def data_entry_of(task: Task, data: tuple[str, str, int, str], url: str) -> dict[str, Any]:
    """The job's ``dataset`` entry for ``data_file``'s answer served at ``url``: a prepared
    folder as its manifest (``jobs.data_entry``), a file as itself."""
    split = heldout.prepared(task) if heldout.needs_preparation(task) else None
    if split is not None and split.worker_files:
        return data_entry(split, url, data[3])
    return {"url": url, "sha256": data[1], "size_bytes": data[2], "format": data[3]}


def served_data(job: Job, name: str | None) -> ServedFile | bytes:
    """What the verifier node downloads of the worker's data: the file, a prepared folder's
    manifest, or with ``name`` one file the folder lists (``jobs.served_part``); never the
    held-out part."""
    task = job.assignment.task
    data = data_file(task)
    if data is None:
        raise NotFound("This job's task has no dataset.")
    stored, _, size, fmt = data
    split = heldout.prepared(task) if heldout.needs_preparation(task) else None
    if split is not None:
        return served_part(task, split, name, f"dataset.{fmt}", f"/api/v1/verifications/{job.pk}/dataset/")
    if name is not None:
        raise NotFound("This task's dataset is one file.")
    return ServedFile(partial(default_storage.open, stored, "rb"), size, f"dataset.{fmt}")


def slot_file(job: Job, slot_id: str, end: str) -> str:
    """The storage name of one end of one of the job's slots; 404 for anything else."""
    for slot in job.slots:
        if slot["id"] == slot_id and end in ("start", "end"):
            return str(slot[end]["file"])
    raise NotFound("No such file in this verification job.")


# --- the answer -------------------------------------------------------------------------


def answer_message(answer: dict[str, Any]) -> bytes:
    """The bytes a verifier signs: the domain, then the answer's canonical JSON (which names
    the job, so an answer to one job is no answer to another)."""
    return ANSWER_DOMAIN + canonical_json(answer, "answer")


def receive(worker: Worker, job_id: Any, body: Any) -> Job:
    """Take the verifier's signed answer: ``{"answer": {"verification": <job id>,
    "verifier": <its address>, "slots": [{"id", "distance_micro": int | null, "problem"}, …]},
    "signature": <hex>}``, one entry per slot. Anything else is a 400 naming the field, a
    signature that is not the node's a 400, a job already answered or expired a 409. The
    result's verification is asked for again once it is in."""
    if not isinstance(body, dict) or not isinstance(body.get("answer"), dict):
        raise ValidationError({"answer": ["Expected the signed answer object."]})
    answer, signature = body["answer"], body.get("signature")
    if set(answer) != {"verification", "verifier", "slots"}:
        raise ValidationError({"answer": ["Must hold exactly verification, verifier and slots."]})
    if answer["verification"] != str(job_id):
        raise ValidationError({"answer": ["This answer is for another verification job."]})
    if answer["verifier"] != worker.address:
        raise ValidationError({"answer": ["verifier is not this node's address."]})
    with transaction.atomic():
        job = for_verifier(worker, job_id)
        job = Job.objects.select_for_update().get(pk=job.pk)
        if job.state != Job.State.OFFERED:
            raise Conflict({"state": [f"This verification job is {job.state}."]})
        _check_slots(job, answer["slots"])
        try:
            signed = isinstance(signature, str) and keys.verify(
                bytes.fromhex(worker.public_key), answer_message(answer), bytes.fromhex(signature)
            )
        except (ValueError, EncodingError):
            signed = False
        if not signed:
            log.warning("attack? verification job %s: an answer not signed by %s", job.pk, worker.address)
            raise ValidationError({"signature": ["The signature does not verify with this node's key."]})
        job.state, job.answered_at = Job.State.ANSWERED, timezone.now()
        job.answer = {"answer": answer, "signature": signature}
        job.save(update_fields=["state", "answered_at", "answer"])
        transaction.on_commit(partial(enqueue, "workers.verify_assignment", str(job.assignment_id)))
    return job


def _check_slots(job: Job, slots: Any) -> None:
    wanted = {slot["id"] for slot in job.slots}
    if not isinstance(slots, list) or len(slots) != len(wanted):
        raise ValidationError({"slots": [f"Expected one entry for each of the {len(wanted)} slots."]})
    seen = set()
    for entry in slots:
        if not isinstance(entry, dict) or set(entry) != {"id", "distance_micro", "problem"}:
            raise ValidationError({"slots": ["Each entry holds exactly id, distance_micro and problem."]})
        distance, problem = entry["distance_micro"], entry["problem"]
        if entry["id"] not in wanted or entry["id"] in seen:
            raise ValidationError({"slots": [f"{str(entry['id'])[:20]!r} is not a slot of this job, or repeated."]})
        seen.add(entry["id"])
        if not (distance is None or (type(distance) is int and distance >= 0)):
            raise ValidationError({"slots": ["distance_micro is a non-negative integer, or null with a problem."]})
        if not isinstance(problem, str) or len(problem) > MAX_PROBLEM_CHARS or (distance is None) != bool(problem):
            raise ValidationError({"slots": ["problem says why a slot has no distance (at most 300 characters)."]})


def expire_overdue(now: datetime | None = None) -> int:
    """Periodic: jobs unanswered by their deadline expire and their results' verification is
    asked for again, for the platform to re-execute itself; returns how many. Then jobs
    whose result was settled without judging them (its verification given up, its task
    cancelled) are closed, and their canary files deleted (``close_unjudged``)."""
    now = now or timezone.now()
    expired = 0
    for pk in list(Job.objects.filter(state=Job.State.OFFERED, deadline__lte=now).values_list("pk", flat=True)[:100]):
        expired += _expire(pk)
    close_unjudged()
    return expired


def close_unjudged() -> int:
    """Close the jobs not yet judged whose result is no longer waiting to be verified: an
    offered one expires, an answered one is recorded as never judged; either way its canary
    files go, and the verifier's reputation is untouched. Returns how many."""
    closed = 0
    pending = Job.objects.filter(
        outcome=Job.Outcome.PENDING, state__in=(Job.State.OFFERED, Job.State.ANSWERED)
    ).exclude(assignment__state=Assignment.State.SUBMITTED)
    for pk in list(pending.values_list("pk", flat=True)[:100]):
        reason = "The result was settled without this job's answer."
        done = Job.objects.filter(pk=pk, outcome=Job.Outcome.PENDING).update(
            outcome=Job.Outcome.UNJUDGED,
            reason=reason,
            state=Case(When(state=Job.State.OFFERED, then=Value(Job.State.EXPIRED)), default=F("state")),
        )
        if done:
            _discard_files(pk)
            closed += 1
    return closed


def _expire(job_id: UUID, *, ask_again: bool = True) -> int:
    done = Job.objects.filter(pk=job_id, state=Job.State.OFFERED).update(
        state=Job.State.EXPIRED, reason="No answer by the deadline; the platform re-executed the segments itself."
    )
    if done:
        assignment_id = Job.objects.filter(pk=job_id).values_list("assignment_id", flat=True).get()
        log.warning("verification job %s unanswered; the platform re-executes %s itself", job_id, assignment_id)
        transaction.on_commit(partial(_discard_files, job_id))
        if ask_again:
            transaction.on_commit(partial(enqueue, "workers.verify_assignment", str(assignment_id)))
    return done


# --- the referee ------------------------------------------------------------------------


def referee(assignment: Assignment, replay: Replay) -> str:
    """Why the challenged segments do not hold ("" when they do), with a verifier's answer
    judged as the module docstring says; ``replay(segments)`` re-executes on the platform
    and says why the first that fails does. Without an answered job, every segment is
    re-executed on the platform."""
    segments = sorted(int(i) for i in assignment.challenge)
    job = Job.objects.filter(assignment=assignment, state=Job.State.ANSWERED).first()
    if job is None:
        return replay(segments)
    answers = {entry["id"]: entry for entry in job.answer["answer"]["slots"]}

    def passes(slot: dict[str, Any]) -> bool:
        distance = answers[slot["id"]]["distance_micro"]
        return distance is not None and within(distance / 1e6)

    own = sorted({s["segment"] for s in job.slots if s["role"] != REAL})
    real = [s for s in job.slots if s["role"] == REAL]
    problem = replay(own)
    if problem:
        _judge(job, Job.Outcome.MOOT, "The worker's result failed on a segment the platform re-executed itself.")
        return problem
    lazy = [s for s in job.slots if s["role"] == CANARY and passes(s)]
    if lazy:
        _judge(job, Job.Outcome.CAUGHT, f"Passed {len(lazy)} canary segment(s) that no honest re-execution passes.")
        return replay(sorted({s["segment"] for s in real}))
    disputed = sorted(s["segment"] for s in real if not passes(s))
    if not disputed:
        _judge(job, Job.Outcome.AGREED, "")
        return ""
    problem = replay(disputed)
    if problem:
        _judge(job, Job.Outcome.UPHELD, f"Failed segment(s) {disputed}; the platform's re-execution agreed.")
        return f"{problem} (found by a verifier node of another provider, confirmed by the platform)"
    _judge(job, Job.Outcome.OVERRULED, f"Failed segment(s) {disputed}, which pass on the platform.")
    return replay(sorted({s["segment"] for s in real} - set(disputed)))


def vouched(assignment: Assignment) -> set[int]:
    """The challenged segments whose passes the platform took from a verifier node's answer:
    the real slots of a job judged ``AGREED``; none otherwise."""
    job = Job.objects.filter(assignment=assignment, outcome=Job.Outcome.AGREED).first()
    return set() if job is None else {int(s["segment"]) for s in job.slots if s["role"] == REAL}


def _judge(job: Job, outcome: str, reason: str) -> None:
    """Record the verdict on the verifier's answer once (a verification run again finds it
    recorded); a verifier found wrong loses reputation. Its canary files go."""
    done = Job.objects.filter(pk=job.pk, outcome=Job.Outcome.PENDING).update(outcome=outcome, reason=reason[:300])
    if not done:
        return
    if outcome in (Job.Outcome.CAUGHT, Job.Outcome.OVERRULED):
        log.warning("attack? verifier %s on job %s: %s", job.verifier_id, job.pk, reason)
        lifecycle.penalise(job.verifier_id, VERIFIER_PENALTY)
    _discard_files(job.pk)
