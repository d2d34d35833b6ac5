"""Routes of the capacity reads: `capacity/summary`, `capacity/byPool`, `pools/capacity`."""

from __future__ import annotations

from rest_framework.routers import SimpleRouter

from capacity.api.views import CapacityViewSet, PoolsViewSet

router = SimpleRouter(trailing_slash=False)
router.register("capacity", CapacityViewSet, basename="capacity")
router.register("pools", PoolsViewSet, basename="pools")

urlpatterns = router.urls
