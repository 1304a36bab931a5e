"""Delegated re-execution through a real verifier node: the job goes out on the node broker
to the agent's own Celery task (``agent.verify_segments`` in a ``workers.agent run``
process), which downloads the worker-facing data and the slots' checkpoints from daphne,
re-executes them and posts its signed answer; the platform then judges it. The worker's
side (a tiny cube_training run) is the agent's code in-process, as in
test_cube_training_proof.py: what is under test here is the verifier's path."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from tests.factories import CAPS, TINY_CUBE, array_npy, make_dataset, post_task
from tests.workers import processes as p
from tests.workers.proving import RestNode, in_process_agent
from training.cube.data import synthetic_embeddings
from workers.assignments import delegation, scheduler
from workers.models import Assignment, VerificationJob, Worker
from workers.tasks import verify_assignment

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("shared_media")]

CUBE_CAPS = {**CAPS, "kinds": ["cube_training", "cube_inference"]}


def test_a_verification_job_runs_through_the_agent_s_own_celery_task(
    alice: Any,
    bob: Any,
    carol: Any,
    tmp_path: Path,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="workers.assignments.delegation")
    # The tiny run's segments are one step each, of which some make no canary: the offer
    # (made in this process) tries until one does.
    monkeypatch.setattr(delegation, "CANARY_TRIES", 50)
    settings.SEGMENT_REEXECUTION = "delegated"
    monkeypatch.setenv("PROOFWORK_SEGMENT_REEXECUTION", "delegated")
    rows, _ = synthetic_embeddings(320, 32, seed=7)
    dataset = make_dataset(bob, array_npy(rows), "teacher.npy")
    task = post_task(bob, "cube_training", TINY_CUBE, dataset=dataset.pk, budget=10 * 10**9, max_attempts=1)
    worker = RestNode(alice, "cube-node", CUBE_CAPS)
    (assignment,) = scheduler.schedule(task.pk)  # the only node online yet: alice's
    with in_process_agent(worker) as agent:
        assert agent.run_assignment(str(assignment.pk)) == "submitted"

    with p.start_init(tmp_path, "verifier") as init, p.daphne(tmp_path) as url:
        key = p.register_agent(tmp_path, url, carol, "verifier", init)
        verifier = Worker.objects.get(owner=carol)
        assert delegation.FEATURE in verifier.capabilities["features"]
        with p.spawn(p.agent_cmd(key, "run", *p.broker_args()), tmp_path / "agent.log", p.child_env()) as node:
            try:
                p.wait_for(
                    lambda: Worker.objects.get(pk=verifier.pk).is_online,
                    60,
                    "the verifier node never sent a heartbeat",
                    explain=lambda: p.logs(tmp_path),
                )
                from workers.assignments import supply

                need = supply.Need.of(task.kind, task.spec, 0)
                seen = Worker.objects.get(pk=verifier.pk)
                assert delegation.eligible_verifiers(assignment) == ([seen], []), (
                    supply.misfit(seen, need),
                    seen.capabilities,
                    list(Worker.objects.online()),
                )
                # Offered, and sent on the verifier's own queue once committed.
                assert verify_assignment(str(assignment.pk)) == "delegated", caplog.text[-3000:]
                job = VerificationJob.objects.get(assignment=assignment)
                assert job.verifier_id == verifier.pk
                p.wait_for(
                    lambda: VerificationJob.objects.get(pk=job.pk).state == VerificationJob.State.ANSWERED,
                    240,
                    "the verifier node never answered",
                    explain=lambda: p.logs(tmp_path),
                )
            finally:
                p.stop(node)
    assert f"verification job {job.pk} answered" in (tmp_path / "agent.log").read_text(errors="replace")
    assert verify_assignment(str(assignment.pk)) == "accepted"
    job.refresh_from_db()
    assert job.outcome == VerificationJob.Outcome.AGREED, job.reason
    done = Assignment.objects.get(pk=assignment.pk)
    assert done.metrics["segments_verified_by_node"] > 0
    assert done.metrics["segments_replayed"] + done.metrics["segments_verified_by_node"] == len(done.challenge)
