"""Browser pages through Django's test client: who sees what, and what each form does.

Personas: alice owns things, bob is another signed-in user, anonymous has no session.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from ledger import services as ledger
from ledger.units import UNITS_PER_CREDIT, format_credits
from marketplace.kinds import KINDS
from marketplace.models import ApiToken, Dataset, Task, TaskEvent, User, hash_token
from tests.factories import PASSWORD, npy_bytes, post_task
from tests.form_nonces import submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def no_synthetic_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make synthetic a kind no provider runs, as every kind is before its verifier lands."""
    monkeypatch.setitem(KINDS, "synthetic", dataclasses.replace(KINDS["synthetic"], verifier=None))


@pytest.fixture
def task(alice: Any) -> Task:
    return post_task(alice, spec={"n": 512}, title="Alice's matmul")


@pytest.fixture
def dataset(alice: Any) -> Dataset:
    from marketplace import services

    upload = SimpleUploadedFile("points.csv", b"x,y\n1,2\n3,4\n", content_type="text/csv")
    return services.upload_dataset(alice, upload, "points")


def synthetic_form(**overrides: str) -> dict[str, str]:
    data = {
        "title": "Matmul from the form",
        "spec_n": "2048",
        "spec_count": "2",
        "spec_entry_bound": "4",
        "budget": "1.5",
        "min_reputation": "10",
        "replication": "1",
        "max_attempts": "3",
    }
    data.update(overrides)
    return data


def default_form(kind: str, owner: Any, **overrides: str) -> dict[str, str]:
    """What the page's form submits untouched: every field at its initial value."""
    from marketplace.forms import TaskForm
    from marketplace.kinds import get_kind

    form = TaskForm(kind=get_kind(kind), owner=owner)
    data: dict[str, str] = {}
    for name, field in form.fields.items():
        initial = form.get_initial_for_field(field, name)
        if initial is True:
            data[name] = "on"
        elif initial is not None and initial is not False:
            data[name] = str(initial)
    data.update(overrides)
    return data


def text(response: Any) -> str:
    return response.content.decode()


def error_slot(html: str, field_id: str) -> str:
    """The text inside one field's error slot (the element htmx refreshes too)."""
    match = re.search(rf'id="{field_id}_error"[^>]*>(.*?)</div>', html, re.S)
    assert match, f"no error slot for {field_id}"
    return re.sub(r"<[^>]+>", " ", match.group(1)).strip()


# --- Who sees what -------------------------------------------------------------------


def test_public_pages_render_for_anonymous(client: Client, task: Task) -> None:
    home = client.get(reverse("home"))
    assert home.status_code == 200
    body = text(home)
    assert "Alice&#x27;s matmul" in body
    assert re.search(r'id="stat-open">1<', body)
    assert re.search(r'id="stat-users">1<', body)
    assert client.get(reverse("login")).status_code == 200
    assert client.get(reverse("signup")).status_code == 200


def test_home_counts_tasks_by_status(client: Client, alice: Any, bob: Any) -> None:
    from marketplace import services

    post_task(alice, title="open one")
    cancelled = post_task(alice, title="cancelled one")
    services.cancel_task(alice, cancelled.pk)
    body = text(client.get(reverse("home")))
    assert re.search(r'id="stat-open">1<', body)
    assert re.search(r'id="stat-completed">0<', body)
    assert re.search(r'id="stat-users">2<', body)
    assert "open one" in body
    assert "cancelled one" not in body  # the public listing shows open tasks only


PRIVATE_PAGES = [
    ("my-tasks", {}),
    ("task-new", {}),
    ("task-post", {"kind": "synthetic"}),
    ("account", {}),
    ("password_change", {}),
    ("datasets", {}),
]


@pytest.mark.parametrize(("name", "kwargs"), PRIVATE_PAGES)
def test_private_pages_redirect_anonymous_to_login(client: Client, name: str, kwargs: dict[str, str]) -> None:
    url = reverse(name, kwargs=kwargs)
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"] == f"{reverse('login')}?next={url}"


def test_private_object_pages_redirect_anonymous(client: Client, task: Task, dataset: Dataset) -> None:
    for url in (reverse("task-detail", args=[task.pk]), reverse("dataset-detail", args=[dataset.pk])):
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("login"))
    response = client.post(reverse("task-cancel", args=[task.pk]))
    assert response.status_code == 302
    task.refresh_from_db()
    assert task.status == Task.Status.OPEN


@pytest.mark.parametrize(("name", "kwargs"), PRIVATE_PAGES)
def test_private_pages_render_for_owner(alice_web: Client, name: str, kwargs: dict[str, str]) -> None:
    response = alice_web.get(reverse(name, kwargs=kwargs))
    assert response.status_code == 200
    assert "alice" in text(response)  # the header shows who is signed in


@pytest.mark.parametrize("kind", ["synthetic", "cube_training", "cube_inference", "asl_training", "asl_inference"])
def test_every_kind_has_a_form_built_from_its_spec(alice_web: Client, kind: str) -> None:
    from marketplace.kinds import get_kind

    body = text(alice_web.get(reverse("task-post", args=[kind])))
    for name, field in get_kind(kind).spec_serializer().fields.items():
        # Protocol details ({"form": False}) stay out of the form and take their default.
        assert (f'name="spec_{name}"' in body) == field.style.get("form", True)


def test_form_field_types_bounds_and_defaults_come_from_the_serializer(alice_web: Client) -> None:
    body = text(alice_web.get(reverse("task-post", args=["cube_training"])))
    n_input = re.search(r'<input[^>]*name="spec_lattice_edge"[^>]*>', body)
    assert n_input
    assert 'type="number"' in n_input.group(0)
    assert 'min="2"' in n_input.group(0)
    assert 'max="64"' in n_input.group(0)
    assert 'value="8"' in n_input.group(0)
    assert "Lattice edge S: the lattice is S×S×S cells." in body
    assert re.search(r'<select[^>]*name="spec_mode"', body)
    assert re.search(r'<input[^>]*type="checkbox"[^>]*name="spec_mixed_precision"[^>]*checked', body)
    lr = re.search(r'<input[^>]*name="spec_learning_rate"[^>]*>', body)
    assert lr
    assert 'step="any"' in lr.group(0)


def test_unknown_kind_is_404(alice_web: Client) -> None:
    assert alice_web.get(reverse("task-post", args=["bitcoin"])).status_code == 404


def test_another_users_task_and_dataset_are_404(bob_web: Client, task: Task, dataset: Dataset) -> None:
    assert bob_web.get(reverse("task-detail", args=[task.pk])).status_code == 404
    assert bob_web.post(reverse("task-cancel", args=[task.pk])).status_code == 404
    assert bob_web.post(reverse("task-publish", args=[task.pk])).status_code == 404
    assert bob_web.get(reverse("dataset-detail", args=[dataset.pk])).status_code == 404
    assert bob_web.post(reverse("dataset-delete", args=[dataset.pk])).status_code == 404
    task.refresh_from_db()
    assert task.status == Task.Status.OPEN
    assert Dataset.objects.filter(pk=dataset.pk).exists()
    assert "Alice&#x27;s matmul" not in text(bob_web.get(reverse("my-tasks")))


def test_owner_sees_task_detail(alice_web: Client, no_synthetic_runner: None, task: Task) -> None:
    response = alice_web.get(reverse("task-detail", args=[task.pk]))
    assert response.status_code == 200
    body = text(response)
    assert 'id="task-status"' in body
    assert ">Open<" in body
    assert "No provider runs Synthetic proof of compute tasks yet" in body
    assert "<progress" in body
    assert "Task opened for workers" in body  # the timeline
    assert f"/ws/tasks/{task.pk}/" in body
    assert "Cancel task" in body


# --- Accounts ------------------------------------------------------------------------


def test_signup_creates_a_user_and_logs_in(client: Client, settings: Any) -> None:
    response = client.post(
        reverse("signup"),
        {"username": "carol", "email": "carol@example.com", "password1": PASSWORD, "password2": PASSWORD},
    )
    assert response.status_code == 302
    assert response["Location"] == reverse("my-tasks")
    user = User.objects.get(username="carol")
    assert user.check_password(PASSWORD)
    page = client.get(reverse("my-tasks"))
    assert page.status_code == 200
    assert "carol" in text(page)
    # The new user has a ledger account, holding the development signup grant.
    account = text(client.get(reverse("account")))
    expected = format_credits(settings.SIGNUP_GRANT_UNITS)
    assert f'<dd id="balance">{expected}</dd>' in account


def test_signup_with_mismatched_passwords_shows_the_error(client: Client) -> None:
    response = client.post(reverse("signup"), {"username": "carol", "password1": PASSWORD, "password2": "other"})
    assert response.status_code == 400
    assert "The two password fields didn’t match." in error_slot(text(response), "id_password2")
    assert not User.objects.filter(username="carol").exists()


def test_login_and_logout(client: Client, alice: Any) -> None:
    response = client.post(reverse("login"), {"username": "alice", "password": PASSWORD})
    assert response.status_code == 302
    assert client.get(reverse("account")).status_code == 200
    assert client.get(reverse("logout")).status_code == 405  # logging out is a POST
    assert client.post(reverse("logout")).status_code == 302
    assert client.get(reverse("account")).status_code == 302


def test_password_change(alice_web: Client, alice: Any) -> None:
    response = alice_web.post(
        reverse("password_change"),
        {"old_password": PASSWORD, "new_password1": "a-new-long-passphrase", "new_password2": "a-new-long-passphrase"},
    )
    assert response.status_code == 302
    assert response["Location"] == reverse("password_change_done")
    assert alice_web.get(reverse("password_change_done")).status_code == 200
    alice.refresh_from_db()
    assert alice.check_password("a-new-long-passphrase")


def test_token_is_shown_once_and_stored_hashed(alice_web: Client, alice: Any) -> None:
    response = submit(alice_web, reverse("account"), reverse("token-create"), {"name": "laptop CLI"})
    assert response.status_code == 200
    body = text(response)
    raw = re.search(r'<code id="new-token">(pw_[^<]+)</code>', body)
    assert raw, "the raw token is on the page"
    assert "shown only this once" in body
    token = ApiToken.objects.get(user=alice)
    assert token.name == "laptop CLI"
    assert token.token_hash == hash_token(raw.group(1))
    assert raw.group(1) not in (token.prefix, token.token_hash, token.name)
    # The token is real: the API accepts it.
    api = Client().get("/api/v1/me/", HTTP_AUTHORIZATION=f"Token {raw.group(1)}")
    assert api.status_code == 200
    # And never shown again.
    again = text(alice_web.get(reverse("account")))
    assert raw.group(1) not in again
    assert "laptop CLI" in again
    assert token.prefix in again


def test_token_without_a_name_shows_the_error(alice_web: Client, alice: Any) -> None:
    response = submit(alice_web, reverse("account"), reverse("token-create"), {"name": "   "})
    assert response.status_code == 400
    assert error_slot(text(response), "id_name")
    assert not ApiToken.objects.filter(user=alice).exists()


def test_revoke_token(alice_web: Client, alice: Any) -> None:
    from marketplace import services

    token, raw = services.create_api_token(alice, "old")
    response = alice_web.post(reverse("token-revoke", args=[token.pk]))
    assert response.status_code == 302
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert Client().get("/api/v1/me/", HTTP_AUTHORIZATION=f"Token {raw}").status_code == 401
    page = text(alice_web.get(reverse("account")))
    assert "revoked" in page
    assert token.prefix not in page


def test_cannot_revoke_another_users_token(bob_web: Client, alice: Any) -> None:
    from marketplace import services

    token, _ = services.create_api_token(alice, "alice's")
    assert bob_web.post(reverse("token-revoke", args=[token.pk])).status_code == 404
    token.refresh_from_db()
    assert token.revoked_at is None


# --- Posting a task ------------------------------------------------------------------


def test_post_task_form_creates_the_task(alice_web: Client, alice: Any, no_synthetic_runner: None) -> None:
    response = alice_web.post(reverse("task-post", args=["synthetic"]), synthetic_form())
    task = Task.objects.get(owner=alice)
    assert response.status_code == 302
    assert response["Location"] == reverse("task-detail", args=[task.pk])
    assert task.title == "Matmul from the form"
    assert task.spec == {"n": 2048, "count": 2, "entry_bound": 4, "generator": "aes256ctr"}
    assert task.budget == 1_500_000_000
    assert task.min_reputation == 10
    assert task.status == Task.Status.OPEN
    detail = text(alice_web.get(response["Location"]))
    assert "Task posted." in detail
    assert "No provider runs" in detail


def test_bad_form_value_shows_the_inline_error_and_creates_nothing(alice_web: Client) -> None:
    response = alice_web.post(reverse("task-post", args=["synthetic"]), synthetic_form(spec_n="99999"))
    assert response.status_code == 400
    body = text(response)
    assert "less than or equal to 16384" in error_slot(body, "id_spec_n")
    assert error_slot(body, "id_budget") == ""
    assert 'aria-invalid="true"' in re.search(r'<input[^>]*name="spec_n"[^>]*>', body).group(0)  # type: ignore[union-attr]
    assert not Task.objects.exists()


@pytest.mark.parametrize("value", ["nan", "inf", "abc", "1.5"])
def test_malformed_numbers_are_refused_inline(alice_web: Client, value: str) -> None:
    response = alice_web.post(reverse("task-post", args=["synthetic"]), synthetic_form(spec_count=value))
    assert response.status_code == 400
    assert error_slot(text(response), "id_spec_count")
    assert not Task.objects.exists()


def test_service_errors_land_on_the_right_field(alice_web: Client, alice: Any) -> None:
    # The budget check lives in the service: it names "budget", the form shows it there.
    response = alice_web.post(reverse("task-post", args=["synthetic"]), synthetic_form(budget="0.001"))
    assert response.status_code == 400
    floor = format_credits(KINDS["synthetic"].estimate_price(KINDS["synthetic"].validate_spec({})))
    assert f"The least a job may cost is {floor} credits" in error_slot(text(response), "id_budget")
    # So does the dataset rule of a kind that needs one.
    response = alice_web.post(
        reverse("task-post", args=["asl_training"]), default_form("asl_training", alice, budget="100000")
    )
    assert response.status_code == 400
    assert "needs a dataset" in error_slot(text(response), "id_dataset")
    assert not Task.objects.exists()


def test_runnable_kind_shows_no_stays_open_reason(alice_web: Client, alice: Any) -> None:
    from marketplace.kinds import KINDS

    if not KINDS["synthetic"].available:
        pytest.skip("synthetic has no runner in this checkout")
    task = post_task(alice, title="runs soon")
    body = text(alice_web.get(reverse("task-detail", args=[task.pk])))
    assert ">Open<" in body
    assert "No provider runs" not in body
    assert re.search(r'<p id="task-reason"[^>]*hidden', body)


def test_budget_beyond_the_balance_is_refused_inline(alice_web: Client, alice: Any) -> None:
    from ledger import services as ledger

    body = text(alice_web.get(reverse("task-post", args=["synthetic"])))
    assert re.search(r'id="balance">1000<', body)  # the persona's test funds
    response = alice_web.post(reverse("task-post", args=["synthetic"]), synthetic_form(budget="1000.5"))
    assert response.status_code == 400
    assert "Your available balance is 1000 credits" in error_slot(text(response), "id_budget")
    assert not Task.objects.exists()
    assert ledger.balance(alice) == 1000 * UNITS_PER_CREDIT


def test_dataset_select_offers_only_own_datasets_of_the_kinds_formats(
    alice_web: Client, alice: Any, bob: Any, dataset: Dataset
) -> None:
    from marketplace import services

    npy = b"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }" + b" " * 40 + b"\n\0\0\0\0"
    mine = services.upload_dataset(alice, SimpleUploadedFile("e.npy", npy), "embeddings")
    theirs = services.upload_dataset(bob, SimpleUploadedFile("b.npy", npy), "bob's embeddings")
    body = text(alice_web.get(reverse("task-post", args=["cube_training"])))
    assert f'value="{mine.pk}"' in body
    assert f'value="{dataset.pk}"' not in body  # csv does not fit cube training
    assert f'value="{theirs.pk}"' not in body


def test_check_endpoint_returns_errors_and_estimate(alice_web: Client, settings: Any) -> None:
    settings.ARTIFACT_MAX_BYTES = 2**40  # a platform that takes 64 products of 16384²
    url = reverse("task-check", args=["synthetic"])
    bad = text(alice_web.post(url, synthetic_form(spec_n="99999"), HTTP_HX_REQUEST="true"))
    assert re.search(r'id="id_spec_n_error" hx-swap-oob="innerHTML"><p>[^<]*16384', bad)
    assert "Fix the fields marked in red" in bad
    good = text(alice_web.post(url, synthetic_form(spec_n="16384", spec_count="64"), HTTP_HX_REQUEST="true"))
    # 2·16384³·64 FLOP: the reference ask (10⁶ units/TFLOP less the fee) plus the fee.
    assert '<strong id="estimate-price">0.562949982</strong>' in good
    assert re.search(r'id="id_spec_n_error" hx-swap-oob="innerHTML"></div>', good)
    assert not Task.objects.exists()


def test_the_estimate_says_whether_an_online_worker_can_take_the_task(alice_web: Client, alice: Any, bob: Any) -> None:
    """Before the budget is held: how many online workers fit, or why none does."""
    from tests.factories import CAPS, make_worker

    url = reverse("task-check", args=["synthetic"])
    none = text(alice_web.post(url, synthetic_form(), HTTP_HX_REQUEST="true"))
    assert "No worker can take this task now: no worker is online. It needs a worker that offers Synthetic" in none
    assert "A task you post waits, its budget in escrow, until one does" in none
    make_worker(bob, name="old-agent", caps={**CAPS, "features": ["poc:shake128"]})
    old = text(alice_web.post(url, synthetic_form(), HTTP_HX_REQUEST="true"))
    assert "No worker can take this task now: of the 1 online, 1 runs an agent without poc:aes256ctr." in old
    make_worker(bob, name="current", reputation=70)
    fits = text(alice_web.post(url, synthetic_form(), HTTP_HX_REQUEST="true"))
    assert "Online now: 1 of 2 workers fits, 1 free." in fits
    assert "No worker can take" not in fits
    assert "replicas must go to" not in fits
    # Two replicas need two providers' workers: bob alone falls short, and the page says so.
    pair = text(alice_web.post(url, synthetic_form(replication="2"), HTTP_HX_REQUEST="true"))
    assert "Online now: 1 of 2 workers fits, 1 free." in pair
    assert "Only 1 provider has fitting workers online, and its 2 replicas must go to 2 different providers." in pair
    # The form's minimum reputation counts too.
    picky = text(alice_web.post(url, synthetic_form(min_reputation="80"), HTTP_HX_REQUEST="true"))
    assert "1 has reputation below 80" in picky
    # The full page shows the same on first paint.
    assert "Online now: 1 of 2 workers fits, 1 free." in text(alice_web.get(reverse("task-post", args=["synthetic"])))


def test_draft_then_publish(alice_web: Client, alice: Any) -> None:
    alice_web.post(reverse("task-post", args=["synthetic"]), synthetic_form(draft="on"))
    task = Task.objects.get(owner=alice)
    assert task.status == Task.Status.DRAFT
    assert "Publish" in text(alice_web.get(reverse("task-detail", args=[task.pk])))
    response = alice_web.post(reverse("task-publish", args=[task.pk]), follow=True)
    assert "Task published" in text(response)
    task.refresh_from_db()
    assert task.status == Task.Status.OPEN


def test_publishing_a_draft_the_balance_no_longer_covers_says_why(alice_web: Client, alice: Any) -> None:
    # A draft holds no escrow, so its budget may exceed what the balance covers by then.
    over = format_credits(ledger.balance(alice) + UNITS_PER_CREDIT)
    alice_web.post(reverse("task-post", args=["synthetic"]), synthetic_form(draft="on", budget=over))
    task = Task.objects.get(owner=alice)
    before = ledger.balance(alice)
    response = alice_web.post(reverse("task-publish", args=[task.pk]), follow=True)
    assert response.status_code == 200
    assert "does not cover this budget" in text(response)
    task.refresh_from_db()
    assert task.status == Task.Status.DRAFT
    assert ledger.balance(alice) == before


# --- Cancelling -----------------------------------------------------------------------


def test_cancel_from_the_page(alice_web: Client, task: Task) -> None:
    response = alice_web.post(reverse("task-cancel", args=[task.pk]), follow=True)
    assert response.status_code == 200
    body = text(response)
    assert "Task cancelled." in body
    assert ">Cancelled<" in body
    assert "Cancel task" not in body
    task.refresh_from_db()
    assert task.status == Task.Status.CANCELLED
    assert TaskEvent.objects.filter(task=task, status=Task.Status.CANCELLED).count() == 1


def test_illegal_cancel_shows_a_message(alice_web: Client, task: Task) -> None:
    alice_web.post(reverse("task-cancel", args=[task.pk]))
    response = alice_web.post(reverse("task-cancel", args=[task.pk]), follow=True)
    assert response.status_code == 200
    assert "A task that is cancelled cannot become cancelled." in text(response)
    assert TaskEvent.objects.filter(task=task, status=Task.Status.CANCELLED).count() == 1


def test_posts_need_a_csrf_token(alice: Any, task: Task) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    assert client.post(reverse("task-cancel", args=[task.pk])).status_code == 403
    assert client.post(reverse("token-create"), {"name": "x"}).status_code == 403
    task.refresh_from_db()
    assert task.status == Task.Status.OPEN


# --- My tasks ------------------------------------------------------------------------


def test_my_tasks_filters_by_status_and_paginates(alice_web: Client, alice: Any) -> None:
    from marketplace import services

    for i in range(21):
        post_task(alice, title=f"task {i:02d}")
    services.cancel_task(alice, Task.objects.get(title="task 03").pk)
    first = text(alice_web.get(reverse("my-tasks")))
    assert "task 20" in first
    assert "task 00" not in first  # newest first, 20 per page
    assert "Page 1 of 2" in first
    second = text(alice_web.get(reverse("my-tasks"), {"page": 2}))
    assert "task 00" in second
    cancelled = text(alice_web.get(reverse("my-tasks"), {"status": "cancelled"}))
    assert "task 03" in cancelled
    assert "task 04" not in cancelled
    bogus = alice_web.get(reverse("my-tasks"), {"status": "nonsense", "page": "x"})
    assert bogus.status_code == 200


def test_my_tasks_query_count_does_not_grow(alice_web: Client, alice: Any, django_assert_max_num_queries: Any) -> None:
    for i in range(5):
        post_task(alice, title=f"task {i}")
    with django_assert_max_num_queries(6):
        alice_web.get(reverse("my-tasks"))


# --- Datasets ------------------------------------------------------------------------


def test_upload_list_and_delete_dataset(alice_web: Client, alice: Any, settings: Any) -> None:
    settings.DATASET_MAX_BYTES = 1024 * 1024
    upload = SimpleUploadedFile("table.csv", b"a,b\n1,2\n", content_type="text/csv")
    response = alice_web.post(reverse("datasets"), {"file": upload, "name": ""})
    assert response.status_code == 302
    dataset = Dataset.objects.get(owner=alice)
    assert dataset.format == "csv"
    page = text(alice_web.get(reverse("datasets")))
    assert "table.csv" in page
    assert dataset.sha256[:14] in page
    assert "Size limit: <strong>1.0\xa0MB</strong>" in page
    detail = text(alice_web.get(reverse("dataset-detail", args=[dataset.pk])))
    assert dataset.sha256 in detail
    response = alice_web.post(reverse("dataset-delete", args=[dataset.pk]), follow=True)
    assert "Dataset deleted." in text(response)
    assert not Dataset.objects.exists()


def test_the_upload_form_sends_parts_with_javascript(alice_web: Client, settings: Any) -> None:
    settings.DATASET_UPLOAD_PART_BYTES = 65536
    page = text(alice_web.get(reverse("datasets")))
    assert 'src="/static/js/datasets.js"' in page
    assert 'data-api="/api/v1/dataset-uploads/"' in page
    assert 'data-part-bytes="65536"' in page
    # Elsewhere the script is not loaded.
    assert "datasets.js" not in text(alice_web.get(reverse("my-tasks")))


def test_landing_after_an_upload_in_parts_says_it_once(alice_web: Client, bob_web: Client, dataset: Dataset) -> None:
    landed = alice_web.get(reverse("datasets"), {"uploaded": str(dataset.pk)})
    assert landed.status_code == 302
    assert landed["Location"] == reverse("datasets")
    assert "Uploaded “points” (CSV)." in text(alice_web.get(landed["Location"]))
    assert "Uploaded “points”" not in text(alice_web.get(reverse("datasets")))
    # Another user's dataset, or no dataset at all, is just the page.
    for raw in (str(dataset.pk), "not-a-uuid"):
        response = bob_web.get(reverse("datasets"), {"uploaded": raw})
        assert response.status_code == 200
        assert "Uploaded" not in text(response)


def test_empty_upload_shows_the_error(alice_web: Client) -> None:
    response = alice_web.post(reverse("datasets"), {"file": SimpleUploadedFile("empty.csv", b"")})
    assert response.status_code == 400
    assert "The file is empty." in error_slot(text(response), "id_file")
    assert not Dataset.objects.exists()


def test_oversized_upload_shows_the_limit(alice_web: Client, settings: Any) -> None:
    settings.DATASET_MAX_BYTES = 4
    response = alice_web.post(reverse("datasets"), {"file": SimpleUploadedFile("big.csv", b"a,b\n1,2\n")})
    assert response.status_code == 400
    assert "the limit is 4 bytes" in error_slot(text(response), "id_file")
    assert not Dataset.objects.exists()


def test_dataset_in_use_cannot_be_deleted(alice_web: Client, alice: Any) -> None:
    from marketplace import services

    dataset = services.upload_dataset(alice, SimpleUploadedFile("e.npy", npy_bytes()), "embeddings")
    post_task(alice, kind="cube_training", dataset=dataset.pk, budget=5 * UNITS_PER_CREDIT)
    response = alice_web.post(reverse("dataset-delete", args=[dataset.pk]), follow=True)
    assert "In use by 1 task(s)" in text(response)
    assert Dataset.objects.filter(pk=dataset.pk).exists()
