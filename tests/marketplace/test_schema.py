"""The OpenAPI schema builds with no warnings and documents the marketplace API."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.conf import settings
from rest_framework.test import APIClient

ROOT = Path(settings.BASE_DIR)


@pytest.fixture(scope="module")
def schema(tmp_path_factory: Any) -> dict[str, Any]:
    """Run the real command in a fresh process: drf-spectacular reports each warning
    only once per process, so an in-process run after other tests could miss some."""
    out = tmp_path_factory.mktemp("schema") / "schema.yml"
    result = subprocess.run(
        [sys.executable, "manage.py", "spectacular", "--validate", "--fail-on-warn", "--file", str(out)],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "Warning" not in result.stderr, result.stderr[-4000:]
    loaded: dict[str, Any] = yaml.safe_load(out.read_text())
    return loaded


def test_schema_is_openapi_3(schema: dict[str, Any]) -> None:
    assert schema["openapi"].startswith("3.")
    assert schema["info"]["title"] == "Proofwork API"


@pytest.mark.parametrize(
    ("path", "methods"),
    [
        ("/api/v1/tasks/", {"get", "post"}),
        ("/api/v1/tasks/{id}/", {"get"}),
        ("/api/v1/tasks/{id}/cancel/", {"post"}),
        ("/api/v1/tasks/{id}/publish/", {"post"}),
        ("/api/v1/marketplace/tasks/", {"get"}),
        ("/api/v1/datasets/", {"get", "post"}),
        ("/api/v1/datasets/{id}/", {"get", "delete"}),
        ("/api/v1/dataset-uploads/", {"post"}),
        ("/api/v1/dataset-uploads/{id}/", {"get", "put", "delete"}),
        ("/api/v1/kinds/", {"get"}),
        ("/api/v1/kinds/{name}/", {"get"}),
        ("/api/v1/me/", {"get", "patch"}),
        ("/api/v1/me/tokens/", {"get", "post"}),
        ("/api/v1/me/tokens/{id}/", {"delete"}),
    ],
)
def test_schema_documents_the_marketplace_api(schema: dict[str, Any], path: str, methods: set[str]) -> None:
    assert path in schema["paths"]
    documented = {m for m in schema["paths"][path] if m in {"get", "post", "patch", "put", "delete"}}
    assert documented == methods


def test_schema_describes_the_token_scheme(schema: dict[str, Any]) -> None:
    token = schema["components"]["securitySchemes"]["tokenAuth"]
    assert token == {
        "type": "apiKey",
        "in": "header",
        "name": "Authorization",
        "description": "An API token from your account page, sent as `Token pw_…`.",
    }
    assert {"tokenAuth": []} in schema["paths"]["/api/v1/tasks/"]["post"]["security"]


def test_schema_shows_request_bodies_and_filters(schema: dict[str, Any]) -> None:
    post = schema["paths"]["/api/v1/tasks/"]["post"]
    ref = post["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
    body = schema["components"]["schemas"][ref]
    assert set(body["required"]) == {"kind", "budget"}
    assert "spec" in body["properties"]
    upload = schema["paths"]["/api/v1/datasets/"]["post"]["requestBody"]["content"]
    assert "multipart/form-data" in upload
    part = schema["paths"]["/api/v1/dataset-uploads/{id}/"]["put"]
    assert "application/octet-stream" in part["requestBody"]["content"]
    assert {"name": "Content-Range", "required": True} in [
        {"name": p["name"], "required": p.get("required", False)} for p in part["parameters"] if p["in"] == "header"
    ]
    assert {"201", "202", "400", "409", "413"} <= set(part["responses"])
    params = {p["name"] for p in schema["paths"]["/api/v1/tasks/"]["get"]["parameters"]}
    assert {"status", "kind", "created_after", "ordering", "page"} <= params
    created = schema["paths"]["/api/v1/me/tokens/"]["post"]["responses"]["201"]
    ref = created["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
    assert "token" in schema["components"]["schemas"][ref]["properties"]


@pytest.mark.django_db
def test_schema_and_docs_are_served_without_a_cdn(anon_client: APIClient) -> None:
    response = anon_client.get("/api/schema/")
    assert response.status_code == 200
    assert b"/api/v1/tasks/" in response.content
    docs = anon_client.get("/api/docs/")
    assert docs.status_code == 200
    page = docs.content.decode()
    assert "swagger-ui" in page
    assert "cdn.jsdelivr.net" not in page
    assert "unpkg.com" not in page


# --- tags and the common errors (config/api/schema.py) -----------------------------------

AREAS = {"tasks", "market", "datasets", "kinds", "workers", "assignments", "ledger", "payments", "account"}
UNSAFE = {"post", "put", "patch", "delete"}


def operations(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (path, method, op)
        for path, item in schema["paths"].items()
        for method, op in item.items()
        if method in {"get", "post", "put", "patch", "delete"}
    ]


def test_every_operation_has_one_declared_tag(schema: dict[str, Any]) -> None:
    declared = [tag["name"] for tag in schema["tags"]]
    assert set(declared) == AREAS
    assert all(tag.get("description") for tag in schema["tags"])
    untagged = [f"{m.upper()} {p}: {op.get('tags')}" for p, m, op in operations(schema) if len(op.get("tags", [])) != 1]
    assert not untagged
    unknown = [f"{m.upper()} {p}" for p, m, op in operations(schema) if op["tags"][0] not in declared]
    assert not unknown


@pytest.mark.parametrize(
    ("path", "method", "tag"),
    [
        ("/api/v1/tasks/", "post", "tasks"),
        ("/api/v1/marketplace/tasks/", "get", "market"),
        ("/api/v1/workers/{id}/asks/", "get", "market"),
        ("/api/v1/dataset-uploads/", "post", "datasets"),
        ("/api/v1/workers/register/", "post", "workers"),
        ("/api/v1/assignments/{assignment_id}/result/", "post", "assignments"),
        ("/api/v1/ledger/blocks/", "get", "ledger"),
        ("/api/v1/payments/", "post", "payments"),
        ("/api/v1/me/tokens/", "post", "account"),
    ],
)
def test_operations_are_tagged_by_area(schema: dict[str, Any], path: str, method: str, tag: str) -> None:
    assert schema["paths"][path][method]["tags"] == [tag]


def test_every_operation_documents_its_errors(schema: dict[str, Any]) -> None:
    missing = []
    for path, method, op in operations(schema):
        codes = set(op["responses"])
        takes_input = "requestBody" in op or any(p["in"] == "query" for p in op.get("parameters", []))
        if (takes_input or method in UNSAFE) and "400" not in codes:
            missing.append(f"{method.upper()} {path}: 400")
        if any(requirement for requirement in op.get("security", [])) and "401" not in codes:
            missing.append(f"{method.upper()} {path}: 401")
        if any(p["in"] == "path" for p in op.get("parameters", [])) and "404" not in codes:
            missing.append(f"{method.upper()} {path}: 404")
        if "requestBody" in op and not {"413", "415"} <= codes:
            missing.append(f"{method.upper()} {path}: 413/415")
        if not any(code.startswith("2") for code in codes):
            missing.append(f"{method.upper()} {path}: a success")
    assert not missing


def test_errors_have_the_api_error_shape(schema: dict[str, Any]) -> None:
    components = schema["components"]["schemas"]
    assert components["Error"]["required"] == ["detail"]
    assert "non_field_errors" in components["FieldErrors"]["properties"]
    assert components["Conflict"]["required"] == ["code"]

    def shape(path: str, method: str, code: str) -> str:
        ref: str = schema["paths"][path][method]["responses"][code]["content"]["application/json"]["schema"]["$ref"]
        return ref.rsplit("/", 1)[-1]

    assert shape("/api/v1/tasks/", "post", "400") == "FieldErrors"
    assert shape("/api/v1/tasks/", "post", "401") == "Error"
    assert shape("/api/v1/tasks/{id}/cancel/", "post", "409") == "Conflict"
    assert shape("/api/v1/tasks/{id}/", "get", "404") == "Error"
    # What a view documents itself stays its own.
    assert shape("/api/v1/dataset-uploads/{id}/", "put", "409") == "DatasetUploadPartConflict"


def test_limits_and_outside_services_are_documented(schema: dict[str, Any]) -> None:
    paths = schema["paths"]
    assert "429" in paths["/api/v1/ledger/transactions/"]["post"]["responses"]
    assert "Retry-After" in paths["/api/v1/ledger/transactions/"]["post"]["responses"]["429"]["headers"]
    assert "429" in paths["/api/v1/workers/registration-tokens/"]["post"]["responses"]
    assert {"502", "503"} <= set(paths["/api/v1/payments/"]["post"]["responses"])
    assert "503" in paths["/api/v1/workers/register/"]["post"]["responses"]
    # Anonymous reads take no credentials to refuse, and open operations name no 401.
    assert "401" not in paths["/api/v1/workers/challenge/"]["post"]["responses"]
    assert "403" not in paths["/api/v1/kinds/"]["get"]["responses"]
