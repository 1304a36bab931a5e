"""Issue 26's pages attacked: a dishonest requester, a curious signed-out visitor and a staff
member with less than every right try the result ZIP, the compare page, re-running, the
admin's confirmations, the operations dashboard and the post form. Each test is one attack
that must not get through."""

from __future__ import annotations

import io
import re
import zipfile
from collections.abc import Iterator
from typing import IO, Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.test import Client

from config import downloads
from ledger import services as ledger
from ledger.models import Transaction
from ledger.units import UNITS_PER_CREDIT
from marketplace.models import Task, TaskStatus
from payments.models import PayoutRequest, PayoutStatus
from tests.factories import UserFactory, make_dataset, post_task
from tests.runs import completed_cube
from tests.workers.test_pages import login, text

pytestmark = pytest.mark.django_db

HOSTILE = '"><script>alert(1)</script><img src=x onerror=alert(2)>'


def staff(username: str = "root", **perms: Any) -> Client:
    user: Any = UserFactory(username=username, is_staff=True, is_superuser=perms.pop("superuser", True))
    client = Client()
    client.force_login(user)
    return client


# --- /tasks/<id>/results.zip ---------------------------------------------------------------


@pytest.mark.parametrize("status", [TaskStatus.DRAFT, TaskStatus.CANCELLED, TaskStatus.FAILED, TaskStatus.OPEN])
def test_the_zip_of_a_task_that_is_not_completed_is_not_found(alice: Any, status: str) -> None:
    """Its accepted result's files stay on disk, but only a completed task serves them."""
    task = completed_cube(alice)
    Task.objects.filter(pk=task.pk).update(status=status)
    response = login("alice").get(f"/tasks/{task.pk}/results.zip")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")


def test_the_zip_holds_only_the_kinds_declared_files_under_their_own_names(alice: Any) -> None:
    """A file a node left beside its artifacts (a name climbing out of the folder, too) is
    not in the archive: names come from the kind, never from storage."""
    from django.core.files.base import ContentFile
    from django.core.files.storage import default_storage

    from marketplace.kinds import KINDS
    from workers.assignments.jobs import artifact_path
    from workers.models import Assignment

    task = completed_cube(alice)
    accepted = Assignment.objects.get(task=task, state=Assignment.State.ACCEPTED)
    default_storage.save(artifact_path(accepted, "stolen.bin"), ContentFile(b"secret"))
    response = login("alice").get(f"/tasks/{task.pk}/results.zip")
    archive = zipfile.ZipFile(io.BytesIO(response.getvalue()))
    assert archive.namelist() == list(KINDS["cube_training"].artifacts)
    assert all(".." not in name and not name.startswith("/") for name in archive.namelist())


def test_the_zips_file_name_is_the_task_id_whatever_its_title(alice: Any) -> None:
    task = completed_cube(alice, title='evil"; filename="x.exe')
    Task.objects.filter(pk=task.pk).update(title='a"\r\nSet-Cookie: pwned=1')
    response = login("alice").get(f"/tasks/{task.pk}/results.zip")
    assert response["Content-Disposition"] == f'attachment; filename="task-{task.pk}-results.zip"'
    assert not response.cookies.get("pwned")


def test_the_zip_streams_one_chunk_at_a_time_opening_each_file_when_its_turn_comes() -> None:
    """A large file is read in chunks, and the next file is not opened before the first is
    sent: the archive is never held whole, nor any file of it."""
    reads: list[int] = []
    opened: list[str] = []

    class Big(io.RawIOBase):
        def __init__(self, size: int) -> None:
            self.left = size

        def readable(self) -> bool:
            return True

        def read(self, n: int = -1) -> bytes:
            assert n != -1, "read whole"
            reads.append(n)
            take = min(n, self.left)
            self.left -= take
            return b"z" * take

    def member(name: str, size: int) -> tuple[str, Any]:
        def open_it() -> IO[bytes]:
            opened.append(name)
            return Big(size)  # type: ignore[return-value]

        return name, open_it

    size = 3 * downloads.CHUNK_BYTES + 5
    response = downloads.zip_download(None, [member("a.bin", size), member("b.bin", 10)], "x.zip")
    assert response.streaming
    stream: Iterator[bytes] = iter(response.streaming_content)  # type: ignore[arg-type]
    first = next(stream)
    assert opened == ["a.bin"]
    assert len(first) < 2 * downloads.CHUNK_BYTES
    body = first + b"".join(stream)
    assert opened == ["a.bin", "b.bin"]
    assert max(reads) <= downloads.CHUNK_BYTES
    archive = zipfile.ZipFile(io.BytesIO(body))
    assert archive.getinfo("a.bin").file_size == size


# --- /tasks/compare/ -----------------------------------------------------------------------


def test_another_users_task_in_either_slot_is_not_found(alice: Any, bob: Any) -> None:
    mine = completed_cube(alice, title="Mine")
    theirs = completed_cube(bob, title="Bobs secret run")
    client = login("alice")
    for query in (f"a={mine.pk}&b={theirs.pk}", f"a={theirs.pk}&b={mine.pk}", f"a={theirs.pk}&b={theirs.pk}"):
        response = client.get(f"/tasks/compare/?{query}")
        assert response.status_code == 404, query
        assert "Bobs secret run" not in response.content.decode()


def test_a_signed_out_visitor_is_sent_to_log_in(alice: Any) -> None:
    task = completed_cube(alice)
    for url in (
        f"/tasks/compare/?a={task.pk}&b={task.pk}",
        f"/tasks/{task.pk}/results.zip",
        f"/tasks/new/cube_training/?from={task.pk}",
    ):
        response = Client().get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith("/accounts/login/"), url


@pytest.mark.parametrize(
    "query",
    [
        "a=x&b=y",
        "a[]=1",
        "a=%00&b=%00",
        "a=" + "f" * 5000,
        "a={pk}&b={pk}%0D%0A",
        "a={pk}&b=" + "%F0%9F%92%A9",
        "a={pk}&b=-1",
    ],
)
def test_malformed_ids_are_a_400_naming_the_slot_never_a_500(alice: Any, query: str) -> None:
    task = completed_cube(alice)
    response = login("alice").get("/tasks/compare/?" + query.format(pk=task.pk))
    assert response.status_code in (400, 200)
    if response.status_code == 400:
        assert re.search(r"\b[ab] : ", text(response))


def test_the_same_run_twice_compares_with_nothing_marked_different(alice: Any) -> None:
    task = completed_cube(alice)
    response = login("alice").get(f"/tasks/compare/?a={task.pk}&b={task.pk}")
    assert response.status_code == 200


def test_hostile_titles_and_values_on_the_compare_page_are_escaped(alice: Any) -> None:
    a = completed_cube(alice, title=HOSTILE)
    b = completed_cube(alice, title="plain")
    # A metric reported under a hostile name, and a spec key no kind has (a stored row of old).
    Task.objects.filter(pk=b.pk).update(
        result_summary={"result_hash": "ab" * 32, HOSTILE: HOSTILE}, spec={**b.spec, HOSTILE: HOSTILE}
    )
    html = login("alice").get(f"/tasks/compare/?a={a.pk}&b={b.pk}").content.decode()
    assert "<script>alert(1)</script>" not in html
    assert "<img src=x" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


# --- Re-run: /tasks/new/<kind>/?from=<id> ------------------------------------------------------


def test_rerun_does_not_prefill_another_users_dataset_or_source_task(alice: Any, bob: Any) -> None:
    """alice's task names bob's dataset and bob's trained model (a row written around the
    services): her re-run form offers neither, names neither, and posting it is refused."""
    bobs_data = make_dataset(bob, name="Bobs private signs")
    bobs_model = completed_cube(bob, title="Bobs private model")
    own = {"source_task": str(completed_cube(alice).pk)}
    mine = post_task(alice, "cube_inference", own, budget=UNITS_PER_CREDIT, dataset=make_dataset(alice).pk)
    Task.objects.filter(pk=mine.pk).update(spec={**mine.spec, "source_task": str(bobs_model.pk)}, dataset=bobs_data)
    client = login("alice")
    response = client.get(f"/tasks/new/cube_inference/?from={mine.pk}")
    assert response.status_code == 200
    html = response.content.decode()
    assert "Bobs private model" not in html
    assert "Bobs private signs" not in html
    assert not re.search(rf'<option value="{bobs_model.pk}"[^>]*selected', html)
    assert not re.search(rf'<option value="{bobs_data.pk}"[^>]*selected', html)
    # Submitting bob's ids by hand is refused on the fields.
    posted = client.post(
        "/tasks/new/cube_inference/",
        {"title": "t", "spec_source_task": str(bobs_model.pk), "dataset": str(bobs_data.pk), "budget": "1"},
    )
    assert posted.status_code == 400
    assert Task.objects.filter(owner=alice, kind="cube_inference").count() == 1


def test_rerun_of_a_stale_spec_opens_the_form_and_refuses_it_on_submit(alice: Any) -> None:
    """A spec that no longer validates (a bound tightened since) fills the form; the page
    answers 200 with no estimate rather than a 500."""
    task = post_task(alice, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT, title=HOSTILE)
    Task.objects.filter(pk=task.pk).update(spec={"n": -5, "count": "lots", "gone_field": {"x": [1]}})
    response = login("alice").get(f"/tasks/new/synthetic/?from={task.pk}")
    assert response.status_code == 200
    html = response.content.decode()
    assert "<script>alert(1)</script>" not in html
    assert 'value="&quot;&gt;&lt;script&gt;' in html


# --- Admin: confirm with a reason ------------------------------------------------------------


def cancel_post(task: Any, **extra: str) -> dict[str, Any]:
    return {"action": "cancel", "_selected_action": [str(task.pk)], **extra}


def test_a_hostile_reason_is_escaped_where_the_requester_reads_it(bob: Any) -> None:
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    staff().post("/admin/marketplace/task/", cancel_post(task, confirm="yes", reason=HOSTILE[:200]))
    task.refresh_from_db()
    assert task.status == TaskStatus.CANCELLED
    requester = Client()
    requester.force_login(bob)
    html = requester.get(f"/tasks/{task.pk}/").content.decode()
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    # The admin's history shows it escaped as well.
    history = staff("root2").get(f"/admin/marketplace/task/{task.pk}/history/").content.decode()
    assert "<script>alert(1)</script>" not in history


def test_a_reason_with_a_nul_or_over_200_characters_is_refused(bob: Any) -> None:
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    operator = staff()
    for reason in ("null \x00 byte", "é" * 201):
        response = operator.post("/admin/marketplace/task/", cancel_post(task, confirm="yes", reason=reason))
        assert response.status_code == 400
    assert Task.objects.get(pk=task.pk).status == TaskStatus.OPEN
    assert not LogEntry.objects.exists()


def test_staff_who_may_only_view_cannot_run_an_action_by_a_forged_post(bob: Any) -> None:
    viewer: Any = UserFactory(username="support", is_staff=True)
    viewer.user_permissions.add(*Permission.objects.filter(codename__startswith="view_"))
    client = Client()
    client.force_login(viewer)
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    client.post("/admin/marketplace/task/", cancel_post(task, confirm="yes", reason="Because."))
    payout = PayoutRequest.objects.create(
        user=bob, units=5 * UNITS_PER_CREDIT, amount=500, currency="usd", destination="acct_x"
    )
    client.post(
        "/admin/payments/payoutrequest/",
        {"action": "approve", "_selected_action": [str(payout.pk)], "confirm": "yes", "reason": "ok"},
    )
    assert Task.objects.get(pk=task.pk).status == TaskStatus.OPEN
    assert PayoutRequest.objects.get(pk=payout.pk).status == PayoutStatus.REQUESTED
    assert not LogEntry.objects.exists()


def test_a_replayed_confirmation_approves_a_payout_once(bob: Any) -> None:
    payout = PayoutRequest.objects.create(
        user=bob, units=5 * UNITS_PER_CREDIT, amount=500, currency="usd", destination="acct_x"
    )
    before = ledger.balance(bob)
    operator = staff()
    form = {"action": "approve", "_selected_action": [str(payout.pk)], "confirm": "yes", "reason": "Checked."}
    operator.post("/admin/payments/payoutrequest/", form)
    second = operator.post("/admin/payments/payoutrequest/", form, follow=True)
    assert "not requested" in second.content.decode()
    assert Transaction.objects.filter(type="PAYOUT").count() == 1
    spent = before - ledger.balance(bob)
    assert 5 * UNITS_PER_CREDIT <= spent < 6 * UNITS_PER_CREDIT  # the amount and its gas, once
    assert LogEntry.objects.filter(object_id=str(payout.pk)).count() == 1


def test_a_replayed_cancel_refunds_once(bob: Any) -> None:
    before = ledger.balance(bob)
    task = post_task(bob, "synthetic", {"n": 64}, budget=UNITS_PER_CREDIT)
    operator = staff()
    for _ in range(2):
        operator.post("/admin/marketplace/task/", cancel_post(task, confirm="yes", reason="Spam."))
    assert ledger.balance(bob) == before
    assert Transaction.objects.filter(type="REFUND").count() <= 1
    assert LogEntry.objects.filter(object_id=str(task.pk)).count() == 1


# --- /admin/operations/ -----------------------------------------------------------------------


def test_the_operations_dashboard_is_closed_to_everyone_but_staff(alice: Any) -> None:
    for client in (Client(), login("alice")):
        response = client.get("/admin/operations/")
        assert response.status_code == 302
        assert response["Location"].startswith("/admin/login/")
    # A superuser flag without staff does not open it either.
    alice.is_superuser = True
    alice.save(update_fields=["is_superuser"])
    assert login("alice").get("/admin/operations/").status_code == 302


# --- The post form echoes values escaped -----------------------------------------------------


def test_hostile_values_are_echoed_escaped_in_the_form_the_summary_and_the_live_check(alice: Any) -> None:
    client = login("alice")
    data = {"title": HOSTILE, "spec_n": HOSTILE, "budget": HOSTILE, "bid": HOSTILE, "replication": HOSTILE}
    for url in ("/tasks/new/synthetic/", "/tasks/new/synthetic/check/"):
        response = client.post(url, data)
        assert response.status_code in (200, 400), url
        html = response.content.decode()
        assert "<script>alert(1)</script>" not in html, url
        assert "<img src=x" not in html, url
