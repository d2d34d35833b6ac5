"""Node operations for platform operators, and the node agents' `inventory/report`.

They live in `operations`, above `capacity`, because what they change reaches
every layer below: a report can change a GPU's layout, which books atoms (guard 2).

Every view: validate → decide on the platform → find the node (NOT_FOUND) →
call one service → answer the node or device as it is after the change. A node
agent's credential may be narrowed to a pool's nodes or to one node: its
report and its list are decided on the node found (`core.decisions.NodeScope`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from rest_framework.request import Request
from rest_framework.response import Response

from core.api.rpc import RpcViewSet, rpc_action, rpc_input, rpc_output, rpc_platform_input
from core.api.schema import CURSOR_RULE, Rule
from core.authentication import actor_of, principal_of
from core.decisions import (
    INVENTORY_REPORT,
    NODE_OUT_OF_SCOPE,
    NODES_OPERATE,
    NodeScope,
    decide_node,
    decide_node_scope,
)
from core.errors import InvalidInput, NotFound, PermissionDenied
from inventory.models import Node
from inventory.selectors import device_detail, device_get, devices_detail, node_detail, node_get, node_list
from operations import services as node_actions
from operations.api.serializers import (
    CordonInput,
    DeviceSerializer,
    NodeGetInput,
    NodeInput,
    NodeListInput,
    NodeListOutput,
    NodeSerializer,
    ReportInput,
    ReportOutput,
    SetHealthInput,
    SetMaintenanceInput,
    TaintInput,
    UncordonInput,
    UntaintInput,
)
from reservations.nodes.reports import node_report_apply

OPERATORS_ONLY = "Platform operators only (`compute:nodes:operate`)."
NODE_OPS = OPERATORS_ONLY + " Existing bookings are kept; new placements stop."
TAINT_OPS = NODE_OPS + " A NoSchedule taint puts the node's atoms in the `unhealthy` bucket."


def _operated_node(request: Request, serializer: type[NodeInput]) -> tuple[dict[str, Any], Node]:
    data = rpc_platform_input(request, serializer, permission=NODES_OPERATE)
    return data, node_get(node_id=data["node_id"])


def _node_answer(node: Node) -> Response:
    return rpc_output(NodeSerializer, node_detail(node=node))


def _node_operation(
    method: str,
    serializer: type[NodeInput],
    service: Callable[..., Node],
    summary: str,
    description: str = NODE_OPS,
) -> Callable[[RpcViewSet, Request], Response]:
    """The view of `nodes/<method>`: one `operations.services` node action on the node.

    The body's fields but `nodeId` are the service's keyword arguments (the
    serializer names them so). The view is the viewset's attribute of the
    method's name in snake case; DRF's router checks that the names agree.
    """

    def view(self: RpcViewSet, request: Request) -> Response:
        data, node = _operated_node(request, serializer)
        del data["node_id"]
        return _node_answer(service(node=node, actor=actor_of(request), **data))

    view.__name__ = view.__qualname__ = re.sub(r"(?<!^)(?=[A-Z])", "_", method).lower()
    return rpc_action(
        method, request=serializer, response=NodeSerializer, summary=summary, description=description
    )(view)


# What the node report's schema cannot say (`inventory.reports.report_parse` checks it).
REPORT_RULES = (
    Rule(("report.gpus[].uuid",), "no GPU uuid twice in a report"),
    Rule(("report.disks[].id",), "no disk id twice in a report"),
    Rule(("report.nics[].vfs[]",), "no VF address twice in a report"),
    Rule(("report.nics[].vfs",), "at most 2048 VFs in all the report's NICs"),
    Rule(("report.gpus[].mig.instances[]",), "no MIG instance (gi, ci) twice on a GPU"),
    Rule(("report.gpus[].mig.instances[].memoryMiB",), "a MIG instance fits in its GPU's memoryMiB"),
    Rule(("report.gpus[].mig.instances",), "MIG instances only on a GPU whose MIG is enabled"),
)


class NodesViewSet(RpcViewSet):
    """The nodes group."""

    @rpc_action(
        "get",
        request=NodeGetInput,
        response=NodeSerializer,
        summary="A node with its state, bucket, taints, resources and atoms",
        description=OPERATORS_ONLY,
    )
    def get_node(self, request: Request) -> Response:
        _, node = _operated_node(request, NodeGetInput)
        return _node_answer(node)

    @rpc_action(
        "list",
        request=NodeListInput,
        response=NodeListOutput,
        rules=(CURSOR_RULE,),
        summary="Nodes in hostname order, by pool, bucket, hostname prefix or label",
        description=(
            "Operators (`compute:nodes:operate`) and node agents (`compute:inventory:report`); "
            "a node agent issued for a pool or a node sees only those nodes. "
            "Each node as `nodes/get` answers it, without its atoms; `nextCursor` pages on."
        ),
    )
    def list_nodes(self, request: Request) -> Response:
        data = rpc_input(request, NodeListInput)
        scope = decide_node_scope(
            principal=principal_of(request), permissions=(NODES_OPERATE, INVENTORY_REPORT)
        )
        nodes, next_cursor = node_list(**data, scope=scope)
        return rpc_output(NodeListOutput, {"nodes": nodes, "nextCursor": next_cursor})

    cordon = _node_operation("cordon", CordonInput, node_actions.node_cordon, "Cordon a node")
    uncordon = _node_operation("uncordon", UncordonInput, node_actions.node_uncordon, "Uncordon a node")
    taint = _node_operation("taint", TaintInput, node_actions.node_taint, "Add or replace a taint", TAINT_OPS)
    untaint = _node_operation("untaint", UntaintInput, node_actions.node_untaint, "Remove a taint")
    set_maintenance = _node_operation(
        "setMaintenance",
        SetMaintenanceInput,
        node_actions.node_set_maintenance,
        "Put a node in or out of maintenance",
    )


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
        data = rpc_platform_input(request, SetHealthInput, permission=NODES_OPERATE)
        device = device_get(uid=data["device_uid"])
        device = node_actions.device_set_health(
            device=device, healthy=data["healthy"], reason=data["reason"], actor=actor_of(request)
        )
        return rpc_output(DeviceSerializer, device_detail(device=device))


class InventoryViewSet(RpcViewSet):
    """The inventory group: what node agents send."""

    @rpc_action(
        "report",
        request=ReportInput,
        response=ReportOutput,
        refuses=("CONFLICT",),
        rules=REPORT_RULES,
        summary="A node's hardware report",
        description=(
            "Node agents (platform `node-agent`) and operators (`compute:inventory:report`). "
            "A node agent issued for a pool or a node reports for those nodes only: any other node, "
            "or one that does not exist, is `PERMISSION_DENIED` and nothing changes. "
            "Marks the node connected and records the heartbeat; answers the node's devices. "
            "A malformed report is refused whole."
        ),
    )
    def report(self, request: Request) -> Response:
        data = rpc_input(request, ReportInput)
        scope = decide_node_scope(principal=principal_of(request), permissions=(INVENTORY_REPORT,))
        node = node_in_scope(scope, node_id=data["node_id"])
        try:
            devices = node_report_apply(node=node, report=data["report"], actor=actor_of(request))
        except InvalidInput as exc:
            raise _under_report(exc) from exc
        return rpc_output(ReportOutput, {"nodeId": node.pk, "devices": devices_detail(devices=devices)})


def node_in_scope(scope: NodeScope, *, node_id: str) -> Node:
    """The node, if the credential's scope covers it.

    A narrowed credential gets PERMISSION_DENIED for a node that does not
    exist too, so it learns nothing about nodes beyond its scope; an
    unnarrowed one gets NOT_FOUND, as before.
    """
    try:
        node = node_get(node_id=node_id)
    except NotFound:
        if scope.everywhere:
            raise
        raise PermissionDenied(NODE_OUT_OF_SCOPE) from None
    decide_node(scope, node_id=node.pk, pool_id=node.pool_id)
    return node


def _under_report(exc: InvalidInput) -> InvalidInput:
    """The report's own field paths (`gpus[0].uuid`) as body paths (`report.gpus[0].uuid`)."""
    details = [{**d, "field": f"report.{d['field']}" if d.get("field") else "report"} for d in exc.details]
    if not details:
        return exc
    first = details[0]
    return InvalidInput(f"{first['field']}: {first['message']}", details)
