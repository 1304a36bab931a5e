"""Django's error pages for URLs no view answers: JSON under the API, HTML elsewhere.

A URL under ``/api/`` that matches no route (``/api/v1/nothing/``, or a task id that is
not a UUID, which the router's pattern refuses before any view runs) is answered by
Django, not DRF: its HTML 404 page broke the API's promise that every 4xx is JSON."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults

API_PREFIX = "/api/"


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if request.path.startswith(API_PREFIX):
        return JsonResponse({"detail": "Not found."}, status=404)
    return defaults.page_not_found(request, exception)
