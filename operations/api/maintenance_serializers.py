"""Input and output of the maintenance window methods: `nodes/planMaintenance`, `scheduleMaintenance`,
`listMaintenance`, `updateMaintenance`, `cancelMaintenance` (docs/contract-additions.md)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rest_framework import serializers

from core.api.fields import (
    StrictBooleanField,
    StrictCharField,
    StrictIntegerField,
    StrictRegexField,
    StrictSerializer,
    node_id_field,
    pool_id_field,
    time_ms_field,
)
from core.clock import to_millis
from core.constants import NODE_ID_REGEX
from operations.api.serializers import REASON_MAX, LabelsField
from reservations.maintenance.selectors import LIST_MAX, MaintenancePlan, NodeImpact, PlannedReservation
from reservations.maintenance.services import MAX_NODES
from reservations.models import MAINTENANCE_WINDOW_ID_REGEX, MaintenanceWindowState


def _node_ids(**kwargs: Any) -> serializers.ListField:
    return serializers.ListField(
        child=StrictRegexField(NODE_ID_REGEX, max_length=57),
        min_length=1,
        max_length=MAX_NODES,
        source="node_ids",
        **kwargs,
    )


def _window_id() -> StrictRegexField:
    return StrictRegexField(MAINTENANCE_WINDOW_ID_REGEX, max_length=57, source="window_id")


def _instant(value: int) -> datetime:
    return datetime.fromtimestamp(value / 1000, tz=UTC)


class _Span(StrictSerializer):
    """`from` and `to` (ms since the epoch; `from` is a Python keyword, so declared in `get_fields`)."""

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        fields["from"] = time_ms_field(help_text="ms since the epoch: the window's start")
        fields["to"] = time_ms_field(help_text="ms since the epoch: the window's end (after `from`)")
        return fields

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        starts, ends = attrs.pop("from"), attrs.pop("to")
        if ends <= starts:
            raise serializers.ValidationError({"to": ["must be after from"]})
        return {**attrs, "starts_at": _instant(starts), "ends_at": _instant(ends)}


class PlanMaintenanceInput(_Span):
    nodeIds = _node_ids(required=False)
    poolId = pool_id_field(required=False)
    selector = LabelsField(
        required=False, help_text="with poolId: the pool's nodes whose labels hold every pair"
    )
    reason = StrictCharField(max_length=REASON_MAX, required=False, default="maintenance")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = super().validate(attrs)
        if bool(attrs.get("node_ids")) == bool(attrs.get("pool_id")):
            raise serializers.ValidationError(
                {"nodeIds": ["give nodeIds, or poolId with an optional selector"]}
            )
        if attrs.get("selector") and not attrs.get("pool_id"):
            raise serializers.ValidationError({"selector": ["a selector needs a poolId"]})
        return attrs


class ScheduleMaintenanceInput(_Span):
    nodeIds = _node_ids()
    reason = StrictCharField(max_length=REASON_MAX, trim_whitespace=True, help_text="the window's name")


class ListMaintenanceInput(StrictSerializer):
    poolId = pool_id_field(required=False)
    nodeId = node_id_field(required=False)
    includeEnded = StrictBooleanField(
        required=False, default=False, help_text="also ended and cancelled windows", source="include_ended"
    )
    limit = StrictIntegerField(min_value=1, max_value=LIST_MAX, required=False, default=100)


class UpdateMaintenanceInput(StrictSerializer):
    windowId = _window_id()

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        fields["to"] = time_ms_field(help_text="the new end: earlier shortens, later extends")
        return fields

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        return {"window_id": attrs["window_id"], "ends_at": _instant(attrs["to"])}


class CancelMaintenanceInput(StrictSerializer):
    windowId = _window_id()
    reason = StrictCharField(max_length=REASON_MAX, required=False, allow_blank=True, default="")


class WindowOutput(serializers.Serializer):
    id = serializers.CharField()
    reason = serializers.CharField()
    state = serializers.ChoiceField(choices=MaintenanceWindowState.values)
    nodeIds = serializers.ListField(child=serializers.CharField())
    createdBy = serializers.CharField()

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        fields["from"] = serializers.IntegerField(help_text="ms since the epoch")
        fields["to"] = serializers.IntegerField(help_text="ms since the epoch")
        return fields


class WindowListOutput(serializers.Serializer):
    windows = WindowOutput(many=True)


class PlannedReservationOutput(serializers.Serializer):
    reservationId = serializers.CharField()
    tenantId = serializers.CharField()
    startsAt = serializers.IntegerField()
    endsAt = serializers.IntegerField()
    toNodeIds = serializers.ListField(child=serializers.CharField(), help_text="moved: the nodes it goes to")
    reason = serializers.CharField(help_text="at risk: why")


class NodeImpactOutput(serializers.Serializer):
    nodeId = serializers.CharField()
    hostname = serializers.CharField()
    running = PlannedReservationOutput(many=True, help_text="running in the window: they would have to end")
    moved = PlannedReservationOutput(many=True, help_text="moved off the window's nodes by BookingRepair")
    stuck = PlannedReservationOutput(many=True, help_text="cannot move: marked at risk")


class TenantCountsOutput(serializers.Serializer):
    tenantId = serializers.CharField()
    running = serializers.IntegerField()
    moved = serializers.IntegerField()
    stuck = serializers.IntegerField()


class PoolLowestOutput(serializers.Serializer):
    poolId = serializers.CharField()
    resource = serializers.CharField()
    lowestAvailable = serializers.IntegerField(help_text="the fewest atoms free at any instant of the window")
    lowestAvailableWithout = serializers.IntegerField(help_text="the same without the window's nodes")


class PlanOutput(serializers.Serializer):
    nodes = NodeImpactOutput(many=True)
    tenants = TenantCountsOutput(many=True)
    pools = PoolLowestOutput(many=True)

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        fields["from"] = serializers.IntegerField()
        fields["to"] = serializers.IntegerField()
        return fields


class ScheduleOutput(serializers.Serializer):
    window = WindowOutput()
    nodes = NodeImpactOutput(many=True)
    tenants = TenantCountsOutput(many=True)


def _planned(r: PlannedReservation) -> dict[str, Any]:
    return {
        "reservationId": r.reservation_id,
        "tenantId": r.tenant_id,
        "startsAt": to_millis(r.starts_at),
        "endsAt": to_millis(r.ends_at),
        "toNodeIds": list(r.to_node_ids),
        "reason": r.reason,
    }


def _node(n: NodeImpact) -> dict[str, Any]:
    return {
        "nodeId": n.node_id,
        "hostname": n.hostname,
        **{group: [_planned(r) for r in getattr(n, group)] for group in ("running", "moved", "stuck")},
    }


def plan_answer(plan: MaintenancePlan) -> dict[str, Any]:
    """The dry run as `nodes/planMaintenance` answers it."""
    return {
        "from": to_millis(plan.starts_at),
        "to": to_millis(plan.ends_at),
        "nodes": [_node(n) for n in plan.nodes],
        "tenants": [
            {"tenantId": t.tenant_id, "running": t.running, "moved": t.moved, "stuck": t.stuck}
            for t in plan.tenants
        ],
        "pools": [
            {
                "poolId": p.pool_id,
                "resource": p.resource,
                "lowestAvailable": p.with_nodes,
                "lowestAvailableWithout": p.without_nodes,
            }
            for p in plan.pools
        ],
    }
