"""REST routes of the workers app, mounted under /api/v1/workers/."""

from __future__ import annotations

from django.urls import include, path
from rest_framework.routers import SimpleRouter

from workers import api

router = SimpleRouter()
router.register("", api.WorkerViewSet, basename="worker")

urlpatterns = [
    path("registration-tokens/", api.RegistrationTokenView.as_view(), name="worker-registration-token"),
    path("challenge/", api.ChallengeView.as_view(), name="worker-challenge"),
    path("register/", api.RegisterView.as_view(), name="worker-register"),
    path("me/sweep/", api.SweepView.as_view(), name="worker-sweep"),
    path("me/abandon/", api.AbandonView.as_view(), name="worker-abandon"),
    path("me/capabilities/", api.CapabilitiesView.as_view(), name="worker-capabilities"),
    path("", include(router.urls)),
]
