"""Not-found answers for URLs no view answers: JSON under the API, HTML elsewhere.

A URL under ``/api/`` that matches no route (``/api/v1/nothing/``, or a task id that is
not a UUID, which the router's pattern refuses before any view runs) was answered by
Django's HTML 404 page, breaking the API's promise that every 4xx is JSON. The last API
route (``api_not_found``, in config/urls.py) answers them, so it holds with DEBUG on
too, where Django's ``handler404`` is not used; ``not_found`` covers a 404 raised under
``/api/`` by anything else."""

from __future__ import annotations

import json

from django.http import HttpRequest, HttpResponse, HttpResponsePermanentRedirect, JsonResponse
from django.urls import Resolver404, resolve
from django.views import defaults
from django.views.decorators.csrf import csrf_exempt

API_PREFIX = "/api/"
NOT_FOUND = {"detail": "Not found."}


@csrf_exempt  # it changes nothing; a POST to a wrong URL must get this 404, not a CSRF page
def api_not_found(request: HttpRequest) -> HttpResponse:
    """No API route matches. A path that matches one once a slash is added gets the
    redirect Django's APPEND_SLASH would have sent (a GET), or a 404 saying so."""
    path = request.path_info
    if not path.endswith("/") and _routed(path + "/"):
        if request.method in ("GET", "HEAD"):
            query = request.META.get("QUERY_STRING", "")
            target = request.path + "/" + (f"?{query}" if query else "")
            moved = json.dumps({"detail": f"Moved: API paths end with a slash: {request.path}/"})
            return HttpResponsePermanentRedirect(target, content=moved, content_type="application/json")
        return JsonResponse({"detail": f"Not found. API paths end with a slash: {request.path}/"}, status=404)
    return JsonResponse(NOT_FOUND, status=404)


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if request.path_info.lstrip("/").startswith(API_PREFIX[1:]):
        return JsonResponse(NOT_FOUND, status=404)
    return defaults.page_not_found(request, exception)


def _routed(path: str) -> bool:
    try:
        return resolve(path).func is not api_not_found
    except Resolver404:
        return False
