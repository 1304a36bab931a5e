"""The base viewset of every API endpoint that lists or changes a user's own rows."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from rest_framework import viewsets

from config.api.parsers import PARSERS


class OwnedViewSet(viewsets.GenericViewSet):
    """Restrict every queryset to the requesting user's own rows."""

    owner_field = "owner"
    parser_classes = PARSERS

    def base_queryset(self) -> QuerySet[Any]:
        raise NotImplementedError

    def get_queryset(self) -> QuerySet[Any]:
        user = self.request.user
        # The schema generator calls this with an anonymous user; so could a future
        # AllowAny action. Nobody anonymous owns rows.
        if getattr(self, "swagger_fake_view", False) or not user.is_authenticated:
            return self.base_queryset().none()
        return self.base_queryset().filter(**{self.owner_field: user})
