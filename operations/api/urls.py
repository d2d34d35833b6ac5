"""Routes: the operator's and the node agent's methods: `pools/*`, `offerings/*`, `nodes/*`,
`devices/setHealth`, `inventory/report`."""

from __future__ import annotations

from rest_framework.routers import SimpleRouter

from operations.api.agents import NodeAgentViewSet
from operations.api.maintenance import MaintenanceViewSet
from operations.api.nodes import DevicesViewSet, InventoryViewSet, NodesViewSet
from operations.api.pools import OfferingsViewSet, PoolsViewSet

router = SimpleRouter(trailing_slash=False)
router.register("pools", PoolsViewSet, basename="pools")
router.register("offerings", OfferingsViewSet, basename="offerings")
router.register("nodes", NodesViewSet, basename="nodes")
# The node agent's `nodes/register`, `heartbeat`, `assignments` and `ack`.
router.register("nodes", NodeAgentViewSet, basename="node-agents")
# Maintenance planned ahead: `nodes/planMaintenance`, `scheduleMaintenance`, `listMaintenance`, ...
router.register("nodes", MaintenanceViewSet, basename="node-maintenance")
router.register("devices", DevicesViewSet, basename="devices")
router.register("inventory", InventoryViewSet, basename="inventory")

urlpatterns = router.urls
