"""Routes: `reservations/<method>` and `capacity/preview`."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver
from rest_framework.routers import SimpleRouter

from reservations.api.views import PreviewViewSet, ReservationsViewSet

router = SimpleRouter(trailing_slash=False)
router.register("reservations", ReservationsViewSet, basename="reservations")
router.register("capacity", PreviewViewSet, basename="capacity-preview")

urlpatterns: list[URLPattern | URLResolver] = list(router.urls)
