"""Provider pages through the Django test client: register a node, my workers, one
worker, suspend/resume/retire, and the task page's live state (HTML and live.json)."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from ledger.units import UNITS_PER_CREDIT
from tests.factories import PASSWORD, make_worker, post_task
from tests.form_nonces import nonce_in, submit
from workers.identity import services
from workers.models import Assignment, RegistrationToken, Worker

pytestmark = pytest.mark.django_db

CAPS = {
    "cpu_cores": 16,
    "ram_bytes": 64 * 2**30,
    "gpu_name": "NVIDIA H100",
    "gpu_memory_bytes": 80 * 2**30,
    "cuda_version": "12.4",
    "kinds": ["synthetic", "cube_training"],
    "features": ["poc:aes256ctr", "poc:shake128"],
    "agent_version": "0.1",
}


def make_rig(owner: Any, name: str, *, capabilities: dict[str, Any] = CAPS, **fields: Any) -> Worker:
    """A worker with this module's H100 capabilities (``tests.factories.make_worker``)."""
    return make_worker(owner, name=name, caps=capabilities, **fields).worker


def make_assignment(task: Any, worker: Worker, **fields: Any) -> Assignment:
    fields.setdefault("state", Assignment.State.RUNNING)
    return Assignment.objects.create(
        task=task, worker=worker, seed_block_hash="0" * 64, deadline=timezone.now() + timedelta(hours=1), **fields
    )


def login(username: str) -> Client:
    client = Client()
    assert client.login(username=username, password=PASSWORD)
    return client


def text(response: Any) -> str:
    """The page's visible text, whitespace collapsed, for assertions a reader can follow."""
    body = re.sub(r"<script.*?</script>|<[^>]+>", " ", response.content.decode(), flags=re.S)
    return re.sub(r"\s+", " ", body)


# --- Anonymous and other users ------------------------------------------------------------


@pytest.mark.parametrize("path", ["/workers/", "/workers/register"])
def test_anonymous_visitors_are_sent_to_log_in(client: Client, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=")


def test_another_users_worker_is_not_found_and_not_listed(alice: Any, bob: Any) -> None:
    worker = make_rig(alice, "alice-rig")
    bob_client = login("bob")
    assert bob_client.get(f"/workers/{worker.pk}/").status_code == 404
    assert "alice-rig" not in text(bob_client.get("/workers/"))
    response = bob_client.post(f"/workers/{worker.pk}/suspend/")
    assert response.status_code == 404
    worker.refresh_from_db()
    assert worker.state == Worker.State.ACTIVE


# --- Registration token -------------------------------------------------------------------


def test_the_register_page_creates_a_token_once_and_shows_the_commands(alice: Any, settings: Any) -> None:
    settings.REDIS_URL = settings.CELERY_BROKER_URL = "redis://:s3cret@broker.example:6379/0"
    settings.NODE_BROKER_URL = "amqps://platform:pl4tform@broker.example:5671/nodes"
    client = login("alice")
    page = client.get("/workers/register")
    assert page.status_code == 200
    assert "Create registration token" in text(page)
    assert RegistrationToken.objects.count() == 0

    response = client.post("/workers/register", {"form_nonce": nonce_in(page)})
    assert response.status_code == 200
    raw = re.search(r'<code id="registration-token">(pwr_[\w-]+)</code>', response.content.decode())
    assert raw is not None
    token = RegistrationToken.objects.get(owner=alice)
    # Stored hashed, never raw; usable for an hour.
    assert token.token_hash == services.hash_secret(raw.group(1))
    assert raw.group(1) not in token.token_hash
    assert token.is_usable
    assert timedelta(minutes=59) < token.expires_at - timezone.now() <= timedelta(hours=1)
    body = text(response)
    assert "shown only this once" in body
    assert "python -m workers.agent init" in body
    assert f"python -m workers.agent register --server http://testserver --token {raw.group(1)}" in body
    # The node's broker login comes with registration: no broker, Redis least of all, is named.
    assert '<code id="cmd-run">.venv/bin/python -m workers.agent run</code>' in response.content.decode()
    assert "worker.json" in body
    for secret in ("s3cret", "redis://", "broker.example", "pl4tform"):
        assert secret not in response.content.decode()

    # Shown once: a reload offers the button again, not the token.
    again = client.get("/workers/register")
    assert raw.group(1) not in again.content.decode()


def test_the_embedded_broker_command_names_its_folder(alice: Any, settings: Any, tmp_path: Any) -> None:
    # Even beside the platform's Redis (development), node queues are on the filesystem broker.
    settings.REDIS_URL = settings.CELERY_BROKER_URL = "redis://:s3cret@127.0.0.1:6379/0"
    settings.NODE_BROKER_URL = None
    settings.NODE_QUEUE_DIR = tmp_path / "celery" / "out"
    body = text(submit(login("alice"), "/workers/register", "/workers/register"))
    assert "redis" not in body
    assert "s3cret" not in body
    assert f"python -m workers.agent run --broker filesystem:// --broker-folder {tmp_path / 'celery' / 'out'}" in body


def test_creating_a_token_needs_the_csrf_token(alice: Any) -> None:
    client = Client(enforce_csrf_checks=True)
    client.login(username="alice", password=PASSWORD)
    assert client.post("/workers/register").status_code == 403
    assert RegistrationToken.objects.count() == 0


# --- My workers ---------------------------------------------------------------------------


def test_my_workers_lists_status_capabilities_and_record(alice: Any, bob: Any) -> None:
    online = make_rig(alice, "h100-box", benchmark_gflops=51234.5, jobs_done=7, earnings=12_500_000_000)
    make_rig(alice, "sleepy", online=False, capabilities={"cpu_cores": 4, "kinds": ["synthetic"]})
    make_rig(alice, "paused", state=Worker.State.SUSPENDED)
    make_rig(alice, "gone", state=Worker.State.RETIRED)
    make_rig(bob, "bobs-rig")

    response = login("alice").get("/workers/")
    assert response.status_code == 200
    html = response.content.decode()
    body = text(response)
    for name in ("h100-box", "sleepy", "paused", "gone"):
        assert name in body
    assert "bobs-rig" not in body
    # Status per row, from heartbeats and state.
    statuses = dict(re.findall(r'data-worker-id="([0-9a-f-]+)".*?data-worker-status="(\w+)"', html, flags=re.S))
    by_name = {w.name: str(w.pk) for w in Worker.objects.filter(owner=alice)}
    assert statuses[by_name["h100-box"]] == "online"
    assert statuses[by_name["sleepy"]] == "offline"
    assert statuses[by_name["paused"]] == "suspended"
    assert statuses[by_name["gone"]] == "retired"
    # Capabilities, benchmark, earnings in credits, full address in the title.
    assert "NVIDIA H100 (80.0 GiB)" in body
    for shown in ("16 cores", "64.0 GiB", "CUDA 12.4"):
        assert shown in body
    assert "synthetic, cube_training" in body
    assert "poc:aes256ctr, poc:shake128" in body
    assert "51234.5" in body
    assert "12.5" in body
    assert f'title="{online.address}"' in html
    # Only the transitions each state allows are offered.
    assert f"/workers/{online.pk}/suspend/" in html
    assert f"/workers/{by_name['paused']}/resume/" in html
    assert f"/workers/{by_name['gone']}/" in html
    assert f"/workers/{by_name['gone']}/retire/" not in html


def test_a_worker_with_a_running_assignment_is_busy(alice: Any, bob: Any) -> None:
    task = post_task(bob, budget=UNITS_PER_CREDIT)
    worker = make_rig(alice, "worker-a")
    make_assignment(task, worker)
    html = login("alice").get("/workers/").content.decode()
    assert 'data-worker-status="busy"' in html


def test_suspend_resume_and_retire_through_the_page(alice: Any) -> None:
    worker = make_rig(alice, "rig")
    client = login("alice")

    response = client.post(f"/workers/{worker.pk}/suspend/", follow=True)
    assert response.redirect_chain[-1][0] == "/workers/"
    assert "Worker “rig” suspended." in text(response)
    worker.refresh_from_db()
    assert worker.state == Worker.State.SUSPENDED

    response = client.post(f"/workers/{worker.pk}/resume/", {"next": "detail"}, follow=True)
    assert response.redirect_chain[-1][0] == f"/workers/{worker.pk}/"
    assert "Worker “rig” resumed." in text(response)
    worker.refresh_from_db()
    assert worker.state == Worker.State.ACTIVE

    response = client.post(f"/workers/{worker.pk}/retire/", follow=True)
    assert "Worker “rig” retired." in text(response)
    worker.refresh_from_db()
    assert worker.state == Worker.State.RETIRED
    assert worker.retired_at is not None


def test_an_illegal_transition_is_a_message_not_an_error(alice: Any) -> None:
    worker = make_rig(alice, "rig", state=Worker.State.RETIRED)
    response = login("alice").post(f"/workers/{worker.pk}/resume/", follow=True)
    assert response.status_code == 200
    assert "A retired worker cannot become active." in text(response)
    worker.refresh_from_db()
    assert worker.state == Worker.State.RETIRED


def test_an_unknown_action_is_not_found(alice: Any) -> None:
    worker = make_rig(alice, "rig")
    assert login("alice").post(f"/workers/{worker.pk}/explode/").status_code == 404
    assert login("alice").get(f"/workers/{worker.pk}/suspend/").status_code == 405


def test_the_worker_page_shows_its_recent_assignments(alice: Any, bob: Any) -> None:
    task = post_task(bob, title="Matmul for bob", budget=UNITS_PER_CREDIT)
    worker = make_rig(alice, "rig", reputation=73)
    make_assignment(task, worker, state=Assignment.State.EXPIRED, progress=40.0, reason="Heartbeat timed out.")
    response = login("alice").get(f"/workers/{worker.pk}/")
    assert response.status_code == 200
    body = text(response)
    assert worker.address in body
    assert "Matmul for bob" in body
    for shown in ("Expired", "40%", "Heartbeat timed out."):
        assert shown in body
    assert "73 / 100" in body


# --- The task page's live state ------------------------------------------------------------


def test_the_task_page_renders_assignments_history_and_log_tail(alice: Any, bob: Any) -> None:
    task = post_task(bob, budget=UNITS_PER_CREDIT)
    worker = make_rig(alice, "alice-h100")
    history = [{"t": 1.0, "step": 1, "loss": 0.9}, {"t": 2.0, "step": 2, "loss": 0.7}]
    make_assignment(task, worker, progress=20.0, history=history, log_tail=["epoch 1 done"])
    response = login("bob").get(f"/tasks/{task.pk}/")
    assert response.status_code == 200
    body = text(response)
    for shown in ("alice-h100", "20%", "epoch 1 done"):
        assert shown in body
    data = re.search(r'<script id="task-live-data" type="application/json">(.*?)</script>', response.content.decode())
    assert data is not None
    live = json.loads(data.group(1))
    assert live["assignments"][0]["history"] == history
    assert live["assignments"][0]["worker"] == "alice-h100"


def test_live_json_is_for_the_task_owner_only(alice: Any, bob: Any) -> None:
    task = post_task(bob, budget=UNITS_PER_CREDIT)
    worker = make_rig(alice, "alice-h100")
    make_assignment(task, worker, progress=50.0, history=[{"t": 1.0, "step": 5, "loss": 0.5}], log_tail=["hi"])

    response = login("bob").get(f"/workers/tasks/{task.pk}/live.json")
    assert response.status_code == 200
    body = response.json()
    assert body["task_id"] == str(task.pk)
    [row] = body["assignments"]
    assert row["worker"] == "alice-h100"
    assert row["state"] == "running"
    assert row["progress"] == 50.0
    assert row["history"] == [{"t": 1.0, "step": 5, "loss": 0.5}]
    assert row["log_tail"] == ["hi"]

    # The worker's owner is not the task's owner: not theirs to read.
    assert login("alice").get(f"/workers/tasks/{task.pk}/live.json").status_code == 404
    assert Client().get(f"/workers/tasks/{task.pk}/live.json").status_code == 302


def test_a_workers_page_says_which_waiting_tasks_it_could_take_and_what_the_rest_need(alice: Any, bob: Any) -> None:
    """Counts only: the provider learns what would win its node more work, not whose tasks wait."""
    worker = make_rig(
        alice, "old-rig", capabilities={**CAPS, "kinds": ["synthetic"], "features": ["poc:shake128"]}, reputation=50
    )
    page = login("alice").get(f"/workers/{worker.pk}/")
    assert "None right now." in text(page)
    post_task(bob, "synthetic", {"n": 64, "generator": "shake128"}, budget=UNITS_PER_CREDIT)  # fits
    post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)  # an AES task: the agent is too old
    post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    post_task(bob, "synthetic", {"n": 64, "generator": "shake128"}, budget=UNITS_PER_CREDIT, min_reputation=80)
    had = post_task(bob, "synthetic", {"n": 64, "generator": "shake128"}, budget=UNITS_PER_CREDIT, replication=2)
    make_assignment(had, worker, state=Assignment.State.REJECTED)
    body = text(login("alice").get(f"/workers/{worker.pk}/"))
    assert " 1 of the 5 waiting fits this worker" in body
    assert "2 need an agent supporting poc:aes256ctr: update the agent on the node." in body
    assert "1 needs a reputation above its 50; verified results raise it." in body
    assert "It already has 1 of them, had its result for them rejected, or lost them twice." in body
    assert "bob" not in body
    # A task whose stored spec the platform can no longer read is left out, not a 500.
    from marketplace.models import Task

    broken = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    Task.objects.filter(pk=broken.pk).update(spec={"count": 1})
    body = text(login("alice").get(f"/workers/{worker.pk}/"))
    assert " 1 of the 5 waiting fits this worker" in body
    # Another of alice's nodes holds a replica of a task: not this node's to take either.
    sibling = make_rig(alice, "new-rig", capabilities={**CAPS, "kinds": ["synthetic"]}, reputation=50)
    pair = post_task(bob, "synthetic", {"n": 64, "generator": "shake128"}, budget=UNITS_PER_CREDIT, replication=2)
    make_assignment(pair, sibling, state=Assignment.State.RUNNING)
    body = text(login("alice").get(f"/workers/{worker.pk}/"))
    assert " 1 of the 6 waiting fits this worker" in body
    assert (
        "1 has a replica on another of your nodes (or had one short of its quality bar):"
        " replicas go to different providers." in body
    )


def test_a_workers_page_says_how_many_waiting_tasks_bid_under_its_ask(alice: Any, bob: Any) -> None:
    from workers.market.asks import set_ask

    worker = make_rig(alice, "dear-rig", capabilities={**CAPS, "kinds": ["synthetic"]}, reputation=50)
    set_ask(worker, "synthetic", 0, UNITS_PER_CREDIT)  # 1 credit a job, 1.05 with the fee
    post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)  # bids 1: under it
    post_task(bob, "synthetic", {"n": 64}, budget=2 * UNITS_PER_CREDIT)  # bids 2: fits
    body = text(login("alice").get(f"/workers/{worker.pk}/"))
    assert " 1 of the 2 waiting fits this worker" in body
    assert "1 bids less than it asks for it (the highest bids 1 credits" in body
