"""Proof of training for the real cube kind, tried as a dishonest provider would: each run
goes through the agent's own code (download, train with its trace, upload, sign, answer
the challenge) against the real platform in-process, then the platform's verifier. Each
cheat is the node doing less than the spec asks and committing to what it did (or to a
chain it made up); each must be rejected with a reason the requester reads, and the
honest run must be paid."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from marketplace.models import TaskStatus
from tests.factories import CAPS, TINY_CUBE, array_npy, make_dataset, post_task
from tests.workers.proving import RestNode, in_process_agent
from training import kinds as node_kinds
from training.artifacts import read_state_file, save_state_file, weights_sha256
from training.cube.data import synthetic_embeddings
from training.cube.model import CubeModel
from training.cube.run import trainer
from training.plugin import Outcome
from training.trace import TRACE_FILE, Trace, checkpoint_name, file_sha256, read_trace
from workers.agent import verify_job
from workers.agent.jobs import Node
from workers.assignments import delegation, scheduler
from workers.models import Assignment, VerificationJob
from workers.tasks import verify_assignment

pytestmark = [pytest.mark.slow, pytest.mark.django_db, pytest.mark.usefixtures("one_thread")]

CUBE_CAPS = {**CAPS, "kinds": ["cube_training", "cube_inference"]}
UNITS_BUDGET = 10 * 10**9
Run = Callable[[dict[str, Any], Path, Any], Outcome]


@pytest.fixture
def node(alice: Any) -> RestNode:
    return RestNode(alice, "cube-node", CUBE_CAPS)


@pytest.fixture
def agent(node: RestNode) -> Iterator[Node]:
    with in_process_agent(node) as running:
        yield running


def honest_run() -> Run:
    return node_kinds.KINDS["cube_training"].run


def run_as(monkeypatch: pytest.MonkeyPatch, run: Run) -> None:
    """The node's cube_training runner becomes ``run``."""
    monkeypatch.setitem(
        node_kinds.KINDS, "cube_training", dataclasses.replace(node_kinds.KINDS["cube_training"], run=run)
    )


def run_patched(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, value: Any) -> None:
    """The node's cube_training runner trains with ``owner.name`` replaced by ``value``."""
    run = honest_run()

    def patched(job: dict[str, Any], workdir: Path, progress: Any) -> Outcome:
        with monkeypatch.context() as patch:
            patch.setattr(owner, name, value)
            return run(job, workdir, progress)

    run_as(monkeypatch, patched)


def verdict_of(agent: Node, bob: Any, spec: dict[str, Any] | None = None) -> Assignment:
    """Post a cube task on 320 uploaded rows, let ``agent`` run it, verify: the assignment."""
    rows, _ = synthetic_embeddings(320, 32, seed=7)
    dataset = make_dataset(bob, array_npy(rows), "teacher.npy")
    task = post_task(bob, "cube_training", spec or TINY_CUBE, dataset=dataset.pk, budget=UNITS_BUDGET, max_attempts=1)
    (assignment,) = scheduler.schedule(task.pk)
    assert agent.run_assignment(str(assignment.pk)) == "submitted"
    verify_assignment(str(assignment.pk))
    return Assignment.objects.select_related("task").get(pk=assignment.pk)


def rejected_because(assignment: Assignment) -> str:
    assert assignment.state == Assignment.State.REJECTED, (assignment.state, assignment.reason)
    assert assignment.task.status != TaskStatus.COMPLETED
    return assignment.reason


def test_an_honest_cube_run_is_challenged_replayed_accepted_and_paid(agent: Node, node: RestNode, bob: Any) -> None:
    done = verdict_of(agent, bob)
    assert done.state == Assignment.State.ACCEPTED, done.reason
    assert done.metrics["segments_replayed"] >= 30
    assert done.task.status == TaskStatus.COMPLETED
    node.worker.refresh_from_db()
    assert node.worker.earnings > 0


def test_a_cube_trained_without_its_lattice_steps_is_rejected(
    agent: Node, bob: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    forward = CubeModel.forward

    def no_lattice(self: CubeModel, x: torch.Tensor, steps: int | None = None) -> Any:
        return forward(self, x, steps=0)

    run_patched(monkeypatch, CubeModel, "forward", no_lattice)
    reason = rejected_because(verdict_of(agent, bob))
    assert reason.startswith("training not proven: segment ")
    assert "does not re-execute: its end is" in reason


def test_a_cube_trained_for_one_epoch_of_ten_is_rejected(
    agent: Node, bob: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """17 optimizer steps instead of 170, an honest chain of what it did."""
    run = honest_run()

    def short(job: dict[str, Any], workdir: Path, progress: Any) -> Outcome:
        return run({**job, "spec": {**job["spec"], "epochs": 1}}, workdir, progress)

    run_as(monkeypatch, short)
    reason = rejected_because(verdict_of(agent, bob))
    assert reason.startswith("training not proven: trace.json ends after 17 of the 170 optimizer steps")
    assert "early stopping may end it after 102 steps" in reason


def test_a_cube_trained_on_other_rows_is_rejected(agent: Node, bob: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rows a worker could once regenerate (the spec's seed, stream 1: what the held-out
    draw followed before it took a platform secret) in place of a fifth of its own: as many
    steps, other data."""
    run = honest_run()

    def other_rows(job: dict[str, Any], workdir: Path, progress: Any) -> Outcome:
        path = workdir / "dataset.npy"
        rows = np.load(path)
        regenerated, _ = synthetic_embeddings(len(rows) // 5, 32, seed=int(job["spec"]["seed"]), stream=1)
        rows[: len(regenerated)] = regenerated
        np.save(path, rows.astype(np.float32))
        return run(job, workdir, progress)

    run_as(monkeypatch, other_rows)
    reason = rejected_because(verdict_of(agent, bob))
    assert reason.startswith("training not proven: segment ")
    assert "does not re-execute: its end is" in reason


def test_a_fabricated_checkpoint_chain_is_rejected(agent: Node, bob: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The honest start and end, every checkpoint between them interpolated, the chain
    recommitted: what a node would hand in to claim a run it did only part of."""
    run = honest_run()

    def fabricated(job: dict[str, Any], workdir: Path, progress: Any) -> Outcome:
        outcome = run(job, workdir, progress)
        trace = read_trace(outcome.artifacts[TRACE_FILE])
        first, last = trace.leaves[0], trace.leaves[-1]
        start = read_state_file(outcome.checkpoints[checkpoint_name(0)], 1 << 30)
        end = read_state_file(outcome.checkpoints[checkpoint_name(last.index)], 1 << 30)
        model = trainer(job["spec"], None if not job.get("dataset") else workdir / "data", "cpu").model
        leaves = [first]
        for leaf in trace.leaves[1:-1]:
            share = leaf.step / last.step
            state = {
                **end,
                "model": {k: start["model"][k] + share * (end["model"][k] - start["model"][k]) for k in end["model"]},
                "loop": {**end["loop"], "global_step": leaf.step},
            }
            path = outcome.checkpoints[checkpoint_name(leaf.index)]
            save_state_file(path, state)
            model.load_state_dict(state["model"])
            leaves.append(
                dataclasses.replace(leaf, state_sha256=file_sha256(path), weights_sha256=weights_sha256(model))
            )
        leaves.append(last)
        forged = Trace(every=trace.every, leaves=tuple(leaves))
        forged.write(outcome.artifacts[TRACE_FILE])
        return dataclasses.replace(outcome, proof={**outcome.proof, "trace": forged.commitment()})

    run_as(monkeypatch, fabricated)
    reason = rejected_because(verdict_of(agent, bob))
    assert reason.startswith("training not proven: segment ")
    assert "does not re-execute" in reason or "cannot be re-executed" in reason


def test_a_cube_run_that_skipped_a_tenth_of_its_steps_is_rejected(
    agent: Node, bob: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every tenth optimizer step left out (its batch never trained on), the chain committed
    to what was done: a tenth of the segments are wrong, and the challenge is sized to
    catch that 99 times in 100."""
    step = torch.optim.AdamW.step
    calls = {"n": 0}

    def skipping(self: torch.optim.AdamW, *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        return None if calls["n"] % 10 == 0 else step(self, *args, **kwargs)

    run_patched(monkeypatch, torch.optim.AdamW, "step", skipping)
    reason = rejected_because(verdict_of(agent, bob))
    assert reason.startswith("training not proven: segment ")
    assert "does not re-execute: its end is" in reason


def test_a_chain_committing_to_a_model_other_than_the_untrained_one_is_rejected(
    agent: Node, bob: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node that starts from weights of its own (another seed, or a model trained
    elsewhere) and proves only the steps it took from there."""
    run = honest_run()

    def other_start(job: dict[str, Any], workdir: Path, progress: Any) -> Outcome:
        return run({**job, "spec": {**job["spec"], "seed": int(job["spec"]["seed"]) + 1}}, workdir, progress)

    run_as(monkeypatch, other_start)
    reason = rejected_because(verdict_of(agent, bob))
    assert reason.startswith("training not proven: ")


def test_a_cube_run_re_executed_by_a_verifier_node_of_another_provider_is_paid(
    agent: Node, node: RestNode, bob: Any, carol: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Delegated mode on the real kind: the verifier node downloads the worker-facing data and
    the slots' checkpoints, re-executes them with the agent's own code, finds the real
    segments in and the canary (the segment trained again with some steps on other rows) out;
    the platform re-executes only the segment behind the canary, and the honest worker is paid."""
    settings.SEGMENT_REEXECUTION = "delegated"
    # The tiny run's segments are one step each, of which some make no canary: the offer
    # tries until one does.
    monkeypatch.setattr(delegation, "CANARY_TRIES", 50)
    rows, _ = synthetic_embeddings(320, 32, seed=7)
    dataset = make_dataset(bob, array_npy(rows), "teacher.npy")
    task = post_task(bob, "cube_training", TINY_CUBE, dataset=dataset.pk, budget=UNITS_BUDGET, max_attempts=1)
    (assignment,) = scheduler.schedule(task.pk)
    assert agent.run_assignment(str(assignment.pk)) == "submitted"
    verifier = RestNode(carol, "cube-verifier", {**CUBE_CAPS, "features": [*CAPS["features"], delegation.FEATURE]})
    assert verify_assignment(str(assignment.pk)) == "delegated"
    job = VerificationJob.objects.get(assignment=assignment, verifier=verifier.worker)
    with in_process_agent(verifier) as other:
        assert verify_job.run(other, other.key, str(job.pk)) == "answered"
    job.refresh_from_db()
    by_role: dict[str, list[int]] = {}
    for slot, entry in zip(job.slots, job.answer["answer"]["slots"], strict=True):
        by_role.setdefault(slot["role"], []).append(entry["distance_micro"])
    assert max(by_role["real"]) <= 500_000
    assert all(d > 500_000 for d in by_role["canary"]), by_role  # beyond the tolerance: failed
    assert verify_assignment(str(assignment.pk)) == "accepted"
    job.refresh_from_db()
    assert job.outcome == VerificationJob.Outcome.AGREED
    done = Assignment.objects.get(pk=assignment.pk)
    own, vouched = done.metrics["segments_replayed"], done.metrics["segments_verified_by_node"]
    assert own in (1, 2)  # the canary's segment, and the decoy's after it
    assert own + vouched == len(done.challenge)
    node.worker.refresh_from_db()
    assert node.worker.earnings > 0
