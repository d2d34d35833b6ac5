"""Routes: every `capacity/*` method, and `usage/*`."""

from __future__ import annotations

from rest_framework.routers import SimpleRouter

from capacity.api.planning import PlanningViewSet
from capacity.api.timeline import TimelineViewSet
from capacity.api.usage import UsageViewSet
from capacity.api.views import CapacityViewSet

router = SimpleRouter(trailing_slash=False)
router.register("capacity", CapacityViewSet, basename="capacity")
router.register("capacity", PlanningViewSet, basename="capacity-planning")
router.register("capacity", TimelineViewSet, basename="capacity-timeline")
router.register("usage", UsageViewSet, basename="usage")

urlpatterns = router.urls
