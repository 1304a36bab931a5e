"""Proof of training (docs/proof-of-training.md), tried as a dishonest node would: the
platform challenges a trained kind's signed checkpoint chain, takes only the checkpoints it
picked (each hashing to its leaf), and re-executes the picked segments before the quality
bar. The kind is the toy trained kind of tests/toykind (a replay costs microseconds); the
platform is the real one, reached over REST, and the node is the agent's own code."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from importlib import import_module
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

from marketplace import kinds as platform_kinds
from marketplace.models import TaskStatus
from tests.factories import CAPS, post_task
from tests.toykind.trained import FIT, run, train, weights_bytes
from tests.workers.proving import RestNode as FitNode
from tests.workers.proving import answer_challenge, in_process_agent
from training import kinds as node_kinds
from training.plugin import WEIGHTS, Outcome, sha256_file
from training.trace import TRACE_FILE, Leaf, Trace, challenge, checkpoint_name, segments_needed
from workers.agent.jobs import Node
from workers.assignments import proof, scheduler
from workers.models import Assignment
from workers.tasks import verify_assignment

pytestmark = pytest.mark.django_db

FIT_CAPS = {**CAPS, "kinds": ["toy_fit"], "features": []}
SPEC = {"steps": 12, "every": 3, "target": 1000}


@pytest.fixture(autouse=True)
def fit_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    """Register the toy trained kind as test_toy_kinds registers its kind."""
    import_module("tests.toykind.verifier")
    monkeypatch.setitem(node_kinds.KINDS, FIT.name, FIT)
    monkeypatch.setitem(platform_kinds.KINDS, FIT.name, platform_kinds.Kind.of(FIT))


@pytest.fixture
def node(alice: Any) -> FitNode:
    return FitNode(alice, "fit-node", FIT_CAPS)


@pytest.fixture
def started(node: FitNode, bob: Any, tmp_path: Path) -> tuple[Assignment, dict[str, Any], Outcome]:
    """A toy_fit task assigned to ``node``, started, and honestly trained."""
    task = post_task(bob, "toy_fit", SPEC, max_attempts=1)
    (assignment,) = scheduler.schedule(task.pk)
    job = node.job(assignment)
    return assignment, job, run(job, tmp_path, lambda *a: None)


def test_an_honest_run_is_challenged_after_it_signed_then_replayed_accepted_and_paid(
    node: FitNode, started: tuple[Assignment, dict[str, Any], Outcome]
) -> None:
    assignment, job, outcome = started
    response = node.upload_and_submit(assignment, job, outcome)
    assert response.status_code == 202
    answer = response.json()
    # 4 segments: to catch one bad segment in 4 with probability 0.99, all are re-executed.
    assert answer == {
        "state": "running",
        "challenge": {"segments": [0, 1, 2, 3], "checkpoints": [checkpoint_name(i) for i in range(5)]},
    }
    assert Assignment.objects.get(pk=assignment.pk).state == Assignment.State.RUNNING
    last = answer_challenge(node, assignment, answer, outcome)
    assert last.json()["state"] == "submitted"
    assert verify_assignment(str(assignment.pk)) == "accepted", Assignment.objects.get(pk=assignment.pk).reason
    done = Assignment.objects.get(pk=assignment.pk)
    assert done.metrics["segments_replayed"] == 4
    assert done.task.status == TaskStatus.COMPLETED
    node.worker.refresh_from_db()
    assert node.worker.earnings > 0


def test_the_same_signed_result_sent_again_gets_the_same_challenge_and_another_is_refused(
    node: FitNode, started: tuple[Assignment, dict[str, Any], Outcome]
) -> None:
    assignment, job, outcome = started
    first = node.upload_and_submit(assignment, job, outcome).json()
    again = node.submit(assignment, job, outcome)
    assert (again.status_code, again.json()) == (202, first)
    other = replace(outcome, proof={**outcome.proof, "loss_micro": 1})
    refused = node.submit(assignment, job, other)
    assert refused.status_code == 409
    assert "upload the checkpoints it was asked for" in str(refused.json())


def test_a_result_without_a_trace_is_refused_as_from_an_agent_that_does_not_prove_its_training(
    node: FitNode, started: tuple[Assignment, dict[str, Any], Outcome]
) -> None:
    assignment, job, outcome = started
    old = replace(outcome, proof={"loss_micro": outcome.proof["loss_micro"]})
    response = node.upload_and_submit(assignment, job, old)
    assert response.status_code == 400
    assert "This node's agent does not prove its training; update it." in response.json()["compute_result"][0]
    malformed = replace(outcome, proof={**outcome.proof, "trace": {**outcome.proof["trace"], "leaves": 1}})
    response = node.submit(assignment, job, malformed)
    assert response.status_code == 400
    assert "leaves must be an integer from 2" in response.json()["compute_result"][0]
    assert Assignment.objects.get(pk=assignment.pk).state == Assignment.State.RUNNING


def test_a_trace_json_that_is_not_the_signed_chain_is_rejected_with_the_reason(
    node: FitNode, started: tuple[Assignment, dict[str, Any], Outcome]
) -> None:
    assignment, job, outcome = started
    trace_file = outcome.artifacts[TRACE_FILE]
    doctored = json.loads(trace_file.read_text())
    doctored["leaves"][2]["loss_micro"] += 1  # one figure changed after the root was signed
    trace_file.write_text(json.dumps(doctored))
    response = node.upload_and_submit(assignment, job, outcome)
    assert response.json() == {"state": "submitted"}  # nothing to challenge: straight to its verdict
    assert verify_assignment(str(assignment.pk)) == "rejected"
    assert Assignment.objects.get(pk=assignment.pk).reason == (
        "training not proven: trace.json's Merkle root is not the one in the signed proof."
    )


def test_checkpoints_are_taken_only_when_challenged_and_only_with_their_committed_hash(
    node: FitNode, started: tuple[Assignment, dict[str, Any], Outcome], bob: Any, tmp_path: Path
) -> None:
    assignment, _, outcome = started
    early = node.put(assignment, checkpoint_name(1), outcome.checkpoints[checkpoint_name(1)].read_bytes())
    assert early.status_code == 400
    assert "only when the platform asks for them" in early.json()["name"][0]
    # A longer chain, so that some checkpoints are not picked.
    task = post_task(bob, "toy_fit", {"steps": 300, "every": 1, "target": 1000}, max_attempts=1)
    Assignment.objects.filter(pk=assignment.pk).update(state=Assignment.State.EXPIRED)
    (long,) = scheduler.schedule(task.pk)
    long_job = node.job(long)
    (tmp_path / "long").mkdir()
    long_outcome = run(long_job, tmp_path / "long", lambda *a: None)
    answer = node.upload_and_submit(long, long_job, long_outcome).json()
    wanted = answer["challenge"]["checkpoints"]
    assert len(answer["challenge"]["segments"]) == segments_needed(300, 0.99, 0.10) < 300
    spare = next(n for n in long_outcome.checkpoints if n not in wanted)
    refused = node.put(long, spare, long_outcome.checkpoints[spare].read_bytes())
    assert refused.status_code == 400
    assert refused.json()["name"][0].startswith(f"{spare} was not challenged")
    beyond = node.put(long, checkpoint_name(301), b"x")
    assert beyond.status_code == 400
    assert checkpoint_name(301) in beyond.json()["name"][0]
    # A checkpoint whose bytes are not the committed ones (another state of the same run).
    forged = node.put(long, wanted[0], long_outcome.checkpoints[wanted[1]].read_bytes())
    assert forged.status_code == 400
    assert forged.json()["file"][0].startswith(f"{wanted[0]} does not hash to the state_sha256")
    assert Assignment.objects.get(pk=long.pk).state == Assignment.State.RUNNING
    # Once the result is signed, the model and trace can no longer change.
    swapped = node.put(long, WEIGHTS, weights_bytes(1.0))
    assert swapped.status_code == 409


def test_a_model_that_is_not_a_checkpoint_of_the_chain_is_rejected(
    node: FitNode, started: tuple[Assignment, dict[str, Any], Outcome]
) -> None:
    assignment, job, outcome = started
    # The honest chain, but a model of the run's final weight nudged: a cheaper model
    # passed off as the trained one.
    (outcome.artifacts[WEIGHTS]).write_bytes(weights_bytes(999.5))
    outcome = replace(outcome, result_hash=sha256_file(outcome.artifacts[WEIGHTS]))
    answer = node.upload_and_submit(assignment, job, outcome).json()
    answer_challenge(node, assignment, answer, outcome)
    assert verify_assignment(str(assignment.pk)) == "rejected"
    assert Assignment.objects.get(pk=assignment.pk).reason == (
        "training not proven: the submitted model's weights are not those of any checkpoint in trace.json."
    )


def test_a_run_that_skipped_steps_is_caught_by_the_replay_and_not_paid(
    node: FitNode, started: tuple[Assignment, dict[str, Any], Outcome], tmp_path: Path
) -> None:
    assignment, job, _ = started
    # Half the steps skipped, the chain committed honestly to what was done.
    out = tmp_path / "lazy"
    out.mkdir()
    trace, checkpoints, x = train(SPEC, out, skip_every=1)
    (out / WEIGHTS).write_bytes(weights_bytes(x))
    (out / "metrics.json").write_text("{}")
    trace.write(out / TRACE_FILE)
    lazy = Outcome(
        result_hash=sha256_file(out / WEIGHTS),
        proof={"loss_micro": 0, "trace": trace.commitment()},
        artifacts={name: out / name for name in (WEIGHTS, "metrics.json", TRACE_FILE)},
        checkpoints=checkpoints,
    )
    answer = node.upload_and_submit(assignment, job, lazy).json()
    answer_challenge(node, assignment, answer, lazy)
    assert verify_assignment(str(assignment.pk)) == "rejected"
    reason = Assignment.objects.get(pk=assignment.pk).reason
    assert reason.startswith("training not proven: segment 0 (steps 0→3): re-executed, x is ")
    node.worker.refresh_from_db()
    assert node.worker.earnings == 0


def test_a_node_that_never_answers_its_challenge_expires_at_its_deadline(
    node: FitNode, started: tuple[Assignment, dict[str, Any], Outcome]
) -> None:
    assignment, job, outcome = started
    assert node.upload_and_submit(assignment, job, outcome).status_code == 202
    Assignment.objects.filter(pk=assignment.pk).update(deadline=timezone.now() - timedelta(seconds=1))
    assert scheduler.expire_overdue() == 1
    expired = Assignment.objects.get(pk=assignment.pk)
    assert (expired.state, expired.reason) == (Assignment.State.EXPIRED, "Deadline passed or the worker went silent.")
    late = node.put(assignment, checkpoint_name(0), outcome.checkpoints[checkpoint_name(0)].read_bytes())
    assert late.status_code == 409


def test_the_challenge_follows_from_the_signed_root_and_the_platform_secret_alone() -> None:
    """A node cannot know the picked segments before it signs its root: they change with
    the root and with the platform's secret, which it never sees."""
    leaves = tuple(Leaf(i, i, 0, 0, f"{i:064x}", f"{i:064x}") for i in range(301))
    root = Trace(every=1, leaves=leaves).root
    other_root = Trace(every=1, leaves=(*leaves[:-1], replace(leaves[-1], loss_micro=1))).root
    commit = {"version": 1, "root": root, "every": 1, "leaves": 301}
    drawn = proof.draw(commit)
    assert len(drawn) == segments_needed(300, 0.99, 0.10)
    assert drawn == proof.draw(dict(commit))  # fixed once the root is
    assert drawn != proof.draw({**commit, "root": other_root})
    with override_settings(TRACE_SECRET=b"another platform's secret, 32 bytes long"):
        assert proof.draw(commit) != drawn
    assert drawn != challenge(root, b"", 300, len(drawn))


# --- the agent's own code against the real platform ----------------------------------------


@pytest.fixture
def agent(node: FitNode) -> Iterator[Node]:
    with in_process_agent(node) as running:
        yield running


def test_the_agent_uploads_exactly_the_challenged_checkpoints_and_the_result_is_verified(
    agent: Node, node: FitNode, bob: Any
) -> None:
    task = post_task(bob, "toy_fit", SPEC, max_attempts=1)
    (assignment,) = scheduler.schedule(task.pk)
    assert agent.run_assignment(str(assignment.pk)) == "submitted"
    assert Assignment.objects.get(pk=assignment.pk).state == Assignment.State.SUBMITTED
    assert verify_assignment(str(assignment.pk)) == "accepted"


def test_an_agent_asked_for_a_checkpoint_it_does_not_have_reports_the_job_failed(
    agent: Node, node: FitNode, bob: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def without_checkpoints(job: dict[str, Any], workdir: Path, progress: Any) -> Outcome:
        return replace(run(job, workdir, progress), checkpoints={})

    monkeypatch.setitem(node_kinds.KINDS, FIT.name, replace(FIT, run=without_checkpoints))
    task = post_task(bob, "toy_fit", SPEC, max_attempts=1)
    (assignment,) = scheduler.schedule(task.pk)
    assert agent.run_assignment(str(assignment.pk)) == "failed"
    failed = Assignment.objects.get(pk=assignment.pk)
    assert failed.state == Assignment.State.EXPIRED
    assert "asked for checkpoints this run did not write: ckpt-00000.safetensors" in failed.reason
