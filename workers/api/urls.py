"""REST routes of the workers app, mounted under /api/v1/workers/."""

from __future__ import annotations

from django.urls import include, path
from rest_framework.routers import SimpleRouter

from workers.api import worker_views as views

router = SimpleRouter()
router.register("", views.WorkerViewSet, basename="worker")

urlpatterns = [
    path("registration-tokens/", views.RegistrationTokenView.as_view(), name="worker-registration-token"),
    path("challenge/", views.ChallengeView.as_view(), name="worker-challenge"),
    path("register/", views.RegisterView.as_view(), name="worker-register"),
    path("me/sweep/", views.SweepView.as_view(), name="worker-sweep"),
    path("me/abandon/", views.AbandonView.as_view(), name="worker-abandon"),
    path("me/asks/", views.NodeAsksView.as_view(), name="worker-asks"),
    path("me/capabilities/", views.CapabilitiesView.as_view(), name="worker-capabilities"),
    path("", include(router.urls)),
]
