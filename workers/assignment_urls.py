"""The provider node's REST routes, mounted under /api/v1/assignments/."""

from __future__ import annotations

from django.urls import path

from workers import assignment_api as api

urlpatterns = [
    path("<uuid:assignment_id>/", api.AssignmentView.as_view(), name="assignment"),
    path("<uuid:assignment_id>/dataset/", api.AssignmentDatasetView.as_view(), name="assignment-dataset"),
    path("<uuid:assignment_id>/model/<str:name>/", api.AssignmentModelView.as_view(), name="assignment-model"),
    path("<uuid:assignment_id>/start/", api.AssignmentStartView.as_view(), name="assignment-start"),
    path(
        "<uuid:assignment_id>/artifacts/<str:filename>/", api.ArtifactUploadView.as_view(), name="assignment-artifact"
    ),
    path("<uuid:assignment_id>/fail/", api.AssignmentFailView.as_view(), name="assignment-fail"),
    path("<uuid:assignment_id>/result/", api.ResultView.as_view(), name="assignment-result"),
]
