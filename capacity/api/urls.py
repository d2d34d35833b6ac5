"""Routes: `capacity/*`, `pools/*`, `offerings/*`, `nodes/*`, `devices/setHealth`, `inventory/report`,
`usage/*`."""

from __future__ import annotations

from rest_framework.routers import SimpleRouter

from capacity.api.management import OfferingsViewSet
from capacity.api.nodes import DevicesViewSet, InventoryViewSet, NodesViewSet
from capacity.api.usage import UsageViewSet
from capacity.api.views import CapacityViewSet, PoolsViewSet

router = SimpleRouter(trailing_slash=False)
router.register("capacity", CapacityViewSet, basename="capacity")
router.register("pools", PoolsViewSet, basename="pools")
router.register("offerings", OfferingsViewSet, basename="offerings")
router.register("nodes", NodesViewSet, basename="nodes")
router.register("devices", DevicesViewSet, basename="devices")
router.register("inventory", InventoryViewSet, basename="inventory")
router.register("usage", UsageViewSet, basename="usage")

urlpatterns = router.urls
