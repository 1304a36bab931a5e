"""Delegated re-execution (docs/proof-of-training.md#delegated-re-execution), tried as a
dishonest worker, a lazy or lying verifier, and a verifier reaching for what is not its own
would: the challenged segments go to a node of another provider with a canary mixed in, the
platform referees, and falls back to itself. The kind is the toy trained kind; the platform
is the real one over REST, and the honest verifier is the agent's own code."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from importlib import import_module
from pathlib import Path
from typing import Any

import pytest
from django.core.files.storage import default_storage
from django.utils import timezone

from marketplace import kinds as platform_kinds
from marketplace.models import TaskStatus
from protocol import keys
from tests.factories import CAPS, UserFactory, post_task
from tests.toykind.trained import FIT, train, weights_bytes
from tests.toykind.trained import run as fit_run
from tests.workers.proving import RestNode, answer_challenge, in_process_agent
from training import kinds as node_kinds
from training.plugin import WEIGHTS, Outcome, sha256_file
from training.trace import TRACE_FILE
from workers.agent import verify_job
from workers.assignments import delegation, nodebroker, scheduler, settlement
from workers.models import Assignment, VerificationJob
from workers.tasks import verify_assignment

pytestmark = pytest.mark.django_db

SPEC = {"steps": 12, "every": 3, "target": 1000}  # 4 segments, all challenged
FIT_CAPS = {**CAPS, "kinds": ["toy_fit"], "features": []}
VERIFY_CAPS = {**FIT_CAPS, "features": [delegation.FEATURE]}


class LastFirst:
    """The platform's randomness made plain: the canary goes on the last segment (which has
    no follower), slots keep the trace's order, the first candidate verifies."""

    def sample(self, population: Sequence[Any], k: int) -> list[Any]:
        return sorted(population, reverse=True)[:k]

    def shuffle(self, x: list[Any]) -> None:
        x.sort(key=lambda slot: slot["segment"])

    def choice(self, seq: Sequence[Any]) -> Any:
        return seq[0]


@pytest.fixture(autouse=True)
def delegated(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    import_module("tests.toykind.verifier")
    monkeypatch.setitem(node_kinds.KINDS, FIT.name, FIT)
    monkeypatch.setitem(platform_kinds.KINDS, FIT.name, platform_kinds.Kind.of(FIT))
    monkeypatch.setattr(delegation, "_random", LastFirst())
    settings.SEGMENT_REEXECUTION = "delegated"


@pytest.fixture
def dave(db: Any) -> Any:
    """A third provider."""
    return UserFactory(username="dave")


@pytest.fixture
def worker(alice: Any) -> RestNode:
    return RestNode(alice, "fit-node", FIT_CAPS)


def honest(job: dict[str, Any], tmp: Path) -> Outcome:
    tmp.mkdir()
    return fit_run(job, tmp, lambda *a: None)


def skipping_in_segment_0(tmp: Path) -> Outcome:
    """A run that skipped segment 0 and claims its steps, its chain committed to what it did."""
    tmp.mkdir()
    trace, checkpoints, x = train(SPEC, tmp, skip_in=(0,))
    (tmp / WEIGHTS).write_bytes(weights_bytes(x))
    (tmp / "metrics.json").write_text("{}")
    trace.write(tmp / TRACE_FILE)
    return Outcome(
        result_hash=sha256_file(tmp / WEIGHTS),
        proof={"loss_micro": 0, "trace": trace.commitment()},
        artifacts={name: tmp / name for name in (WEIGHTS, "metrics.json", TRACE_FILE)},
        checkpoints=checkpoints,
    )


def not_in_its_chain(tmp: Path) -> Outcome:
    """An honest chain handed in with a model that is none of its checkpoints'."""
    outcome = honest({"spec": SPEC}, tmp)
    (tmp / "model" / WEIGHTS).write_bytes(weights_bytes(123.0))
    return Outcome(
        result_hash=sha256_file(tmp / "model" / WEIGHTS),
        proof=outcome.proof,
        artifacts=outcome.artifacts,
        checkpoints=outcome.checkpoints,
    )


def submitted(
    node: RestNode, requester: Any, tmp: Path, dishonest: bool = False, wrong_model: bool = False
) -> Assignment:
    """A toy_fit task of ``requester`` run by ``node``, its challenged checkpoints uploaded."""
    task = post_task(requester, "toy_fit", SPEC, max_attempts=1)
    (assignment,) = scheduler.schedule(task.pk)
    assert assignment.worker_id == node.worker.pk
    job = node.job(assignment)
    outcome = skipping_in_segment_0(tmp) if dishonest else not_in_its_chain(tmp) if wrong_model else honest(job, tmp)
    answer = node.upload_and_submit(assignment, job, outcome).json()
    assert answer_challenge(node, assignment, answer, outcome).json()["state"] == "submitted"
    return assignment


def offered(assignment: Assignment) -> VerificationJob:
    assert verify_assignment(str(assignment.pk)) == "delegated"
    return VerificationJob.objects.get(assignment=assignment)


def answer_with(node: RestNode, job: VerificationJob, distances: dict[str, int | None]) -> Any:
    """The verifier's signed answer, with these distances (micro steps' updates) by slot id."""
    slots = [
        {"id": i, "distance_micro": d, "problem": "" if d is not None else "cannot be re-executed"}
        for i, d in distances.items()
    ]
    body = verify_job.sign_answer(node.key, str(job.pk), node.key.address, slots)
    return node.client.post(f"/api/v1/verifications/{job.pk}/answer/", body, format="json")


def every_slot(job: VerificationJob, distance: int | None) -> dict[str, int | None]:
    return {slot["id"]: distance for slot in job.slots}


def reputation(node: RestNode) -> int:
    node.worker.refresh_from_db()
    return node.worker.reputation


# --- who verifies ---------------------------------------------------------------------------


def test_no_node_of_the_worker_s_provider_or_the_requester_is_ever_chosen(
    worker: RestNode, alice: Any, bob: Any, tmp_path: Path
) -> None:
    assignment = submitted(worker, bob, tmp_path / "run")
    RestNode(alice, "alice-verifier", VERIFY_CAPS)  # the worker's own provider
    RestNode(bob, "bob-verifier", VERIFY_CAPS)  # the requester
    assert delegation.eligible_verifiers(assignment) == ([], [])
    # No one else: the platform re-executes every segment itself, at once.
    assert verify_assignment(str(assignment.pk)) == "accepted"
    assert not VerificationJob.objects.exists()


def test_only_nodes_that_take_verification_jobs_of_the_kind_are_chosen(
    worker: RestNode, bob: Any, carol: Any, dave: Any, tmp_path: Path
) -> None:
    assignment = submitted(worker, bob, tmp_path / "run")
    RestNode(carol, "old-agent", FIT_CAPS)  # runs the kind, takes no verification jobs
    RestNode(carol, "other-kind", {**VERIFY_CAPS, "kinds": ["synthetic"]})
    chosen = RestNode(dave, "verifier", VERIFY_CAPS)
    assert delegation.eligible_verifiers(assignment) == ([chosen.worker], [])
    assert offered(assignment).verifier_id == chosen.worker.pk


def test_the_job_goes_to_the_verifier_s_own_queue_as_its_id_alone(
    worker: RestNode,
    bob: Any,
    carol: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks: Any,
) -> None:
    assignment = submitted(worker, bob, tmp_path / "run")
    verifier = RestNode(carol, "verifier", VERIFY_CAPS)
    sent: list[tuple[str, str]] = []
    monkeypatch.setattr(nodebroker, "publish_verification", lambda address, job: sent.append((address, job)))
    with django_capture_on_commit_callbacks(execute=True):
        job = offered(assignment)
    assert sent == [(verifier.key.address, str(job.pk))]
    # The canary's end is kept apart from the result's artifacts.
    canary = next(slot for slot in job.slots if slot["role"] == "canary")
    assert canary["end"]["file"].startswith(f"verifications/{job.pk}/")
    assert all(
        slot[end]["file"].startswith(f"artifacts/{assignment.pk}/") or slot[end]["file"] == canary["end"]["file"]
        for slot in job.slots
        for end in ("start", "end")
    )


# --- verdicts -------------------------------------------------------------------------------


def test_an_honest_verifier_running_the_agent_s_code_agrees_and_the_honest_worker_is_paid(
    worker: RestNode, bob: Any, carol: Any, tmp_path: Path
) -> None:
    assignment = submitted(worker, bob, tmp_path / "run")
    verifier = RestNode(carol, "verifier", VERIFY_CAPS)
    job = offered(assignment)
    roles = sorted((slot["segment"], slot["role"]) for slot in job.slots)
    assert roles == [(0, "real"), (1, "real"), (2, "real"), (3, "canary")]
    with in_process_agent(verifier) as agent:
        assert verify_job.run(agent, agent.key, str(job.pk)) == "answered"
    job.refresh_from_db()
    distances: dict[str, list[int]] = {slot["role"]: [] for slot in job.slots}
    for slot, entry in zip(job.slots, job.answer["answer"]["slots"], strict=True):
        distances[slot["role"]].append(entry["distance_micro"])
    assert distances["real"] == [0, 0, 0]
    assert distances["canary"][0] > 1_000_000  # two steps' updates away, as made
    assert verify_assignment(str(assignment.pk)) == "accepted"
    job.refresh_from_db()
    assert job.outcome == VerificationJob.Outcome.AGREED
    done = Assignment.objects.get(pk=assignment.pk)
    assert done.task.status == TaskStatus.COMPLETED
    worker.worker.refresh_from_db()
    assert worker.worker.earnings > 0


def test_a_lazy_verifier_that_passes_everything_is_caught_by_the_canary_and_the_fake_still_fails(
    worker: RestNode, bob: Any, carol: Any, tmp_path: Path
) -> None:
    assignment = submitted(worker, bob, tmp_path / "run", dishonest=True)
    verifier = RestNode(carol, "verifier", VERIFY_CAPS)
    before = reputation(verifier)
    job = offered(assignment)
    assert answer_with(verifier, job, every_slot(job, 0)).status_code == 202
    assert verify_assignment(str(assignment.pk)) == "rejected"
    job.refresh_from_db()
    assert job.outcome == VerificationJob.Outcome.CAUGHT
    assert reputation(verifier) == before - delegation.VERIFIER_PENALTY
    reason = Assignment.objects.get(pk=assignment.pk).reason
    assert reason.startswith("training not proven: segment 0 (steps 0→3): re-executed, x is ")
    worker.worker.refresh_from_db()
    assert worker.worker.earnings == 0


def test_a_verifier_that_fails_an_honest_run_is_overruled_and_the_worker_paid(
    worker: RestNode, bob: Any, carol: Any, tmp_path: Path
) -> None:
    assignment = submitted(worker, bob, tmp_path / "run")
    verifier = RestNode(carol, "verifier", VERIFY_CAPS)
    before = reputation(verifier)
    job = offered(assignment)
    assert answer_with(verifier, job, every_slot(job, 5_000_000)).status_code == 202
    assert verify_assignment(str(assignment.pk)) == "accepted"
    job.refresh_from_db()
    assert (job.outcome, job.reason) == (
        VerificationJob.Outcome.OVERRULED,
        "Failed segment(s) [0, 1, 2], which pass on the platform.",
    )
    assert reputation(verifier) == before - delegation.VERIFIER_PENALTY
    worker.worker.refresh_from_db()
    assert worker.worker.earnings > 0


def test_a_verifier_that_finds_the_fake_is_upheld_and_the_requester_reads_why(
    worker: RestNode, bob: Any, carol: Any, tmp_path: Path
) -> None:
    assignment = submitted(worker, bob, tmp_path / "run", dishonest=True)
    verifier = RestNode(carol, "verifier", VERIFY_CAPS)
    job = offered(assignment)
    with in_process_agent(verifier) as agent:
        assert verify_job.run(agent, agent.key, str(job.pk)) == "answered"
    assert verify_assignment(str(assignment.pk)) == "rejected"
    job.refresh_from_db()
    assert job.outcome == VerificationJob.Outcome.UPHELD
    reason = Assignment.objects.get(pk=assignment.pk).reason
    assert reason.startswith("training not proven: segment 0 (steps 0→3): re-executed, x is ")
    assert reason.endswith("(found by a verifier node of another provider, confirmed by the platform)")


def test_a_fake_in_the_segment_behind_the_canary_fails_on_the_platform_and_the_verifier_is_not_judged(
    worker: RestNode, bob: Any, carol: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class CanaryFirst(LastFirst):
        def sample(self, population: Sequence[Any], k: int) -> list[Any]:
            return sorted(population)[:k]

    monkeypatch.setattr(delegation, "_random", CanaryFirst())
    assignment = submitted(worker, bob, tmp_path / "run", dishonest=True)
    verifier = RestNode(carol, "verifier", VERIFY_CAPS)
    job = offered(assignment)
    # Segment 0 is the canary's; segment 1 starts from its moved end (a decoy).
    assert sorted((s["segment"], s["role"]) for s in job.slots)[:2] == [(0, "canary"), (1, "decoy")]
    assert answer_with(verifier, job, every_slot(job, 0)).status_code == 202
    assert verify_assignment(str(assignment.pk)) == "rejected"
    job.refresh_from_db()
    assert job.outcome == VerificationJob.Outcome.MOOT


# --- answers that must not count ------------------------------------------------------------


def test_forged_unsigned_and_replayed_answers_are_refused(bob: Any, alice: Any, carol: Any, tmp_path: Path) -> None:
    first, second = RestNode(alice, "fit-1", FIT_CAPS), RestNode(alice, "fit-2", FIT_CAPS)
    by_worker = {first.worker.pk: first, second.worker.pk: second}
    jobs = []
    for n in range(2):
        task = post_task(bob, "toy_fit", SPEC, max_attempts=1)
        (assignment,) = scheduler.schedule(task.pk)
        node = by_worker[assignment.worker_id]
        job = node.job(assignment)
        outcome = honest(job, tmp_path / f"run-{n}")
        answer = node.upload_and_submit(assignment, job, outcome).json()
        answer_challenge(node, assignment, answer, outcome)
        jobs.append(assignment)
    verifier = RestNode(carol, "verifier", VERIFY_CAPS)
    job_a, job_b = offered(jobs[0]), offered(jobs[1])
    assert job_a.verifier_id == job_b.verifier_id == verifier.worker.pk
    url = f"/api/v1/verifications/{job_b.pk}/answer/"
    body = verify_job.sign_answer(
        keys.generate(),
        str(job_b.pk),
        verifier.key.address,
        [{"id": i, "distance_micro": 0, "problem": ""} for i in every_slot(job_b, 0)],
    )
    forged = verifier.client.post(url, body, format="json")
    assert (forged.status_code, forged.json()) == (
        400,
        {"signature": ["The signature does not verify with this node's key."]},
    )
    unsigned = verifier.client.post(url, {"answer": body["answer"]}, format="json")
    assert unsigned.status_code == 400
    assert "signature" in unsigned.json()
    # Job A's answer, honestly signed, sent again as job B's.
    assert answer_with(verifier, job_a, every_slot(job_a, 0)).status_code == 202
    job_a.refresh_from_db()
    replayed = verifier.client.post(url, job_a.answer, format="json")
    assert (replayed.status_code, replayed.json()) == (
        400,
        {"answer": ["This answer is for another verification job."]},
    )
    # Job A's slots under job B's id: not job B's slots.
    moved = verify_job.sign_answer(verifier.key, str(job_b.pk), verifier.key.address, job_a.answer["answer"]["slots"])
    assert verifier.client.post(url, moved, format="json").status_code == 400
    # And job A answered twice.
    again = verifier.client.post(f"/api/v1/verifications/{job_a.pk}/answer/", job_a.answer, format="json")
    assert again.status_code == 409
    job_b.refresh_from_db()
    assert job_b.state == VerificationJob.State.OFFERED


def test_another_node_cannot_answer_or_read_a_verification_job(
    worker: RestNode, bob: Any, carol: Any, dave: Any, tmp_path: Path
) -> None:
    assignment = submitted(worker, bob, tmp_path / "run")
    verifier = RestNode(carol, "verifier", VERIFY_CAPS)
    job = offered(assignment)
    other = RestNode(dave, "other", VERIFY_CAPS)
    assert other.client.get(f"/api/v1/verifications/{job.pk}/").status_code == 404
    slot = job.slots[0]["id"]
    assert other.client.get(f"/api/v1/verifications/{job.pk}/slots/{slot}/start/").status_code == 404
    stolen = verify_job.sign_answer(other.key, str(job.pk), other.key.address, [])
    assert other.client.post(f"/api/v1/verifications/{job.pk}/answer/", stolen, format="json").status_code == 404
    assert verifier.client.get(f"/api/v1/verifications/{job.pk}/").status_code == 200


def test_a_verifier_reads_only_its_job_s_files_and_only_while_it_is_open(
    worker: RestNode, bob: Any, carol: Any, tmp_path: Path
) -> None:
    assignment = submitted(worker, bob, tmp_path / "run")
    verifier = RestNode(carol, "verifier", VERIFY_CAPS)
    job = offered(assignment)
    seen = verifier.client.get(f"/api/v1/verifications/{job.pk}/").json()
    # Nothing names the worker, the task or which slot is the canary.
    assert set(seen) == {"id", "kind", "spec", "deadline", "tolerance", "dataset", "slots"}
    assert all(set(slot) == {"id", "start", "end"} for slot in seen["slots"])
    # Nor the worker's committed losses or epochs, which a lazy verifier could answer from.
    leaf = {"index", "step", "state_sha256", "weights_sha256", "url"}
    assert all(set(slot[end]) == leaf for slot in seen["slots"] for end in ("start", "end"))
    assert str(assignment.task_id) not in str(seen)
    assert worker.key.address not in str(seen)
    base = f"/api/v1/verifications/{job.pk}"
    slot = seen["slots"][0]
    start = verifier.client.get(f"{base}/slots/{slot['id']}/start/")
    assert start.status_code == 200
    # The worker's job, its model, its trace: not this node's.
    for path in ("", "dataset/", f"model/{WEIGHTS}/"):
        assert verifier.client.get(f"/api/v1/assignments/{assignment.pk}/{path}").status_code == 404
    assert verifier.client.get(f"{base}/slots/{slot['id']}/middle/").status_code == 404
    assert verifier.client.get(f"{base}/slots/not-a-slot/start/").status_code == 404
    assert verifier.client.get(f"{base}/slots/..%2F{TRACE_FILE}/start/").status_code == 404
    assert verifier.client.get(f"{base}/dataset/").status_code == 404  # the toy kind has none
    assert answer_with(verifier, job, every_slot(job, 0)).status_code == 202
    closed = verifier.client.get(f"{base}/slots/{slot['id']}/start/")
    assert closed.status_code == 409


# --- no answer -------------------------------------------------------------------------------


def test_a_verifier_that_never_answers_leaves_the_platform_to_re_execute_itself(
    worker: RestNode, bob: Any, carol: Any, tmp_path: Path
) -> None:
    assignment = submitted(worker, bob, tmp_path / "run")
    verifier = RestNode(carol, "verifier", VERIFY_CAPS)
    job = offered(assignment)
    assert verify_assignment(str(assignment.pk)) == "delegated"  # a resend waits too
    VerificationJob.objects.filter(pk=job.pk).update(deadline=timezone.now() - timedelta(seconds=1))
    assert delegation.expire_overdue() == 1
    job.refresh_from_db()
    assert job.state == VerificationJob.State.EXPIRED
    late = answer_with(verifier, job, every_slot(job, 0))
    assert late.status_code == 409
    assert verify_assignment(str(assignment.pk)) == "accepted"
    worker.worker.refresh_from_db()
    assert worker.worker.earnings > 0


def test_platform_mode_offers_nothing(worker: RestNode, bob: Any, carol: Any, tmp_path: Path, settings: Any) -> None:
    settings.SEGMENT_REEXECUTION = "platform"
    assignment = submitted(worker, bob, tmp_path / "run")
    RestNode(carol, "verifier", VERIFY_CAPS)
    assert verify_assignment(str(assignment.pk)) == "accepted"
    assert not VerificationJob.objects.exists()


# --- attacks on the protocol's seams --------------------------------------------------------


def test_a_chain_that_fails_without_re_execution_costs_no_verifier_anything(
    worker: RestNode, bob: Any, carol: Any, tmp_path: Path
) -> None:
    """A worker hands in a model that is none of its chain's checkpoints: the platform sees it
    without re-executing anything, so no node of another provider, and no canary, is put to
    work on a result already lost."""
    assignment = submitted(worker, bob, tmp_path / "run", wrong_model=True)
    RestNode(carol, "verifier", VERIFY_CAPS)
    assert verify_assignment(str(assignment.pk)) == "rejected"
    assert not VerificationJob.objects.exists()
    assert "not those of any checkpoint" in Assignment.objects.get(pk=assignment.pk).reason


def test_between_them_the_platform_and_the_verifier_check_every_challenged_segment(
    worker: RestNode, bob: Any, carol: Any, tmp_path: Path
) -> None:
    """When the verifier agrees, the platform re-executed only the segment behind the canary;
    the verdict counts the two apart, and together they are the whole challenge."""
    assignment = submitted(worker, bob, tmp_path / "run")
    verifier = RestNode(carol, "verifier", VERIFY_CAPS)
    job = offered(assignment)
    with in_process_agent(verifier) as agent:
        assert verify_job.run(agent, agent.key, str(job.pk)) == "answered"
    assert verify_assignment(str(assignment.pk)) == "accepted"
    done = Assignment.objects.get(pk=assignment.pk)
    assert (done.metrics["segments_replayed"], done.metrics["segments_verified_by_node"]) == (1, 3)
    assert delegation.vouched(done) == {0, 1, 2}


def test_an_overruled_verifier_vouches_for_nothing_and_the_platform_counts_every_segment(
    worker: RestNode, bob: Any, carol: Any, tmp_path: Path
) -> None:
    assignment = submitted(worker, bob, tmp_path / "run")
    verifier = RestNode(carol, "verifier", VERIFY_CAPS)
    job = offered(assignment)
    assert answer_with(verifier, job, every_slot(job, 5_000_000)).status_code == 202
    assert verify_assignment(str(assignment.pk)) == "accepted"
    done = Assignment.objects.get(pk=assignment.pk)
    assert (done.metrics["segments_replayed"], done.metrics["segments_verified_by_node"]) == (4, 0)


def test_an_answer_that_arrives_as_the_job_expires_counts_for_nothing(
    worker: RestNode, bob: Any, carol: Any, tmp_path: Path, django_capture_on_commit_callbacks: Any
) -> None:
    """The deadline passes; the result's next verification run expires the job and
    re-executes every segment itself. An answer sent a moment later is refused, its verifier
    neither judged nor penalised."""
    assignment = submitted(worker, bob, tmp_path / "run")
    verifier = RestNode(carol, "verifier", VERIFY_CAPS)
    before = reputation(verifier)
    job = offered(assignment)
    VerificationJob.objects.filter(pk=job.pk).update(deadline=timezone.now() - timedelta(seconds=1))
    with django_capture_on_commit_callbacks(execute=True):
        assert verify_assignment(str(assignment.pk)) == "accepted"
    late = answer_with(verifier, job, every_slot(job, 0))
    assert late.status_code == 409
    job.refresh_from_db()
    assert (job.state, job.outcome) == (VerificationJob.State.EXPIRED, VerificationJob.Outcome.PENDING)
    assert reputation(verifier) == before
    done = Assignment.objects.get(pk=assignment.pk)
    assert (done.metrics["segments_replayed"], done.metrics["segments_verified_by_node"]) == (4, 0)
    assert not Path(default_storage.path(delegation.job_dir(job.pk))).exists()


def test_an_answer_in_before_the_deadline_survives_the_expiry_sweep(
    worker: RestNode, bob: Any, carol: Any, tmp_path: Path
) -> None:
    assignment = submitted(worker, bob, tmp_path / "run")
    verifier = RestNode(carol, "verifier", VERIFY_CAPS)
    job = offered(assignment)
    assert answer_with(verifier, job, every_slot(job, 0)).status_code == 202
    VerificationJob.objects.filter(pk=job.pk).update(deadline=timezone.now() - timedelta(seconds=1))
    assert delegation.expire_overdue() == 0
    assert verify_assignment(str(assignment.pk)) == "accepted"
    job.refresh_from_db()
    # It passed the canary too: caught, late or not.
    assert (job.state, job.outcome) == (VerificationJob.State.ANSWERED, VerificationJob.Outcome.CAUGHT)


@pytest.mark.parametrize("answered", [False, True])
def test_a_job_whose_result_is_settled_without_it_is_closed_and_its_canary_deleted(
    answered: bool, worker: RestNode, bob: Any, carol: Any, tmp_path: Path
) -> None:
    """The result's verification is given up (or its task cancelled) while its job is out:
    the verifier may no longer read the worker's files, and the next scheduling pass closes
    the job, unjudged, and deletes its canary."""
    assignment = submitted(worker, bob, tmp_path / "run")
    verifier = RestNode(carol, "verifier", VERIFY_CAPS)
    before = reputation(verifier)
    job = offered(assignment)
    folder = Path(default_storage.path(delegation.job_dir(job.pk)))
    assert any(folder.iterdir())
    if answered:
        assert answer_with(verifier, job, every_slot(job, 0)).status_code == 202
    settlement.reject(assignment.pk, "verification did not finish: the verifier was stopped 3 times on this result.")
    base = f"/api/v1/verifications/{job.pk}"
    assert verifier.client.get(f"{base}/").status_code == 409
    assert verifier.client.get(f"{base}/slots/{job.slots[0]['id']}/start/").status_code == 409
    assert answer_with(verifier, job, every_slot(job, 0)).status_code == 409
    assert delegation.expire_overdue() == 0
    job.refresh_from_db()
    assert job.outcome == VerificationJob.Outcome.UNJUDGED
    assert job.state == (VerificationJob.State.ANSWERED if answered else VerificationJob.State.EXPIRED)
    assert not folder.exists()
    assert reputation(verifier) == before
