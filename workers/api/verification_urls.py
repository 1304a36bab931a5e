"""A verifier node's REST routes, mounted under /api/v1/verifications/."""

from __future__ import annotations

from django.urls import path

from workers.api import verification_views as views

urlpatterns = [
    path("<uuid:job_id>/", views.VerificationView.as_view(), name="verification"),
    path("<uuid:job_id>/dataset/", views.VerificationDatasetView.as_view(), name="verification-dataset"),
    path(
        "<uuid:job_id>/dataset/<str:name>/",
        views.VerificationDatasetFileView.as_view(),
        name="verification-dataset-file",
    ),
    path("<uuid:job_id>/slots/<str:slot>/<str:end>/", views.VerificationSlotView.as_view(), name="verification-slot"),
    path("<uuid:job_id>/answer/", views.VerificationAnswerView.as_view(), name="verification-answer"),
]
