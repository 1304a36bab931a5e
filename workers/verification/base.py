"""What every kind's verifier shares: the registry (``verifies``), the verdict, the
platform's own faults, the outline of a spot check (recompute k secretly chosen samples
with the source model) and the quality bars a true training claim must still meet.

Nothing a worker uploaded is ever imported or unpickled: safetensors, JSON, CSV and
``.npy`` without pickles only.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import shutil
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.files.storage import default_storage

from marketplace.models import Task
from training import kinds as plugin_kinds
from training.plugin import WEIGHTS, DataUnreadable, TrainingPlan, sha256_file
from training.specs import default
from training.trace import Segment, Trace, TraceError, checkpoint_name, file_sha256
from workers.assignments import delegation, heldout, proof
from workers.assignments.jobs import artifact_path, node_spec
from workers.models import Assignment

MAX_CONFIG_BYTES = 1024 * 1024


class PlatformFault(Exception):
    """The platform cannot judge the result (its own data is missing or broken).

    Not the worker's fault, so never a rejection: the verification fails loudly and is
    asked for again later (``jobs.resend_stalled_verifications``).
    """


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    # A rejection costs the worker reputation at once, except when its claim was true and
    # the model only fell short of the task's quality bar (min_accuracy, beating chance or
    # the untrained model): the requester's spec or data may make the bar unreachable for
    # an honest run (a learning rate of 1e-7, one epoch), and that is not the worker's
    # fault. Such a result costs less, and only once another provider's result on the
    # task meets the bar (settlement.SHORT_PENALTY); its provider is not offered the task
    # again. Not paid either way; the job goes to another worker.
    penalise: bool = True


@dataclass(frozen=True)
class Check:
    """One quality bar a verifier applied to a true claim, in words a requester reads:
    what was ``measured``, its ``value``, the ``bar`` it had to meet, whether it was
    ``met``, and ``words``, the sentence that says why it passed or fell short."""

    measured: str
    value: str
    bar: str
    met: bool
    words: str


# fn(the verdict's metrics) -> the bars that verdict applied, rebuilt from the numbers it
# recorded; raises KeyError (or TypeError, ValueError) on metrics that lack them.
Bars = Callable[[dict[str, Any]], list[Check]]

# Every training kind's bars, by kind name: filled by ``bars`` like VERIFIERS.
BARS: dict[str, Bars] = {}


def bars(kind: str) -> Callable[[Bars], Bars]:
    """Register the decorated function as the bars of ``kind``'s verdicts (``checks``)."""

    def register(fn: Bars) -> Bars:
        BARS[kind] = fn
        return fn

    return register


def checks(kind: str, metrics: object) -> list[Check]:
    """The bars a verdict on a ``kind`` result applied, from the ``metrics`` it recorded;
    none for a kind without bars or metrics from before they were recorded."""
    fn = BARS.get(kind)
    if fn is None or not isinstance(metrics, dict):
        return []
    try:
        return fn(metrics)
    except (KeyError, TypeError, ValueError):
        return []


# fn(assignment, its uploaded artifacts by name) -> the verdict.
Verifier = Callable[[Assignment, dict[str, Path]], Verdict]

# Every verifier, by the name of the kind it judges: filled by ``verifies`` as the modules of
# this package are imported (``workers.verification.load``).
VERIFIERS: dict[str, Verifier] = {}


# fn(a valid spec, defaults filled in) -> what a result of it must meet to be paid, in
# sentences a requester reads before posting. Each reads its numbers from the functions its
# kind's verifier judges with, so the page and the verdict cannot disagree.
QualityBar = Callable[[dict[str, Any]], list[str]]

# Every kind's stated bar, by kind name: filled by ``states_bar`` beside each verifier.
STATED_BARS: dict[str, QualityBar] = {}


def states_bar(kind: str) -> Callable[[QualityBar], QualityBar]:
    """Register the decorated function as the quality bar of ``kind`` (shown on the post page)."""

    def register(bar: QualityBar) -> QualityBar:
        if STATED_BARS.setdefault(kind, bar) is not bar:
            raise ImproperlyConfigured(
                f"{kind} has two quality bars: {STATED_BARS[kind].__qualname__} and {bar.__qualname__}."
            )
        return bar

    return register


def verify_samples(spec_class: type, spec: dict[str, Any]) -> int:
    """How many samples a spot check recomputes: the spec's ``verify_samples``, or the
    ``spec_class`` dataclass's default when the task names none."""
    return int(spec.get("verify_samples", default(spec_class, "verify_samples")))


def verifies(kind: str) -> Callable[[Verifier], Verifier]:
    """Register the decorated function as the verifier of ``kind``: the platform offers a
    kind to providers once it has one (``marketplace.kinds.Kind.available``)."""

    def register(verifier: Verifier) -> Verifier:
        if VERIFIERS.setdefault(kind, verifier) is not verifier:
            raise ImproperlyConfigured(
                f"{kind} has two verifiers: {VERIFIERS[kind].__qualname__} and {verifier.__qualname__}."
            )
        return verifier

    return register


def check_result_hash(assignment: Assignment, path: Path) -> Verdict | None:
    """A rejection unless the signed result_hash is the sha256 of the uploaded artifact."""
    claimed = assignment.result["compute_result"]["result_hash"]
    if sha256_file(path) != claimed:
        return Verdict(False, f"result_hash is not the sha256 of the uploaded {path.name}.")
    return None


def proof_micro(assignment: Assignment, key: str) -> float | None:
    """A ``*_micro`` integer of the signed proof as a float, or None when absent or not an integer."""
    proof = assignment.result["compute_result"].get("proof")
    value = proof.get(key) if isinstance(proof, dict) else None
    return value / 1_000_000 if type(value) is int else None


def read_small_json(path: Path) -> Any:
    """A worker's JSON artifact, refused above MAX_CONFIG_BYTES; None when unreadable."""
    if path.stat().st_size > MAX_CONFIG_BYTES:
        return None
    try:
        return json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError):
        return None


def spot_check_seed(assignment: Assignment) -> int:
    """Which rows to recompute: keyed by a platform secret, so the worker cannot predict them."""
    message = f"{assignment.pk}:{assignment.result['compute_result']['result_hash']}".encode()
    return int.from_bytes(hmac.new(settings.SECRET_KEY.encode(), message, hashlib.sha256).digest()[:8], "big")


def source_model_dir(task: Task) -> Path | None:
    """The folder of the accepted model an inference task ran (its source task's artifacts)."""
    accepted = (
        Assignment.objects.filter(task_id=task.spec.get("source_task"), state=Assignment.State.ACCEPTED)
        .order_by("settled_at")
        .first()
    )
    if accepted is None:
        return None
    return Path(default_storage.path(artifact_path(accepted, WEIGHTS))).parent


def copy_dataset(task: Task, folder: Path, stem: str = "inputs") -> Path:
    """The task's uploaded dataset copied to ``folder`` under a name with its format's suffix."""
    assert task.dataset is not None
    target = Path(folder) / f"{stem}.{task.dataset.format}"
    with task.dataset.file.open("rb") as upload, target.open("wb") as out:
        shutil.copyfileobj(upload, out, 1 << 20)
    return target


@contextmanager
def heldout_data(task: Task) -> Iterator[Path]:
    """The held-out file or folder of the task's split, which the platform keeps from the
    worker, readable while the context lasts (``heldout.readable``: virtual shards read
    from the upload)."""
    split = heldout.prepared(task)
    if split is None:
        # Cannot happen: the scheduler prepares the split before any worker is assigned.
        raise PlatformFault(f"task {task.pk} has no held-out split")
    with heldout.readable(task, split.heldout) as path:
        yield path


def _hashed(artifact: str, wrapped: Callable[..., Verdict], then: Callable[[Assignment, Path], Verdict]) -> Verifier:
    """A verifier, named and documented as ``wrapped``, that rejects a result unless its
    signed result_hash is the sha256 of the uploaded ``artifact``, and then asks
    ``then(assignment, the artifact's path)``."""

    @functools.wraps(wrapped)
    def verify(assignment: Assignment, artifacts: dict[str, Path]) -> Verdict:
        path = artifacts[artifact]
        return check_result_hash(assignment, path) or then(assignment, path)

    return verify


# judge(assignment, the folder of its uploaded model, the claim of its signed proof) -> Verdict
Judge = Callable[[Assignment, Path, float], Verdict]


# Each training verifier's second half alone, by verifier (``quality_bar``).
_QUALITY_BARS: dict[Verifier, Verifier] = {}


def training_claim(proof_key: str) -> Callable[[Judge], Verifier]:
    """What every training verifier checks first, as a decorator that makes ``judge`` a
    verifier: the signed result_hash must be the sha256 of the uploaded model.safetensors,
    the signed proof must carry ``proof_key`` (a ``*_micro`` integer) and, for a kind that
    proves its training, the proof must hold (``training_proof_problem``); ``judge`` then
    gets the uploaded model's folder and the claim as a float, for the quality bar."""

    def opening(judge: Judge) -> Verifier:
        def bar(assignment: Assignment, weights: Path) -> Verdict:
            reported = proof_micro(assignment, proof_key)
            if reported is None:
                return Verdict(False, f"The signed proof carries no integer {proof_key}.")
            return judge(assignment, weights.parent, reported)

        def claim(assignment: Assignment, weights: Path) -> Verdict:
            if proof_micro(assignment, proof_key) is None or not proof.proves_training(assignment.task.kind):
                return bar(assignment, weights)
            checked = training_proof(assignment)
            if checked.problem:
                return Verdict(False, f"training not proven: {checked.problem}")
            verdict = bar(assignment, weights)
            counts = {"segments_replayed": checked.replayed, "segments_verified_by_node": checked.by_node}
            return replace(verdict, metrics={**verdict.metrics, **counts})

        verifier = _hashed(WEIGHTS, judge, claim)
        _QUALITY_BARS[verifier] = _hashed(WEIGHTS, judge, bar)
        return verifier

    return opening


def quality_bar(verifier: Verifier) -> Verifier:
    """The second half of a training verifier alone: the result_hash, the claim and the
    held-out bar, without the proof of training (which ``training_proof_problem`` checks)."""
    return _QUALITY_BARS[verifier]


@contextmanager
def worker_data(task: Task) -> Iterator[Path | None]:
    """The data the task's worker trained on, readable while the context lasts: the
    worker-facing part of a held-out split (a file, or a sharded folder whose virtual shards
    are read from the upload: ``heldout.readable``), or the upload itself; None when the
    worker generates its data from the spec."""
    if not heldout.needs_preparation(task):
        yield Path(task.dataset.file.path) if task.dataset is not None else None
        return
    split = heldout.prepared(task)
    if split is None:
        raise PlatformFault(f"task {task.pk} has no held-out split")
    if split.worker is None:
        yield None
        return
    with heldout.readable(task, split.worker) as path:
        yield path


@dataclass(frozen=True)
class ProofCheck:
    """What ``training_proof`` found: why the proof does not hold ("" when it does), the
    challenged segments the platform re-executed itself, and those a verifier node's
    answer, agreed, vouches for (delegated mode); together, every challenged segment."""

    problem: str
    replayed: int = 0
    by_node: int = 0


def training_proof_problem(assignment: Assignment) -> str:
    """Why the proof of training does not hold ("" when it does) (``training_proof``)."""
    return training_proof(assignment).problem


def chain_problem(assignment: Assignment) -> str:
    """Why the proof of training does not hold on what needs no re-execution ("" when it
    does): ``training_proof``'s checks short of its segments'. Delegated mode offers a
    result's segments to a verifier node only once they pass, so a chain that fails here
    costs no node, and no canary, any work."""
    with worker_data(assignment.task) as data:
        checked = _chain(assignment, data)
    return checked if isinstance(checked, str) else ""


def _chain(assignment: Assignment, data: Path | None) -> str | tuple[Callable[..., list[str]], dict[int, Segment]]:
    """Why the chain does not hold, or the kind's replay and the challenged segments;
    ``data`` is the worker's (``worker_data``)."""
    try:
        trace = proof.committed_trace(assignment)
    except TraceError as exc:
        return str(exc)
    task = assignment.task
    kind = plugin_kinds.KINDS.get(task.kind)
    replay, plan_of = getattr(kind, "replay", None), getattr(kind, "plan", None)
    if replay is None or plan_of is None:
        raise PlatformFault(f"{task.kind} has no replay: the platform cannot re-execute its segments")
    spec = node_spec(assignment)  # as the node ran it (its batch, where the spec leaves it to the node)
    try:
        plan = plan_of(spec, data)
    except Exception as exc:
        # The plan reads the spec and the platform's copy of the worker's data, nothing the
        # worker sent: whatever stops it is the platform's fault, asked again later.
        raise PlatformFault(f"task {task.pk}: the run's plan cannot be made: {exc}") from exc
    problem = _span_problem(trace, plan)
    if problem:
        return problem
    result_hash = assignment.result["compute_result"]["result_hash"]
    if all(leaf.weights_sha256 != result_hash for leaf in trace.leaves):
        return "the submitted model's weights are not those of any checkpoint in trace.json."
    segments = list(assignment.challenge)
    if not segments:
        return "no segment of the trace was challenged."
    picked = {}
    for i in segments:
        start, end = trace.leaves[i], trace.leaves[i + 1]
        files = [Path(default_storage.path(artifact_path(assignment, checkpoint_name(j)))) for j in (i, i + 1)]
        for leaf, path in zip((start, end), files, strict=True):
            if not path.is_file() or file_sha256(path) != leaf.state_sha256:
                return f"{path.name} is missing or does not hash to its leaf."
        picked[i] = Segment(start=files[0], start_leaf=start, end=files[1], end_leaf=end)
    return replay, picked


def training_proof(assignment: Assignment) -> ProofCheck:
    """Whether the proof of training holds: trace.json must be the chain the signed proof's
    root commits to; it must start from the spec's seeded initialisation, take checkpoints
    as often as the run's length asks, and span the run the spec asks (every epoch, or as
    many as early stopping allows); the submitted weights must be one of its checkpoints'
    (the run hands back its best epoch's end); and each challenged segment, re-executed from
    its first checkpoint by the kind's ``replay``, must land on its second, re-executed here
    or, in delegated mode, by a verifier node whose answer the platform judges
    (``workers.assignments.delegation.referee``; ``docs/proof-of-training.md``)."""
    task = assignment.task
    with worker_data(task) as data:
        checked = _chain(assignment, data)
        if isinstance(checked, str):
            return ProofCheck(checked)
        replay, picked = checked
        replayed: set[int] = set()

        def on_the_platform(chosen: list[int]) -> str:
            replayed.update(chosen)
            if not chosen:
                return ""
            try:
                verdicts = replay(node_spec(assignment), data, [picked[i] for i in chosen])
            except DataUnreadable as exc:
                # The platform's copy of the worker's data, not the result: asked again later.
                raise PlatformFault(f"task {task.pk}: the worker's data cannot be read: {exc}") from exc
            for why in verdicts:
                if why:
                    return str(why)
            return ""

        # Every segment here, or those a verifier node's answer leaves to the platform.
        problem = delegation.referee(assignment, on_the_platform)
    by_node = 0 if problem else len(delegation.vouched(assignment) - replayed)
    return ProofCheck(problem, len(replayed), by_node)


def _span_problem(trace: Trace, plan: TrainingPlan) -> str:
    """Whether the chain is the run the plan asks for, before any segment is re-executed."""
    first, last = trace.leaves[0], trace.leaves[-1]
    if first.weights_sha256 != plan.untrained_sha256:
        return "checkpoint 0 is not the untrained model the spec's seed gives."
    if trace.every != plan.every:
        return (
            f"trace.json takes a checkpoint every {trace.every} steps; a run of {plan.total_steps} steps "
            f"takes one every {plan.every}."
        )
    if last.step > plan.total_steps:
        return f"trace.json runs {last.step} optimizer steps; the spec asks for {plan.total_steps}."
    if last.step < plan.least_steps or last.step % plan.steps_per_epoch:
        stop = (
            f" (early stopping may end it after {plan.least_steps} steps, at an epoch's end)"
            if plan.least_steps < plan.total_steps
            else ""
        )
        return f"trace.json ends after {last.step} of the {plan.total_steps} optimizer steps the spec asks for{stop}."
    return ""


# recompute(assignment, its uploaded artifact, the source model's folder (fetched on demand),
# samples, seed) -> Verdict
Recompute = Callable[[Assignment, Path, Callable[[], Path], int, int], Verdict]


def spot_check(spec: type, artifact: str) -> Callable[[Recompute], Verifier]:
    """The outline every inference verifier follows, as a decorator that makes ``recompute``
    a verifier: the signed result_hash must be the sha256 of the uploaded ``artifact``; then
    ``recompute`` checks ``verify_samples`` samples (the ``spec`` dataclass's default when the
    task names none) chosen by ``spot_check_seed``, with the source task's accepted model,
    which it asks for when it needs it (a PlatformFault when the platform has lost it)."""

    def outline(recompute: Recompute) -> Verifier:
        def sample(assignment: Assignment, path: Path) -> Verdict:
            task = assignment.task

            def model() -> Path:
                folder = source_model_dir(task)
                if folder is None:
                    raise PlatformFault(f"task {task.pk}: the source task has no accepted model")
                return folder

            samples = verify_samples(spec, task.spec)
            return recompute(assignment, path, model, samples, spot_check_seed(assignment))

        return _hashed(artifact, recompute, sample)

    return outline


def quality_verdict(metrics: dict[str, Any], shortfalls: Iterable[str]) -> Verdict:
    """The verdict on a training claim found true: rejected, without the penalty of a false
    claim (see ``Verdict.penalise``), for the first quality bar it falls short of (each of
    ``shortfalls`` says why; read lazily, so a bar is judged only once the ones before it
    are met); accepted when it meets them all."""
    for reason in shortfalls:
        return Verdict(False, reason, metrics, penalise=False)
    return Verdict(True, "", metrics)
