"""Node operations for platform operators, and the node agents' `inventory/report`.

They live in `capacity`, the top layer, because what they change reaches every
layer below: a report can change a GPU's layout, which books atoms (guard 2).

Every view: validate → decide on the platform → find the node (NOT_FOUND) →
call one service → answer the node or device as it is after the change.
"""

from __future__ import annotations

from typing import Any

from rest_framework.request import Request
from rest_framework.response import Response

from capacity.api.node_serializers import (
    CordonInput,
    DeviceSerializer,
    NodeGetInput,
    NodeSerializer,
    ReportInput,
    ReportOutput,
    SetHealthInput,
    SetMaintenanceInput,
    TaintInput,
    UncordonInput,
    UntaintInput,
)
from core.api import RpcViewSet, StrictSerializer, rpc_action, rpc_input, rpc_output
from core.authentication import actor_of, principal_of
from core.decisions import INVENTORY_REPORT, NODES_OPERATE, decide_platform
from core.errors import InvalidInput
from inventory import operations
from inventory.models import Node
from inventory.selectors import device_detail, device_get, devices_detail, node_detail, node_get
from reservations.layouts import node_report_apply

NODE_OPS = (
    "Platform operators only (`compute:nodes:operate`). Existing bookings are kept; new placements stop."
)


def _operated_node(request: Request, serializer: type[StrictSerializer]) -> tuple[dict[str, Any], Node]:
    data = rpc_input(request, serializer)
    decide_platform(principal=principal_of(request), permission=NODES_OPERATE)
    return data, node_get(node_id=data["node_id"])


def _node_answer(node: Node) -> Response:
    return rpc_output(NodeSerializer, node_detail(node=node))


class NodesViewSet(RpcViewSet):
    """The nodes group."""

    @rpc_action(
        "get",
        request=NodeGetInput,
        response=NodeSerializer,
        summary="A node with its state, bucket, taints, resources and atoms",
        description="Platform operators only (`compute:nodes:operate`).",
    )
    def get_node(self, request: Request) -> Response:
        _, node = _operated_node(request, NodeGetInput)
        return _node_answer(node)

    @rpc_action(
        "cordon", request=CordonInput, response=NodeSerializer, summary="Cordon a node", description=NODE_OPS
    )
    def cordon(self, request: Request) -> Response:
        data, node = _operated_node(request, CordonInput)
        return _node_answer(operations.node_cordon(node=node, reason=data["reason"], actor=actor_of(request)))

    @rpc_action(
        "uncordon",
        request=UncordonInput,
        response=NodeSerializer,
        summary="Uncordon a node",
        description=NODE_OPS,
    )
    def uncordon(self, request: Request) -> Response:
        data, node = _operated_node(request, UncordonInput)
        return _node_answer(
            operations.node_uncordon(node=node, reason=data["reason"], actor=actor_of(request))
        )

    @rpc_action(
        "taint",
        request=TaintInput,
        response=NodeSerializer,
        summary="Add or replace a taint",
        description=NODE_OPS + " A NoSchedule taint puts the node's atoms in the `unhealthy` bucket.",
    )
    def taint(self, request: Request) -> Response:
        data, node = _operated_node(request, TaintInput)
        node = operations.node_taint(
            node=node,
            key=data["key"],
            value=data["value"],
            effect=data["effect"],
            reason=data["reason"],
            actor=actor_of(request),
        )
        return _node_answer(node)

    @rpc_action(
        "untaint",
        request=UntaintInput,
        response=NodeSerializer,
        summary="Remove a taint",
        description=NODE_OPS,
    )
    def untaint(self, request: Request) -> Response:
        data, node = _operated_node(request, UntaintInput)
        node = operations.node_untaint(
            node=node, key=data["key"], reason=data["reason"], actor=actor_of(request)
        )
        return _node_answer(node)

    @rpc_action(
        "setMaintenance",
        request=SetMaintenanceInput,
        response=NodeSerializer,
        summary="Put a node in or out of maintenance",
        description=NODE_OPS,
    )
    def set_maintenance(self, request: Request) -> Response:
        data, node = _operated_node(request, SetMaintenanceInput)
        node = operations.node_set_maintenance(
            node=node, on=data["on"], reason=data["reason"], actor=actor_of(request)
        )
        return _node_answer(node)


class DevicesViewSet(RpcViewSet):
    """The devices group."""

    @rpc_action(
        "setHealth",
        request=SetHealthInput,
        response=DeviceSerializer,
        summary="Mark a device healthy or unhealthy",
        description=NODE_OPS + " A partitioned GPU's MIG or slot atoms follow their parent.",
    )
    def set_health(self, request: Request) -> Response:
        data = rpc_input(request, SetHealthInput)
        decide_platform(principal=principal_of(request), permission=NODES_OPERATE)
        device = device_get(uid=data["device_uid"])
        device = operations.device_set_health(
            device=device, healthy=data["healthy"], reason=data["reason"], actor=actor_of(request)
        )
        return rpc_output(DeviceSerializer, device_detail(device=device))


class InventoryViewSet(RpcViewSet):
    """The inventory group: what node agents send."""

    @rpc_action(
        "report",
        request=ReportInput,
        response=ReportOutput,
        summary="A node's hardware report",
        description=(
            "Node agents (platform `node-agent`) and operators (`compute:inventory:report`). "
            "Marks the node connected and records the heartbeat; answers the node's devices. "
            "A malformed report is refused whole."
        ),
    )
    def report(self, request: Request) -> Response:
        data = rpc_input(request, ReportInput)
        decide_platform(principal=principal_of(request), permission=INVENTORY_REPORT)
        node = node_get(node_id=data["node_id"])
        try:
            devices = node_report_apply(node=node, report=data["report"], actor=actor_of(request))
        except InvalidInput as exc:
            raise _under_report(exc) from exc
        return rpc_output(ReportOutput, {"nodeId": node.pk, "devices": devices_detail(devices=devices)})


def _under_report(exc: InvalidInput) -> InvalidInput:
    """The report's own field paths (`gpus[0].uuid`) as body paths (`report.gpus[0].uuid`)."""
    details = [{**d, "field": f"report.{d['field']}" if d.get("field") else "report"} for d in exc.details]
    if not details:
        return exc
    first = details[0]
    return InvalidInput(f"{first['field']}: {first['message']}", details)
