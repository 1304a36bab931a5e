"""Delegated re-execution on the real asl_training kind: a run on the small synthetic sign
dataset, trained by the agent's own code against the in-process platform, its challenged
segments offered to a node of another provider, which downloads the worker-facing archive
(never the held-out participant) and the slots' checkpoints, re-executes them with the
kind's ``measure`` and answers (both nodes reading the shards into the cache as they
arrive, keeping none); the platform judges, and the honest worker is paid."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.factories import CAPS, TINY_ASL, make_dataset, post_task
from tests.workers.proving import RestNode, in_process_agent
from training.asl import run as asl_run
from training.asl.source import Source
from training.asl.synthetic import generate
from workers.agent import verify_job
from workers.assignments import delegation, heldout, scheduler
from workers.models import Assignment, VerificationJob
from workers.tasks import verify_assignment

pytestmark = [pytest.mark.slow, pytest.mark.django_db, pytest.mark.usefixtures("one_thread")]

ASL_CAPS = {**CAPS, "kinds": ["asl_training", "asl_inference"]}


def _body(response: Any) -> bytes:
    return b"".join(response.streaming_content) if response.streaming else bytes(response.content)


def test_an_asl_run_re_executed_by_a_verifier_node_of_another_provider_is_paid(
    alice: Any, bob: Any, carol: Any, tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.SEGMENT_REEXECUTION = "delegated"
    # The small run's segments are one step each, of which some make no canary: the offer
    # tries until one does.
    monkeypatch.setattr(delegation, "CANARY_TRIES", 50)
    archive = generate(
        tmp_path / "signs.zip", n_signs=5, n_participants=5, per_participant=2, max_frames=20, as_zip=True
    )
    upload = make_dataset(bob, archive.read_bytes(), "signs.zip")
    task = post_task(bob, "asl_training", dict(TINY_ASL), dataset=upload.pk, budget=10 * 10**9, max_attempts=1)
    worker = RestNode(alice, "asl-node", ASL_CAPS)
    # What the nodes' trainers read (the worker's cache, the verifier's share read on
    # demand): each node reads its shards into the cache as they arrive and keeps none.
    node_reads: list[list[str]] = []
    real_load, real_on_demand = asl_run.load_dataset, asl_run.reading_on_demand

    def seen(location: Path) -> None:
        if Path(location).name == "dataset.shards":  # a node's download, not the platform's share
            node_reads.append(sorted(p.name for p in Path(location).iterdir()))

    def load(location: Path, *args: Any, **kwargs: Any) -> Any:
        seen(location)
        return real_load(location, *args, **kwargs)

    def on_demand(location: Path, *args: Any, **kwargs: Any) -> Any:
        seen(location)
        return real_on_demand(location, *args, **kwargs)

    monkeypatch.setattr(asl_run, "load_dataset", load)
    monkeypatch.setattr(asl_run, "reading_on_demand", on_demand)
    ingested = [".islr_cache", "ingested.json", "sign_to_prediction_index_map.json", "train.csv"]
    (assignment,) = scheduler.schedule(task.pk)
    with in_process_agent(worker) as agent:
        assert agent.run_assignment(str(assignment.pk)) == "submitted"
    assert node_reads == [ingested]
    verifier = RestNode(carol, "asl-verifier", {**ASL_CAPS, "features": [*CAPS["features"], delegation.FEATURE]})
    assert verify_assignment(str(assignment.pk)) == "delegated"
    job = VerificationJob.objects.get(assignment=assignment, verifier=verifier.worker)
    # What the verifier downloads is the worker's share, in shards: no held-out participant in it.
    served = verifier.client.get(f"/api/v1/verifications/{job.pk}/dataset/")
    assert served.status_code == 200
    manifest = json.loads(_body(served))
    downloaded = tmp_path / "verifier-dataset"
    downloaded.mkdir()
    for entry in manifest["files"]:
        part = verifier.client.get(f"/api/v1/verifications/{job.pk}/dataset/{entry['name']}/")
        assert part.status_code == 200, entry["name"]
        (downloaded / entry["name"]).write_bytes(_body(part))
    held_out = heldout.readable(task, heldout.prepared(task).heldout)  # type: ignore[union-attr]
    with Source(downloaded) as share, held_out as readable, Source(readable) as held:
        held_files = set(held.files(".parquet"))
        assert held_files
        assert held_files.isdisjoint(share.files(".parquet"))

    with in_process_agent(verifier) as other:
        assert verify_job.run(other, other.key, str(job.pk)) == "answered"
    assert len(node_reads) > 1
    assert all(names == ingested for names in node_reads)
    job.refresh_from_db()
    by_role: dict[str, list[int]] = {}
    for slot, entry in zip(job.slots, job.answer["answer"]["slots"], strict=True):
        by_role.setdefault(slot["role"], []).append(entry["distance_micro"])
    assert max(by_role["real"]) <= 500_000, by_role
    assert all(d > 500_000 for d in by_role["canary"]), by_role
    assert verify_assignment(str(assignment.pk)) == "accepted", Assignment.objects.get(pk=assignment.pk).reason
    job.refresh_from_db()
    assert job.outcome == VerificationJob.Outcome.AGREED
    done = Assignment.objects.get(pk=assignment.pk)
    assert done.metrics["segments_replayed"] + done.metrics["segments_verified_by_node"] == len(done.challenge)
    worker.worker.refresh_from_db()
    assert worker.worker.earnings > 0
