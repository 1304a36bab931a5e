"""The base of every API view that lists or changes a user's own rows."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from rest_framework import generics, viewsets

from config.api.parsers import PARSERS
from config.owned import OwnedQuerySet


class OwnedRowsMixin(generics.GenericAPIView[Any]):
    """A view's queryset is ``base_queryset()`` narrowed to the requesting user's own rows
    (``OwnedQuerySet.owned_by``)."""

    def base_queryset(self) -> OwnedQuerySet[Any]:
        raise NotImplementedError

    def get_queryset(self) -> QuerySet[Any]:
        # The schema generator calls this with an anonymous user; owned_by gives it nothing.
        if getattr(self, "swagger_fake_view", False):
            return self.base_queryset().none()
        return self.base_queryset().owned_by(self.request.user)


class OwnedViewSet(OwnedRowsMixin, viewsets.GenericViewSet):
    """A viewset of the requesting user's own rows."""

    parser_classes = PARSERS
