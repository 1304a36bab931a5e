"""The provider node's REST routes, mounted under /api/v1/assignments/."""

from __future__ import annotations

from django.urls import path

from workers.api import assignment_views as views

urlpatterns = [
    path("<uuid:assignment_id>/", views.AssignmentView.as_view(), name="assignment"),
    path("<uuid:assignment_id>/dataset/", views.AssignmentDatasetView.as_view(), name="assignment-dataset"),
    path(
        "<uuid:assignment_id>/dataset/<str:name>/",
        views.AssignmentDatasetFileView.as_view(),
        name="assignment-dataset-file",
    ),
    path("<uuid:assignment_id>/model/<str:name>/", views.AssignmentModelView.as_view(), name="assignment-model"),
    path("<uuid:assignment_id>/start/", views.AssignmentStartView.as_view(), name="assignment-start"),
    path(
        "<uuid:assignment_id>/artifacts/<str:filename>/", views.ArtifactUploadView.as_view(), name="assignment-artifact"
    ),
    path("<uuid:assignment_id>/fail/", views.AssignmentFailView.as_view(), name="assignment-fail"),
    path("<uuid:assignment_id>/result/", views.ResultView.as_view(), name="assignment-result"),
]
