"""Small helpers shared by the page views."""

from __future__ import annotations

from django.http import HttpRequest

from marketplace.models import User


def current_user(request: HttpRequest) -> User:
    """The signed-in user; only for views behind login_required."""
    user = request.user
    assert isinstance(user, User), "view must be behind login_required"
    return user


def is_htmx(request: HttpRequest) -> bool:
    return request.headers.get("HX-Request") == "true"
