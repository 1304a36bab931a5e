"""``/admin/operations/``: mounted before the admin's own URLs, behind its staff check."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

from workers.operations import operations

urlpatterns = [path("", admin.site.admin_view(operations), name="admin-operations")]
