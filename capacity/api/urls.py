"""Routes of `capacity/*`, `pools/capacity`, `nodes/*`, `devices/setHealth` and `inventory/report`."""

from __future__ import annotations

from rest_framework.routers import SimpleRouter

from capacity.api.nodes import DevicesViewSet, InventoryViewSet, NodesViewSet
from capacity.api.views import CapacityViewSet, PoolsViewSet

router = SimpleRouter(trailing_slash=False)
router.register("capacity", CapacityViewSet, basename="capacity")
router.register("pools", PoolsViewSet, basename="pools")
router.register("nodes", NodesViewSet, basename="nodes")
router.register("devices", DevicesViewSet, basename="devices")
router.register("inventory", InventoryViewSet, basename="inventory")

urlpatterns = router.urls
