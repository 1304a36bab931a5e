"""The market pages, mounted under /market/."""

from __future__ import annotations

from django.urls import path

from workers.market import views

urlpatterns = [
    path("", views.market_index, name="market"),
    path("<slug:kind>/", views.market_kind, name="market-kind"),
]
