"""A new kind is one plug-in per side: the toy kind of tests/toykind, registered for the
test only, is listed with its derived schema, validated, posted, scheduled, run by the
agent's own code, verified and paid, with no other file of the platform or node touched;
and a wrong answer under a matching hash is refused and not paid."""

from __future__ import annotations

import json
from dataclasses import replace
from importlib import import_module
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from ledger import services as ledger
from ledger.units import UNITS_PER_CREDIT
from marketplace import kinds as platform_kinds
from marketplace.models import Task, TaskStatus
from tests.factories import CAPS, make_worker, post_task
from tests.toykind.kind import ARTIFACT, TOY
from training import kinds as node_kinds
from training.plugin import Outcome, sha256_file
from workers.agent import runners
from workers.agent.identity import Credentials
from workers.agent.jobs import Node
from workers.assignments import scheduler, settlement
from workers.models import Assignment
from workers.tasks import verify_assignment

pytestmark = pytest.mark.django_db

TOY_CAPS = {**CAPS, "kinds": ["toy_sum"], "features": []}


@pytest.fixture(autouse=True)
def toy_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    """Register the toy kind as a new kind is registered: its verifier module loaded (it
    registers itself with ``@verifies``, as ``workers.verification.load`` loads each module of
    that package at start), its plug-in listed with the node's kinds (as ``training/kinds.py``
    lists each), and the platform's view derived from the two (as ``marketplace.kinds`` derives
    every kind's). The verifier stays registered; the kind is listed for the test only."""
    import_module("tests.toykind.verifier")
    monkeypatch.setitem(node_kinds.KINDS, TOY.name, TOY)
    monkeypatch.setitem(platform_kinds.KINDS, TOY.name, platform_kinds.Kind.of(TOY))


class ToyNode:
    """One registered node running toy jobs through the REST API, as the agent does."""

    def __init__(self, owner: Any) -> None:
        self.worker, token, self.key = make_worker(owner, name="toy-node", caps=TOY_CAPS)
        self.client = APIClient()
        self.client.credentials(HTTP_AUTHORIZATION=f"Worker {token}")

    def url(self, assignment: Assignment, tail: str = "") -> str:
        return f"/api/v1/assignments/{assignment.pk}/{tail}"

    def run(self, assignment: Assignment, workdir: Path, *, lie: bool = False) -> Any:
        job = self.client.get(self.url(assignment)).json()
        assert job["kind"] == "toy_sum"
        assert self.client.post(self.url(assignment, "start/")).status_code == 200
        outcome = runners.run(job, workdir, lambda step, total, metrics: None)
        if lie:  # a wrong total, committed to honestly: only recomputing catches it
            path = outcome.artifacts[ARTIFACT]
            path.write_text(json.dumps({"total": json.loads(path.read_text())["total"] + 1}))
            outcome = Outcome(sha256_file(path), outcome.proof, outcome.artifacts)
        for name, path in outcome.artifacts.items():
            response = self.client.put(
                self.url(assignment, f"artifacts/{name}/"),
                data=path.read_bytes(),
                content_type="application/octet-stream",
                HTTP_CONTENT_DISPOSITION=f'attachment; filename="{name}"',
            )
            assert response.status_code == 201, response.content
        creds = Credentials(
            server="http://testserver", worker_id=str(self.worker.pk), address=self.key.address, token=""
        )
        node = Node(self.key, creds, "http://testserver")
        try:
            body = node.sign_result(job, outcome)
        finally:
            node.http.close()
        return self.client.post(self.url(assignment, "result/"), body, format="json")


def test_the_toy_kind_is_listed_with_the_schema_of_its_dataclass(anon_client: APIClient) -> None:
    listed = {k["name"]: k for k in anon_client.get("/api/v1/kinds/").json()}
    assert listed["toy_sum"]["available"] is True
    schema = anon_client.get("/api/v1/kinds/toy_sum/").json()
    props = schema["spec_schema"]["properties"]
    assert props["count"] == {
        "type": "integer",
        "minimum": 1,
        "maximum": 10_000,
        "default": 100,
        "description": "How many integers to sum.",
    }


def test_the_platform_finds_the_verifier_a_module_registers_and_offers_no_kind_without_one() -> None:
    from tests.toykind.verifier import verify_toy
    from workers.verification.base import VERIFIERS

    assert platform_kinds.KINDS["toy_sum"].verifier is verify_toy
    assert platform_kinds.KINDS["toy_sum"].available
    # Each real kind's verifier is the one its family's module registered for it.
    for name in platform_kinds.KIND_NAMES:
        assert platform_kinds.KINDS[name].verifier is VERIFIERS[name]
    unverified = replace(TOY, name="toy_unverified")
    listed = platform_kinds.Kind.of(unverified)
    assert (listed.verifier, listed.available) == (None, False)


def test_a_verifier_of_no_known_kind_is_refused_at_start() -> None:
    from django.core.exceptions import ImproperlyConfigured

    from workers.verification.base import VERIFIERS

    with pytest.raises(ImproperlyConfigured, match="toy_typo"):
        platform_kinds.install_verifiers({**VERIFIERS, "toy_typo": VERIFIERS["toy_sum"]})


def test_a_toy_spec_out_of_bounds_is_refused_naming_the_field(bob: Any) -> None:
    from rest_framework.exceptions import ValidationError

    with pytest.raises(ValidationError) as caught:
        post_task(bob, "toy_sum", {"power": 9}, budget=UNITS_PER_CREDIT)
    detail: Any = caught.value.detail
    assert "power" in detail["spec"]


def test_a_toy_task_runs_end_to_end_and_is_paid(alice: Any, bob: Any, tmp_path: Path) -> None:
    node = ToyNode(alice)
    before = ledger.balance(bob) + ledger.escrowed(bob)
    task = post_task(bob, "toy_sum", {"count": 50, "power": 2}, budget=UNITS_PER_CREDIT)
    assert task.spec == {"count": 50, "power": 2}
    (assignment,) = scheduler.schedule(task.pk)
    assert assignment.worker == node.worker
    response = node.run(assignment, tmp_path)
    assert response.status_code == 202, response.json()
    assert verify_assignment(str(assignment.pk)) == "accepted"
    task.refresh_from_db()
    assert task.status == TaskStatus.COMPLETED
    node.worker.refresh_from_db()
    assert node.worker.earnings > 0
    assert ledger.balance(bob) == before - settlement.reward_per_replica(task)
    assert Assignment.objects.get(pk=assignment.pk).metrics["total"] == sum(i * i for i in range(1, 51))


def test_a_wrong_toy_answer_under_a_matching_hash_is_refused_and_not_paid(alice: Any, bob: Any, tmp_path: Path) -> None:
    node = ToyNode(alice)
    task = post_task(bob, "toy_sum", {"count": 10}, budget=UNITS_PER_CREDIT, max_attempts=1)
    (assignment,) = scheduler.schedule(task.pk)
    assert node.run(assignment, tmp_path, lie=True).status_code == 202
    assert verify_assignment(str(assignment.pk)) == "rejected"
    rejected = Assignment.objects.get(pk=assignment.pk)
    assert rejected.reason == "sum.json does not hold the sum 55."
    node.worker.refresh_from_db()
    assert node.worker.earnings == 0
    assert Task.objects.get(pk=task.pk).status != TaskStatus.COMPLETED
