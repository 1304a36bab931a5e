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
