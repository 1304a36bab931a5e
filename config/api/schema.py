"""The OpenAPI schema's shared parts, in one place for every view: each operation's tag
(the area its path belongs to) and the error answers it can give, in the API's one error
shape (config/api/errors.py).

A view documents its successes and any error it answers in a shape of its own
(``extend_schema(responses=...)``); what is here only fills in the codes a view left out,
and ``extend_schema(tags=...)`` on a view wins over the path's tag.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from drf_spectacular import openapi
from drf_spectacular.plumbing import ResolvedComponent

API_PREFIX = re.compile(r"^/api/v[0-9]+/")


@dataclass(frozen=True)
class Tag:
    """An area of the API: the paths (after ``/api/v1/``) it holds and what it is for."""

    name: str
    paths: str  # a regular expression matched at the start of the path
    description: str


# The first tag whose paths match is the operation's: the narrower areas come first.
TAGS: tuple[Tag, ...] = (
    Tag(
        "tasks",
        r"tasks/",
        "Your tasks: quote, post, follow, cancel or publish them; download their results.",
    ),
    Tag(
        "market",
        r"marketplace/tasks/|workers/[^/]+/asks/",
        "The market: open tasks waiting for providers, and the asks providers set on their nodes (docs/market.md).",
    ),
    Tag(
        "datasets",
        r"datasets/|dataset-uploads/",
        "Your datasets: upload one in a single request or in parts, list, delete.",
    ),
    Tag("kinds", r"kinds/", "The task kinds the platform runs, with their spec schema and limits."),
    Tag(
        "workers",
        r"workers/",
        "Provider nodes: registration, a node's own capabilities and sweep, owners' suspend, resume and retire.",
    ),
    Tag(
        "assignments",
        r"assignments/|verifications/",
        "A node's jobs: the spec and data, start, artifacts, the signed result, failure; and the verification "
        "jobs that re-execute another provider's challenged segments (worker token).",
    ),
    Tag("ledger", r"ledger/", "The public ledger: blocks, transactions and proofs, accounts; your wallet; transfers."),
    Tag("payments", r"payments/", "Credits bought with Stripe, the Connect account and payouts."),
    Tag("account", r"me/", "Your profile and API tokens."),
)


def tag_for(path: str) -> str | None:
    """The tag of an API path (``/api/v1/tasks/{id}/`` → ``tasks``), None for a path no tag holds."""
    rest = API_PREFIX.sub("", path)
    return next((tag.name for tag in TAGS if re.match(tag.paths, rest)), None)


# Answers that come from a rule of the service behind an operation, not from what the
# operation takes: a service outside the platform that may be off or unreachable, a limit
# on rows. (methods, path after /api/v1/, {code: description}).
SERVICE_ANSWERS: tuple[tuple[frozenset[str], str, dict[int, str]], ...] = (
    (
        frozenset({"POST"}),
        r"payments/",
        {
            502: "Stripe refused the request or could not be reached.",
            503: "Payments are not configured on this server.",
        },
    ),
    (frozenset({"POST"}), r"workers/register/", {503: "The node broker cannot be reached; nothing was registered."}),
    (
        frozenset({"POST"}),
        r"workers/registration-tokens/",
        {429: "You hold the most unused registration tokens one may: use one, or wait for them to expire."},
    ),
)

UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})

# The shapes of config/api/errors.py, as schema components.
ERROR_SCHEMAS: dict[str, dict[str, Any]] = {
    "Error": {
        "type": "object",
        "description": "Any error but invalid input and a state conflict: one message.",
        "properties": {"detail": {"type": "string"}},
        "required": ["detail"],
    },
    "FieldErrors": {
        "type": "object",
        "description": (
            "Invalid input. Each key names a field (`non_field_errors` for the input as a whole) and "
            "holds its messages; a nested field holds an object of the same shape. A body that cannot be "
            "parsed at all is answered with `detail` alone."
        ),
        "properties": {
            "detail": {"type": "string"},
            "non_field_errors": {"type": "array", "items": {"type": "string"}},
        },
        "additionalProperties": {
            "oneOf": [{"type": "array", "items": {}}, {"type": "object", "additionalProperties": {}}],
        },
        "example": {"spec": {"epochs": ["Ensure this value is less than or equal to 100."]}},
    },
    "Conflict": {
        "type": "object",
        "description": "The current state of the object refuses the request: the field it names, and a code.",
        "properties": {"code": {"type": "string"}},
        "required": ["code"],
        "additionalProperties": {"type": "array", "items": {"type": "string"}},
        "example": {"status": ["A completed task cannot be cancelled."], "code": "illegal_transition"},
    },
}
ERROR_SCHEMA_OF = {400: "FieldErrors", 409: "Conflict"}


class AutoSchema(openapi.AutoSchema):
    """drf-spectacular's inspector with the tag of the path's area and the common errors."""

    def get_tags(self) -> list[str]:
        tag = tag_for(self.path)
        return [tag] if tag else super().get_tags()

    def get_operation(
        self, path: str, path_regex: str, path_prefix: str, method: str, registry: Any
    ) -> dict[str, Any] | None:
        operation = super().get_operation(path, path_regex, path_prefix, method, registry)
        if operation is None:
            return None
        responses = operation.setdefault("responses", {})
        for code, description in self.error_answers(operation, path, method).items():
            if str(code) in responses:
                continue  # the view's own documentation of this code
            name = ERROR_SCHEMA_OF.get(code, "Error")
            component = ResolvedComponent(
                name=name, type=ResolvedComponent.SCHEMA, object=name, schema=ERROR_SCHEMAS[name]
            )
            registry.register_on_missing(component)
            response: dict[str, Any] = {
                "description": description,
                "content": {"application/json": {"schema": component.ref}},
            }
            if code == 429:
                response["headers"] = {
                    "Retry-After": {
                        "schema": {"type": "integer"},
                        "description": "Seconds to wait before trying again.",
                    }
                }
            responses[str(code)] = response
        operation["responses"] = dict(sorted(responses.items()))
        return operation

    def error_answers(self, operation: dict[str, Any], path: str, method: str) -> dict[int, str]:
        """The error codes this operation can answer, each with when, from what it takes."""
        parameters = operation.get("parameters", [])
        takes_body = "requestBody" in operation
        takes_query = any(p["in"] == "query" for p in parameters)
        names_object = any(p["in"] == "path" for p in parameters)
        paginated = any(p["in"] == "query" and p["name"] == "page" for p in parameters)
        security = operation.get("security", [])
        checks_credentials = any(requirement for requirement in security)
        anonymous_allowed = not security or {} in security
        answers: dict[int, str] = {}
        if takes_body or takes_query or method in UNSAFE:
            answers[400] = "The input is not valid: each field named with its messages."
        if checks_credentials:
            answers[401] = "The credentials sent are missing, not valid or revoked."
            if not anonymous_allowed or method in UNSAFE:
                answers[403] = "These credentials may not do this (or a session's request came without its CSRF token)."
        if names_object or paginated:
            answers[404] = "No such object among those these credentials may see." + (
                " Or no such page." if paginated else ""
            )
        if method in UNSAFE and names_object:
            answers[409] = "The object's current state refuses the request."
        if takes_body:
            answers[413] = "The request body is over the size limit."
            answers[415] = "The request body's Content-Type is not one this operation reads."
        if self.view.get_throttles():
            answers[429] = "Too many requests: wait for Retry-After seconds."
        rest = API_PREFIX.sub("", path)
        for methods, pattern, codes in SERVICE_ANSWERS:
            if method in methods and re.match(pattern, rest):
                answers.update(codes)
        return answers


def declare_tags(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """A postprocessing hook: lists the tags the operations use, in TAGS' order, with their
    descriptions (Swagger UI shows one section each)."""
    used = {tag for item in result.get("paths", {}).values() for op in item.values() for tag in op.get("tags", [])}
    declared = [{"name": tag.name, "description": tag.description} for tag in TAGS if tag.name in used]
    result["tags"] = declared + [{"name": name} for name in sorted(used - {tag.name for tag in TAGS})]
    return result
