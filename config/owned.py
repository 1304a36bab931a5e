"""The owner rule: which rows are a user's own.

Every owned model's manager is an ``OwnedQuerySet``; ``Model.objects.owned_by(user)`` is
the only way code reads "this user's rows" (the API's owned viewsets, the pages, the
services that act on a user's row by id). An anonymous user owns nothing.
"""

from __future__ import annotations

from typing import Any, ClassVar, Self, TypeVar

from django.db import models

_M = TypeVar("_M", bound=models.Model)


class OwnedQuerySet(models.QuerySet[_M]):
    """A queryset of rows that belong to one user through ``owner_field``."""

    owner_field: ClassVar[str] = "owner"

    def owned_by(self, user: Any) -> Self:
        """The rows ``user`` owns: none for an anonymous user (or none at all)."""
        if not getattr(user, "is_authenticated", False):
            return self.none()
        return self.filter(**{self.owner_field: user})
