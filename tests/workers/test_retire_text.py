"""What the provider pages tell a provider before it acts: the retire button's confirmation
names the earnings retiring would strand, the register page says where and with which
Python its commands run (and they do, as shown), and a fresh heartbeat is "just now"."""

from __future__ import annotations

import html
import os
import re
import shlex
import subprocess
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from ledger import services as ledger
from ledger.units import UNITS_PER_CREDIT, format_credits
from tests.form_nonces import submit
from tests.workers.test_pages import make_rig
from workers.assignments import sweep
from workers.models import Worker

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]


def web(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def pay(worker: Worker, payer: Any, units: int) -> int:
    """Reward the worker's address out of a task's escrow, as settlement does."""
    task_id = uuid.uuid4()
    ledger.lock_escrow(task_id, payer, units, reference=f"lock:{task_id}")
    ledger.release_to_worker(task_id, worker.address, units, reference=f"reward:{task_id}")
    return ledger.address_balance(worker.address)


def retire_confirmation(page: str, worker: Worker) -> str:
    match = re.search(rf'action="/workers/{worker.pk}/retire/" class="inline" data-confirm="([^"]*)"', page)
    assert match, page
    return html.unescape(match.group(1))


# --- Retiring -------------------------------------------------------------------------------


def test_retiring_a_worker_with_unswept_earnings_names_them_and_says_to_sweep_first(alice: Any, bob: Any) -> None:
    rig = make_rig(alice, "rig")
    unswept = pay(rig, bob, 3 * UNITS_PER_CREDIT)
    assert unswept > sweep.sweep_fee()
    client = web(alice)

    listed = retire_confirmation(client.get("/workers/").content.decode(), rig)
    assert listed.startswith("Retire “rig”? Retiring is final: its token stops working")
    assert f"Its address still holds {format_credits(unswept)} credits of unswept earnings" in listed
    assert "a retired worker can no longer sweep them: sweep them to your wallet first" in listed
    assert "the worker's page shows the command" in listed

    own_page = client.get(f"/workers/{rig.pk}/").content.decode()
    on_page = retire_confirmation(own_page, rig)
    assert f"Its address still holds {format_credits(unswept)} credits of unswept earnings" in on_page
    assert "the command is under Unswept earnings on this page" in on_page
    assert 'id="cmd-sweep"' in own_page  # where the confirmation points


def test_retiring_a_suspended_worker_says_what_sweeping_first_takes(alice: Any, bob: Any) -> None:
    """A suspended worker's token is refused, so it sweeps only once resumed; one an
    operator holds suspended cannot be resumed by its owner."""
    rig = make_rig(alice, "rig")
    pay(rig, bob, 3 * UNITS_PER_CREDIT)
    client = web(alice)
    Worker.objects.filter(pk=rig.pk).update(state=Worker.State.SUSPENDED)
    text = retire_confirmation(client.get("/workers/").content.decode(), rig)
    assert "a retired worker can no longer sweep them: resume it, sweep them to your wallet first" in text
    Worker.objects.filter(pk=rig.pk).update(held_by_platform=True)
    text = retire_confirmation(client.get("/workers/").content.decode(), rig)
    assert "an operator holds it suspended, so they cannot be swept until the operator resumes it." in text
    assert "sweep them to your wallet first" not in text


def test_retiring_a_worker_with_nothing_to_sweep_says_only_that_it_is_final(alice: Any) -> None:
    empty = make_rig(alice, "empty")
    client = web(alice)
    for page in (client.get("/workers/"), client.get(f"/workers/{empty.pk}/")):
        assert retire_confirmation(page.content.decode(), empty) == (
            "Retire “empty”? Retiring is final: its token stops working and its key cannot be registered again."
        )


def test_a_balance_under_the_sweep_fee_is_named_but_not_worth_sweeping(alice: Any, bob: Any) -> None:
    dust = make_rig(alice, "dust")
    left = pay(dust, bob, sweep.sweep_fee() // 2)
    assert 0 < left <= sweep.sweep_fee()
    text = retire_confirmation(web(alice).get("/workers/").content.decode(), dust)
    assert f"Its address holds {format_credits(left)} credits, less than a sweep's fee: they stay there." in text
    assert "sweep them to your wallet first" not in text


# --- Registering: where the commands run ----------------------------------------------------


def shown_commands(client: Client) -> dict[str, str]:
    page = submit(client, "/workers/register", "/workers/register").content.decode()
    found = dict(re.findall(r'<code id="cmd-(init|register|run)">([^<]*)</code>', page))
    assert set(found) == {"init", "register", "run"}, page
    return {step: html.unescape(command) for step, command in found.items()} | {"page": page}


def test_the_register_page_says_where_and_with_which_python_to_run_its_commands(alice: Any) -> None:
    shown = shown_commands(web(alice))
    where = re.search(r'<p id="agent-where">(.*?)</p>', shown["page"], re.S)
    assert where is not None
    said = re.sub(r"<[^>]+>", "", html.unescape(where.group(1)))
    assert "in a virtualenv with pip install '.[node]' from a checkout of this repository" in said
    assert "as the Dockerfile.node image (docs/provider-node.md" in said
    assert "with that install's Python (here the checkout's .venv)" in said
    for step in ("init", "register", "run"):
        assert shown[step].startswith(f".venv/bin/python -m workers.agent {step}"), shown[step]


def test_the_shown_commands_run_as_shown_from_the_repository_root(alice: Any) -> None:
    """Each command's program, module and arguments parse from the root (``--help`` stops
    before anything is written or sent). A node installed alone runs them from any folder:
    tests/workers/test_node_install.py."""
    if not (ROOT / ".venv" / "bin" / "python").exists():
        pytest.skip("no .venv in this checkout (make install creates it)")
    shown = shown_commands(web(alice))
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    for step in ("init", "register", "run"):
        argv = [*shlex.split(shown[step]), "--help"]
        done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (shown[step], done.stderr)
        assert f"workers.agent {step}" in done.stdout


# --- Heartbeats -----------------------------------------------------------------------------


def test_a_heartbeat_under_a_minute_old_is_just_now(alice: Any) -> None:
    make_rig(alice, "fresh")  # heartbeat: now
    quiet = make_rig(alice, "quiet")
    Worker.objects.filter(pk=quiet.pk).update(last_heartbeat_at=timezone.now() - timedelta(minutes=5, seconds=3))
    body = re.sub(r"<[^>]+>", " ", web(alice).get("/workers/").content.decode())
    body = re.sub(r"\s+", " ", body)
    assert "heartbeat just now" in body
    assert "last heartbeat 5 min ago" in body
    assert "0 minutes" not in body
