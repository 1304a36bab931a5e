"""The API's ``?ordering``: only what a view names in ``ordering_fields``, and a 400 saying
so for anything else."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db.models import QuerySet
from rest_framework import filters
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.views import APIView


class StrictOrderingFilter(filters.OrderingFilter):
    """DRF's OrderingFilter, with two changes.

    A view that names no ``ordering_fields`` takes no ordering from the client. DRF's
    would take any serializer field: on a large public table, a sort of every row on an
    unindexed column for each request. A view names only what is cheap: an indexed
    column, or any on a listing of one user's own rows.

    A term that is not allowed is a 400 under ``ordering`` naming the allowed fields.
    DRF drops it silently, so a typo looks like an ordering that works."""

    def get_valid_fields(
        self, queryset: QuerySet[Any] | None, view: APIView, context: Mapping[str, Any] | None = None
    ) -> list[tuple[str, str]]:
        fields = getattr(view, "ordering_fields", None)
        if fields is None:
            return []
        if isinstance(fields, str):  # DRF's "__all__": every column, indexed or not
            raise ImproperlyConfigured(f"{type(view).__name__}.ordering_fields must name its fields.")
        return [(field, field) if isinstance(field, str) else (field[0], field[1]) for field in fields]

    def allowed(self, view: APIView) -> list[str]:
        return [name for name, _label in self.get_valid_fields(None, view)]

    def get_ordering(self, request: Request, queryset: QuerySet[Any], view: APIView) -> Any:
        asked = request.query_params.get(self.ordering_param)
        terms = [term.strip() for term in (asked or "").split(",") if term.strip()]
        if not terms:
            return self.get_default_ordering(view)
        allowed = self.allowed(view)
        refused = [term for term in terms if term.removeprefix("-") not in allowed]
        if refused:
            shown = ", ".join(refused)
            if not allowed:
                raise ValidationError({self.ordering_param: [f"This list takes no ordering ({shown}); allowed: none."]})
            raise ValidationError(
                {
                    self.ordering_param: [
                        f"Not an ordering of this list: {shown}; allowed: {', '.join(allowed)}"
                        " (a leading '-' for descending)."
                    ]
                }
            )
        return terms

    def get_schema_operation_parameters(self, view: APIView) -> list[dict[str, Any]]:
        allowed = self.allowed(view)
        if not allowed:
            return []
        return [
            {
                "name": self.ordering_param,
                "required": False,
                "in": "query",
                "description": f"Order by any of {', '.join(allowed)}, comma-separated; a leading '-' for descending.",
                "schema": {
                    "type": "array",
                    "items": {"type": "string", "enum": [term for f in allowed for term in (f, f"-{f}")]},
                },
                "style": "form",
                "explode": False,
            }
        ]
