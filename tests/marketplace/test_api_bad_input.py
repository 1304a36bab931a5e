"""Every malformed task request gets a 4xx whose JSON names the field and the problem,
and writes nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from rest_framework.test import APIClient

from config.api.parsers import NUL_IN_FORM_FIELD
from marketplace import services
from marketplace.models import Dataset, Task, TaskEvent
from tests.factories import make_dataset, post_task

pytestmark = pytest.mark.django_db

TASKS = "/api/v1/tasks/"


@pytest.fixture
def unchanged(alice: Any) -> Iterator[None]:
    """Fail the test if the request wrote any task, event or dataset row."""
    before = (Task.objects.count(), TaskEvent.objects.count(), Dataset.objects.count())
    yield
    assert (Task.objects.count(), TaskEvent.objects.count(), Dataset.objects.count()) == before


def post_raw(client: APIClient, body: str) -> Any:
    return client.post(TASKS, body, content_type="application/json")


def errors_of(response: Any) -> Any:
    assert 400 <= response.status_code < 500, (response.status_code, response.content[:500])
    assert response["Content-Type"].startswith("application/json")
    return response.json()


GOOD = {"kind": "synthetic", "budget": "1"}

# (request body, path to the field that must be named, words the message must contain)
BAD_BODIES: list[tuple[dict[str, Any], list[str], str]] = [
    ({"kind": "quantum", "budget": "1"}, ["kind"], "not a valid choice"),
    ({"kind": 7, "budget": "1"}, ["kind"], "not a valid choice"),
    ({"budget": "1"}, ["kind"], "required"),
    ({"kind": "synthetic"}, ["budget"], "required"),
    ({**GOOD, "spec": {"n": "big"}}, ["spec", "n"], "valid integer"),
    ({**GOOD, "spec": {"n": True}}, ["spec", "n"], "valid integer"),
    ({**GOOD, "spec": {"n": 256.5}}, ["spec", "n"], "valid integer"),
    ({**GOOD, "spec": {"n": 8}}, ["spec", "n"], "greater than or equal to 64"),
    ({**GOOD, "spec": {"n": 10**30}}, ["spec", "n"], "less than or equal to 16384"),
    ({**GOOD, "spec": {"count": -1}}, ["spec", "count"], "greater than or equal to 1"),
    ({**GOOD, "spec": {"size": 3}}, ["spec", "size"], "Unknown field"),
    ({**GOOD, "spec": [1, 2]}, ["spec", "non_field_errors"], "JSON object"),
    ({**GOOD, "spec": "n=3"}, ["spec", "non_field_errors"], "JSON object"),
    ({**GOOD, "spec": None}, ["spec"], "null"),
    ({**GOOD, "colour": "red"}, ["colour"], "Unknown field"),
    ({**GOOD, "budget": "0.000000001"}, ["budget"], "least a job may cost"),
    ({**GOOD, "budget": "1.0000000001"}, ["budget"], "9 decimal places"),
    ({**GOOD, "budget": "-5"}, ["budget"], "at least 0.000000001"),
    ({**GOOD, "budget": "0"}, ["budget"], "at least"),
    ({**GOOD, "budget": "9000000001"}, ["budget"], "at most 9000000000"),
    ({**GOOD, "budget": "NaN"}, ["budget"], "valid number"),
    ({**GOOD, "budget": "Infinity"}, ["budget"], "valid number"),
    ({**GOOD, "budget": True}, ["budget"], "valid number"),
    ({**GOOD, "budget": "lots"}, ["budget"], "valid number"),
    ({**GOOD, "min_reputation": 101}, ["min_reputation"], "less than or equal to 100"),
    ({**GOOD, "min_reputation": 3.5}, ["min_reputation"], "valid integer"),
    ({**GOOD, "replication": 0}, ["replication"], "greater than or equal to 1"),
    ({**GOOD, "max_attempts": "three"}, ["max_attempts"], "valid integer"),
    ({**GOOD, "draft": "perhaps"}, ["draft"], "valid boolean"),
    ({**GOOD, "title": "x" * 201}, ["title"], "200 characters"),
    ({**GOOD, "title": "a\x00b"}, ["title"], "Null characters"),
    ({**GOOD, "dataset": "not-a-uuid"}, ["dataset"], "valid UUID"),
    ({**GOOD, "dataset": "00000000-0000-0000-0000-000000000000"}, ["dataset"], "No such dataset"),
    (
        {"kind": "cube_training", "budget": "100", "spec": {"learning_rate": "NaN"}},
        ["spec", "learning_rate"],
        "valid number",
    ),
    (
        {"kind": "cube_training", "budget": "100", "spec": {"grad_clip": "-Infinity"}},
        ["spec", "grad_clip"],
        "valid number",
    ),
    ({"kind": "cube_training", "budget": "100", "spec": {"weight_decay": 2.0}}, ["spec", "weight_decay"], "1.0"),
    ({"kind": "cube_training", "budget": "100", "spec": {"gate": "hard"}}, ["spec", "gate"], "valid choice"),
    ({"kind": "cube_training", "budget": "100", "spec": {"synthetic_samples": 0}}, ["dataset"], "needs a dataset"),
    ({"kind": "asl_training", "budget": "100"}, ["dataset"], "needs a dataset"),
    ({"kind": "asl_training", "budget": "100", "spec": {"dim": 100}}, ["spec", "dim"], "valid choice"),
    ({"kind": "asl_training", "budget": "100", "spec": {"dim": True}}, ["spec", "dim"], "valid choice"),
    ({"kind": "cube_inference", "budget": "100", "spec": {}}, ["spec", "source_task"], "required"),
]


@pytest.mark.parametrize(("body", "path", "words"), BAD_BODIES, ids=[" ".join(c[1]) for c in BAD_BODIES])
@pytest.mark.usefixtures("unchanged")
def test_bad_task_requests_name_the_field(
    alice_client: APIClient, body: dict[str, Any], path: list[str], words: str
) -> None:
    response = post_raw(alice_client, json.dumps(body))
    assert response.status_code == 400
    node = errors_of(response)
    for key in path:
        assert key in node, (path, response.json())
        node = node[key]
    assert any(words.lower() in str(message).lower() for message in node), (words, response.json())


RAW_BODIES = [
    '{"kind": "synthetic", "budget": NaN}',
    '{"kind": "synthetic", "budget": "1", "spec": {"n": Infinity}}',
    "NaN",
    '{"kind": "synthetic", ',
    "[" * 100_000,
    '"just a string"',
    "[]",
    "",
]


@pytest.mark.parametrize("body", RAW_BODIES, ids=range(len(RAW_BODIES)))
@pytest.mark.usefixtures("unchanged")
def test_malformed_json_is_a_400(alice_client: APIClient, body: str) -> None:
    response = post_raw(alice_client, body)
    assert response.status_code == 400
    assert errors_of(response)


@pytest.mark.usefixtures("unchanged")
def test_huge_float_overflowing_to_infinity_is_refused(alice_client: APIClient) -> None:
    # Python's json reads 1e400 as inf without complaint; the fields must still refuse it.
    response = post_raw(alice_client, '{"kind": "cube_training", "budget": "100", "spec": {"learning_rate": 1e400}}')
    assert response.status_code == 400
    assert errors_of(response) == {"spec": ["Value must be valid JSON."]}
    response = post_raw(alice_client, '{"kind": "synthetic", "budget": 1e400}')
    assert response.status_code == 400
    assert "budget" in errors_of(response)


def test_someone_elses_dataset_is_not_found(alice_client: APIClient, bob: Any) -> None:
    theirs = make_dataset(bob)
    body = {"kind": "cube_training", "budget": "100", "dataset": str(theirs.pk)}
    response = alice_client.post(TASKS, body, format="json")
    assert response.status_code == 400
    assert "No such dataset" in errors_of(response)["dataset"][0]
    assert Task.objects.count() == 0


def test_a_dataset_of_the_wrong_format_is_refused(alice: Any, alice_client: APIClient) -> None:
    text = make_dataset(alice, b"a,b\n1,2\n", "table.csv")
    body = {"kind": "asl_training", "budget": "100", "dataset": str(text.pk)}
    response = alice_client.post(TASKS, body, format="json")
    assert response.status_code == 400
    assert "format zip, not csv" in errors_of(response)["dataset"][0]
    assert Task.objects.count() == 0


def test_inference_needs_a_completed_training_task_of_ones_own(alice: Any, bob: Any, alice_client: APIClient) -> None:
    dataset = make_dataset(alice)
    mine = post_task(alice, kind="cube_training", budget=100 * 10**9)
    theirs = post_task(bob, kind="cube_training", budget=100 * 10**9)
    before = Task.objects.count()
    for source, words in ((theirs, "No cube_training task"), (mine, "has not completed")):
        body = {
            "kind": "cube_inference",
            "budget": "100",
            "dataset": str(dataset.pk),
            "spec": {"source_task": str(source.pk)},
        }
        response = alice_client.post(TASKS, body, format="json")
        assert response.status_code == 400
        assert words in errors_of(response)["spec"]["source_task"][0]
    assert Task.objects.count() == before


def test_cancelling_twice_is_a_409_naming_status(alice: Any, alice_client: APIClient) -> None:
    task = post_task(alice)
    assert alice_client.post(f"{TASKS}{task.pk}/cancel/").status_code == 200
    events = TaskEvent.objects.filter(task=task).count()
    response = alice_client.post(f"{TASKS}{task.pk}/cancel/")
    assert response.status_code == 409
    assert response.json()["status"] == ["A task that is cancelled cannot become cancelled."]
    assert TaskEvent.objects.filter(task=task).count() == events


def test_publishing_an_open_task_is_a_409(alice: Any, alice_client: APIClient) -> None:
    task = post_task(alice)
    response = alice_client.post(f"{TASKS}{task.pk}/publish/")
    assert response.status_code == 409
    assert "open cannot become open" in response.json()["status"][0]


@pytest.mark.parametrize(
    "url",
    [
        f"{TASKS}not-a-uuid/",
        f"{TASKS}{'-' * 36}/",
        f"{TASKS}{'a' * 32}x/",
        f"{TASKS}{'-' * 32}/cancel/",
        "/api/v1/datasets/zzz/",
        f"/api/v1/datasets/{'-' * 36}/",
        "/api/v1/kinds/NoSuchKind/",
        "/api/v1/kinds/nosuchkind/",
    ],
)
def test_malformed_ids_in_urls_are_404(alice_client: APIClient, url: str) -> None:
    method = alice_client.post if url.endswith("cancel/") else alice_client.get
    response = method(url)
    assert response.status_code == 404
    assert response["Content-Type"].startswith("application/json")  # as every API 4xx, routed or not


@pytest.mark.parametrize("debug", [False, True], ids=["production", "development"])
@pytest.mark.parametrize(
    "url",
    ["/api/v1/nothing/", "/api/v1/ledger/blocks/x/", "/api/nothing", "/api/v1/tasks/abc/", "/api"],
)
def test_an_api_url_no_route_matches_is_a_json_404_and_a_page_an_html_one(
    client: Any, settings: Any, url: str, debug: bool
) -> None:
    settings.DEBUG = debug  # Django's handler404 is not used with DEBUG on: `make run`'s default
    for method in (client.get, client.post, client.delete):
        response = method(url)
        assert response.status_code == 404
        assert response.json() == {"detail": "Not found."}
    page = client.get("/no-such-page/")
    assert page.status_code == 404
    assert page["Content-Type"].startswith("text/html")


@pytest.mark.parametrize("debug", [False, True], ids=["production", "development"])
def test_an_api_path_with_a_doubled_slash_is_a_json_404(client: Any, settings: Any, debug: bool) -> None:
    """``//api/v1/tasks/`` as an HTTP client sends it (the test client's URL parsing would
    read ``api`` as a host name, so the request is built from its WSGI environ)."""
    settings.DEBUG = debug
    for path in ("//api/v1/tasks/", "//api/v1/tasks", "///api"):
        response = client.request(PATH_INFO=path, REQUEST_METHOD="GET")
        assert response.status_code == 404, path
        assert response.json() == {"detail": "Not found."}


def test_an_api_path_without_its_slash_is_redirected_or_told(alice_client: APIClient) -> None:
    response = alice_client.get("/api/v1/tasks?status=open")
    assert response.status_code == 301
    assert response["Location"] == "/api/v1/tasks/?status=open"
    assert response.json() == {"detail": "Moved: API paths end with a slash: /api/v1/tasks/"}
    posted = alice_client.post("/api/v1/tasks", {"kind": "synthetic", "budget": "1"}, format="json")
    assert posted.status_code == 404
    assert posted.json() == {"detail": "Not found. API paths end with a slash: /api/v1/tasks/"}


@pytest.mark.parametrize("token_id", ["abc", "9" * 30, "-1", "0"])
def test_malformed_token_ids_are_404(alice_client: APIClient, token_id: str) -> None:
    assert alice_client.delete(f"/api/v1/me/tokens/{token_id}/").status_code == 404


def test_bad_list_filters_name_the_parameter(alice_client: APIClient) -> None:
    response = alice_client.get(f"{TASKS}?status=finished")
    assert response.status_code == 400
    assert "status" in response.json()
    response = alice_client.get(f"{TASKS}?created_after=yesterday")
    assert response.status_code == 400
    assert "created_after" in response.json()
    response = alice_client.get(f"{TASKS}?kind=quantum")
    assert response.status_code == 400
    assert "kind" in response.json()


def test_an_ordering_on_a_field_not_offered_is_a_400_naming_it(alice: Any, alice_client: APIClient) -> None:
    """Not silently ignored (a typo would look like an ordering that works), and never a
    way to sort by a column the list does not offer, such as a related user's password."""
    post_task(alice)
    response = alice_client.get(f"{TASKS}?ordering=owner__password")
    assert response.status_code == 400
    assert "owner__password" in response.json()["ordering"][0]
    assert "created_at" in response.json()["ordering"][0]


def test_service_refuses_unknown_kind_directly(alice: Any) -> None:
    # The page form calls the service without the API serializer in front of it.
    from rest_framework.exceptions import ValidationError

    with pytest.raises(ValidationError) as caught:
        services.post_task(alice, services.TaskRequest(kind="quantum", spec={}, budget=10**9))
    assert "kind" in caught.value.detail
    assert Task.objects.count() == 0


@pytest.mark.usefixtures("unchanged")
def test_an_oversized_json_body_is_a_json_413(alice_client: APIClient, settings: Any) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    response = post_raw(alice_client, json.dumps({**GOOD, "title": "x" * 2000}))
    assert response.status_code == 413
    assert "over 1000 bytes" in errors_of(response)["detail"]


@pytest.mark.usefixtures("unchanged")
def test_a_form_encoded_post_works_like_json(alice_client: APIClient) -> None:
    response = alice_client.post(
        TASKS, "kind=synthetic&budget=1&spec=%5B%5D", content_type="application/x-www-form-urlencoded"
    )
    assert response.status_code == 400
    assert "JSON object" in str(errors_of(response)["spec"])
    response = alice_client.post(TASKS, "hello", content_type="text/plain")
    assert response.status_code == 415


# Strings no column can hold: PostgreSQL refuses U+0000 in text and jsonb, and a JSON
# escape of half a surrogate pair parses to a string that cannot be encoded as UTF-8 (a
# 500 wherever it was stored or echoed back in an error, on SQLite too). The parsers
# refuse both, naming the field, before any view sees them.
UNSTORABLE = [
    ('{"kind": "\\ud800", "budget": "1"}', {"kind": ["Unpaired surrogates"]}),
    ('{"kind": "synthetic", "budget": "1", "spec": {"gate": "\\udfff"}}', {"spec": {"gate": ["Unpaired"]}}),
    ('{"kind": "synthetic", "budget": "1", "title": "a\\u0000b"}', {"title": ["Null characters"]}),
    ('{"kind": "synthetic", "budget": "1", "spec": {"n": ["\\u0000"]}}', {"spec": {"n": ["Null characters"]}}),
    ('{"kind": "synthetic", "budget": "1", "spec": {"\\u0000": 1}}', {"spec": ["A key: Null characters"]}),
    ('["\\ud800"]', {"non_field_errors": ["Unpaired surrogates"]}),
]


@pytest.mark.parametrize(("body", "expected"), UNSTORABLE, ids=range(len(UNSTORABLE)))
@pytest.mark.usefixtures("unchanged")
def test_unstorable_text_is_a_400_naming_the_field(alice_client: APIClient, body: str, expected: Any) -> None:
    response = post_raw(alice_client, body)
    assert response.status_code == 400
    node, want = errors_of(response), expected
    while isinstance(want, dict):
        ((key, want),) = want.items()
        node = node[key]
    assert node[0].startswith(want[0]), response.json()


@pytest.mark.usefixtures("unchanged")
def test_a_nul_in_a_form_encoded_body_is_refused_like_in_json(alice_client: APIClient) -> None:
    response = alice_client.post(
        TASKS, "kind=synthetic&budget=1&title=a%00b", content_type="application/x-www-form-urlencoded"
    )
    assert response.status_code == 400
    assert errors_of(response) == {"title": ["Null characters are not allowed."]}
    response = alice_client.post(TASKS, {"kind": "synthetic", "budget": "1", "title": "a\x00b"}, format="multipart")
    assert response.status_code == 400
    assert errors_of(response) == {"title": [NUL_IN_FORM_FIELD]}


def test_a_file_part_without_a_filename_is_told_how_to_send_a_file(alice: Any, alice_client: APIClient) -> None:
    """To Django a part with ``filename=""`` is a plain field, so a binary file sent that way
    arrives as text holding NUL bytes; the 400 names the field and says what to send."""
    body = (
        '--XX\r\nContent-Disposition: form-data; name="file"; filename=""\r\n'
        "Content-Type: application/octet-stream\r\n\r\nPK\x03\x04\x00\x00binary\r\n--XX--\r\n"
    )
    response = alice_client.generic("POST", "/api/v1/datasets/", body, content_type="multipart/form-data; boundary=XX")
    assert response.status_code == 400
    assert errors_of(response) == {"file": [NUL_IN_FORM_FIELD]}
    assert 'filename="' in NUL_IN_FORM_FIELD
    assert not Dataset.objects.filter(owner=alice).exists()


@pytest.mark.parametrize("encoding", ["form", "multipart"])
@pytest.mark.usefixtures("unchanged")
def test_a_form_spec_of_null_is_refused_as_in_json(alice_client: APIClient, encoding: str) -> None:
    as_json = post_raw(alice_client, '{"kind": "synthetic", "budget": "1", "spec": null}')
    assert as_json.status_code == 400
    if encoding == "form":
        response = alice_client.post(
            TASKS, "kind=synthetic&budget=1&spec=null", content_type="application/x-www-form-urlencoded"
        )
    else:
        response = alice_client.post(TASKS, {"kind": "synthetic", "budget": "1", "spec": "null"}, format="multipart")
    assert response.status_code == 400
    assert errors_of(response) == errors_of(as_json) == {"spec": ["This field may not be null."]}


DEEP = "%5B" * 5000 + "%5D" * 5000  # [[[[…]]]] once decoded: json raises RecursionError


@pytest.mark.parametrize("url", [TASKS, f"{TASKS}quote/"])
@pytest.mark.parametrize("encoding", ["form", "multipart"])
@pytest.mark.usefixtures("unchanged")
def test_a_form_value_nested_too_deeply_is_a_400_naming_it(alice_client: APIClient, url: str, encoding: str) -> None:
    if encoding == "form":
        response = alice_client.post(
            url, f"kind=synthetic&budget=1&spec={DEEP}", content_type="application/x-www-form-urlencoded"
        )
    else:
        deep = "[" * 5000 + "]" * 5000
        response = alice_client.post(url, {"kind": "synthetic", "budget": "1", "spec": deep}, format="multipart")
    assert response.status_code == 400
    assert errors_of(response)["spec"] == ["Value must be valid JSON."]


@pytest.mark.parametrize("url", [TASKS, f"{TASKS}quote/"])
@pytest.mark.parametrize("encoding", ["form", "multipart"])
@pytest.mark.parametrize(
    "spec",
    ['{"\\ud800": 1}', '{"n": 64, "generator": "\\ud800"}', '{"n": 64, "generator": "a\\u0000b"}'],
    ids=["surrogate key", "surrogate value", "nul value"],
)
@pytest.mark.usefixtures("unchanged")
def test_a_form_spec_holding_text_no_column_can_hold_is_a_400_naming_it(
    alice_client: APIClient, url: str, encoding: str, spec: str
) -> None:
    """The spec's JSON text is decoded by the field, after the parser's checks: a lone
    surrogate echoed in the 400 could not be rendered (a 500), and a NUL reached the
    database."""
    if encoding == "form":
        response = alice_client.post(
            url, f"kind=synthetic&budget=1&spec={quote(spec)}", content_type="application/x-www-form-urlencoded"
        )
    else:
        response = alice_client.post(url, {"kind": "synthetic", "budget": "1", "spec": spec}, format="multipart")
    assert response.status_code == 400
    assert "spec" in errors_of(response), response.content


def test_a_worker_registering_with_capabilities_nested_too_deeply_gets_a_400(db: Any) -> None:
    response = APIClient().post(
        "/api/v1/workers/register/",
        f"registration_token=t&public_key=ab&signature=cd&register_tx_signature=ef&capabilities={DEEP}",
        content_type="application/x-www-form-urlencoded",
    )
    assert response.status_code == 400
    assert errors_of(response)["capabilities"] == ["Value must be valid JSON."]


@pytest.mark.parametrize(
    ("param", "value"),
    [("created_after", "0001-01-01T00:00:00+14:00"), ("created_before", "9999-12-31T23:59:59-14:00")],
)
def test_a_date_filter_outside_the_years_a_database_holds_is_a_400(
    alice: Any, alice_client: APIClient, param: str, value: str
) -> None:
    post_task(alice)
    response = alice_client.get(TASKS, {param: value})
    assert response.status_code == 400
    assert errors_of(response)[param] == ["This date-time is outside years 1 to 9999 in UTC."]
    # Within range, the same filter works.
    assert alice_client.get(TASKS, {param: "2020-01-01T00:00:00+14:00"}).status_code == 200


def test_the_api_docs_page_answers_options_with_a_405(client: Any) -> None:
    assert client.options("/api/docs/", HTTP_ACCEPT="text/html").status_code == 405
    assert client.get("/api/docs/").status_code == 200
