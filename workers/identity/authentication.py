"""Worker authentication: ``Authorization: Worker pww_…`` on REST and WebSocket.

A worker token authenticates a node, not a person: request.user stays anonymous and
request.auth is the Worker, so a worker token can never act on a user's endpoints.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AnonymousUser
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions, permissions
from rest_framework.request import Request

from workers.identity.services import authenticate_worker
from workers.models import Worker

KEYWORD = "worker"


def token_from_header(value: bytes) -> str | None:
    """The raw token of a ``Worker <token>`` header value, or None."""
    parts = value.split()
    if len(parts) != 2 or parts[0].decode(errors="replace").lower() != KEYWORD:
        return None
    try:
        return parts[1].decode("ascii")
    except UnicodeDecodeError:
        return None


class WorkerTokenAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[Any, Worker] | None:
        header = authentication.get_authorization_header(request)
        if not header.lower().startswith(KEYWORD.encode()):
            return None
        raw = token_from_header(header)
        worker = authenticate_worker(raw) if raw else None
        if worker is None:
            raise exceptions.AuthenticationFailed(
                "Invalid worker token, or the worker is suspended or retired, or its owner's account is deactivated."
            )
        return AnonymousUser(), worker

    def authenticate_header(self, request: Request) -> str:
        return "Worker"


class IsWorker(permissions.BasePermission):
    message = "A worker token is required."

    def has_permission(self, request: Request, view: Any) -> bool:
        return isinstance(request.auth, Worker)


class WorkerTokenScheme(OpenApiAuthenticationExtension):
    target_class = WorkerTokenAuthentication
    name = "workerTokenAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "A worker API token from registration, sent as `Worker pww_…`.",
        }
