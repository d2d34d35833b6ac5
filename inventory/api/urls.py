"""Routes of `nodes/*`, `devices/setHealth` and `inventory/report`."""

from __future__ import annotations

from rest_framework.routers import SimpleRouter

from inventory.api.views import DevicesViewSet, InventoryViewSet, NodesViewSet

router = SimpleRouter(trailing_slash=False)
router.register("nodes", NodesViewSet, basename="nodes")
router.register("devices", DevicesViewSet, basename="devices")
router.register("inventory", InventoryViewSet, basename="inventory")

urlpatterns = router.urls
