from __future__ import annotations

from django.urls import include, path
from rest_framework.routers import DefaultRouter

from marketplace.api import dataset_uploads, views

router = DefaultRouter()
router.register("tasks", views.TaskViewSet, basename="task")
router.register("marketplace/tasks", views.MarketplaceViewSet, basename="public-task")
router.register("datasets", views.DatasetViewSet, basename="dataset")
router.register("dataset-uploads", dataset_uploads.DatasetUploadViewSet, basename="dataset-upload")
router.register("kinds", views.KindViewSet, basename="kind")
router.register("me/tokens", views.TokenViewSet, basename="token")

urlpatterns = [
    path("me/", views.MeView.as_view(), name="me"),
    path("", include(router.urls)),
]
