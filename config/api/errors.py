"""One JSON error shape for the whole API.

DRF's own errors already name the field (``{"spec": {"n": ["…"]}}``). This handler adds
the cases DRF leaves to Django: a ``StateConflict`` (a row's state refuses the request,
such as an illegal task transition) becomes 409 naming its field, any other Django
ValidationError becomes a 400 instead of a 500, and a body over Django's upload limits
becomes a JSON 413 instead of Django's HTML 400 page.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent
from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from config.api.exceptions import StateConflict


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's handler, plus the Django exceptions listed in the module docstring."""
    if isinstance(exc, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return Response(
            {"detail": f"The request body is over {limit} bytes; send files as multipart uploads."},
            status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
        )
    if isinstance(exc, TooManyFieldsSent):
        return Response({"detail": "Too many form fields."}, status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, StateConflict):
        return Response(
            {exc.field: [exc.messages[0]], "code": exc.code},
            status=status.HTTP_409_CONFLICT,
        )
    if isinstance(exc, DjangoValidationError):
        body = exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
        return Response(body, status=status.HTTP_400_BAD_REQUEST)
    return drf_exception_handler(exc, context)
