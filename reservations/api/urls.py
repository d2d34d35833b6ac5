"""Routes: `reservations/<method>`."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver
from rest_framework.routers import SimpleRouter

from reservations.api.views import ReservationsViewSet

router = SimpleRouter(trailing_slash=False)
router.register("reservations", ReservationsViewSet, basename="reservations")

urlpatterns: list[URLPattern | URLResolver] = list(router.urls)
