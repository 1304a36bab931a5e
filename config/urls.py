"""Root URLs: pages, the versioned REST API, OpenAPI and the admin.

Media (uploaded datasets) is deliberately not served here: files are private to their
owner and go out only through authenticated views.
"""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path, re_path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from config.errors import api_not_found

# The admin's lists need the page's width at 1,280 px (the models are one click away from
# its index and its breadcrumbs).
admin.site.enable_nav_sidebar = False

urlpatterns = [
    # The admin's login page links here ("Forgotten your password?"): the site's reset.
    path(
        "admin/password_reset/",
        RedirectView.as_view(pattern_name="password_reset"),
        name="admin_password_reset",
    ),
    # The operations dashboard (staff only): before the admin, whose catch-all would 404 it.
    path("admin/operations/", include("workers.operations_urls")),
    path("admin/", admin.site.urls),
    path("api/v1/workers/", include("workers.api.urls")),
    path("api/v1/assignments/", include("workers.api.assignment_urls")),
    path("api/v1/verifications/", include("workers.api.verification_urls")),
    path("api/v1/ledger/", include("ledger.api.urls")),
    path("api/v1/payments/", include("payments.api_urls")),
    path("api/v1/", include("marketplace.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # GET and HEAD only: the HTML renderer has no template for OPTIONS.
    path(
        "api/docs/",
        SpectacularSwaggerView.as_view(url_name="schema", http_method_names=["get", "head"]),
        name="swagger-ui",
    ),
    # Last of the API: anything else under /api/ is a JSON 404 (config/errors.py).
    # ``//api/…`` too (the resolver strips one slash). "[/]*", not "/*": a pattern that begins
    # "^/" fails the deploy check (urls.W002).
    re_path(r"^[/]*api(?:/|$)", api_not_found),
    path("workers/", include("workers.urls")),
    path("market/", include("workers.market.urls")),
    path("", include("marketplace.urls")),
    path("", include("ledger.urls")),
    path("", include("payments.urls")),
]

handler404 = "config.errors.not_found"
