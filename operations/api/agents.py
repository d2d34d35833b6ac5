"""The node agent's methods: `nodes/register`, `nodes/heartbeat`, `nodes/assignments`, `nodes/ack`.

A node agent (`better-compute-agent`) registers its host once, reports
(`inventory/report`), heartbeats between reports, and pulls its node's
assignment changes, answering each. Each is decided on the node (or, for
`register`, on the pool) with the credential's node scope, as `inventory/report` is.
"""

from __future__ import annotations

from django.conf import settings
from rest_framework.request import Request
from rest_framework.response import Response

from core.api.rpc import RpcViewSet, rpc_action, rpc_input, rpc_output
from core.api.schema import Rule
from core.authentication import actor_of, principal_of
from core.decisions import INVENTORY_REPORT, decide_node, decide_node_scope
from inventory.models import Node
from inventory.services.agents import node_agent_register, node_heartbeat
from inventory.services.pools import pool_find
from operations.api.agent_serializers import (
    AckInput,
    AckOutput,
    AssignmentsInput,
    AssignmentsOutput,
    HeartbeatOutput,
    RegisterInput,
    RegisterOutput,
)
from operations.api.nodes import node_in_scope
from operations.api.serializers import NodeInput
from reservations.delivery.agent import node_change_answer, node_changes_wait

AGENTS = "Node agents (platform `node-agent`, `compute:inventory:report`) and operators."

# What the document cannot say of an ack: a refusal has no placement.
PLACEMENT_RULE = Rule(("placement",), "a placement comes only with `accepted: true`")


class NodeAgentViewSet(RpcViewSet):
    """The node agent's half of the nodes group."""

    @rpc_action(
        "register",
        request=RegisterInput,
        response=RegisterOutput,
        refuses=("CONFLICT",),
        summary="Register a host: its node id, the same every time for the same hostname",
        description=AGENTS
        + " A credential narrowed to a pool registers hosts in that pool only. A new node joins as "
        "`discovered` (the provisioning bucket) until its first report; from then on its assignments "
        "go to its agent. CONFLICT when the hostname is registered in another pool.",
    )
    def register(self, request: Request) -> Response:
        data = rpc_input(request, RegisterInput)
        scope = decide_node_scope(principal=principal_of(request), permissions=(INVENTORY_REPORT,))
        # No node yet: only a credential that covers the whole pool may add one to it.
        decide_node(scope, node_id="", pool_id=data["pool_id"])
        pool = pool_find(pool_id=data["pool_id"])
        node, created = node_agent_register(
            pool=pool, hostname=data["hostname"], labels=data["labels"], actor=actor_of(request)
        )
        answer = {
            "nodeId": node.pk,
            "poolId": pool.pk,
            "hostname": node.hostname,
            "created": created,
            "assignmentsUrl": settings.AGENT_ASSIGNMENTS_URL,
        }
        return rpc_output(RegisterOutput, answer, status=201 if created else 200)

    @rpc_action(
        "heartbeat",
        request=NodeInput,
        response=HeartbeatOutput,
        summary="The agent is alive (between reports)",
        description=AGENTS + " One statement on the server. `connected: false` asks for a full report.",
    )
    def heartbeat(self, request: Request) -> Response:
        node = self._node(request, NodeInput)
        return rpc_output(HeartbeatOutput, {"nodeId": node.pk, "connected": node_heartbeat(node_id=node.pk)})

    @rpc_action(
        "assignments",
        request=AssignmentsInput,
        response=AssignmentsOutput,
        summary="The node's assignment changes after `after`, in order (a long poll)",
        description=AGENTS
        + " Also the agent's heartbeat: `connected: false` (no changes) asks for a full report first. "
        "Up to 100 changes with a `deliveryId` above `after`; with none yet, waits up to `waitMs` "
        "(at most 30 s) for one. An `assign` carries the atoms, window, scalar claims and node profile "
        "as booked now; a `shorten` the new window (`end == start`: nothing is left). Each change stays "
        "until the agent answers it with nodes/ack.",
    )
    def assignments(self, request: Request) -> Response:
        data = rpc_input(request, AssignmentsInput)
        node = self._found(request, data["node_id"])
        # The poll is the agent's proof of life too: a polling agent sends no heartbeat.
        if not node_heartbeat(node_id=node.pk):
            return rpc_output(AssignmentsOutput, {"nodeId": node.pk, "connected": False, "changes": []})
        changes = node_changes_wait(node_id=node.pk, after=data["after"], wait_ms=data["wait_ms"])
        return rpc_output(AssignmentsOutput, {"nodeId": node.pk, "connected": True, "changes": changes})

    @rpc_action(
        "ack",
        request=AckInput,
        response=AckOutput,
        rules=(PLACEMENT_RULE,),
        summary="The node's answer to one change: accepted, or refused with the reason (guard 6)",
        description=AGENTS
        + " A refused `assign` releases the reservation, as a refusal from any node does. The first "
        "answer stands; answering again is answered with it. An accepted `assign` may carry the "
        "`placement` the node gave the workload, kept on the reservation's allocation on that node "
        "(INVALID_INPUT with `accepted: false`). NOT_FOUND for a change of another node.",
    )
    def ack(self, request: Request) -> Response:
        data = rpc_input(request, AckInput)
        node = self._found(request, data["node_id"])
        answer = node_change_answer(
            node_id=node.pk,
            delivery_id=data["delivery_id"],
            accepted=data["accepted"],
            reason=data["reason"],
            placement=data.get("placement"),
        )
        return rpc_output(
            AckOutput,
            {"deliveryId": answer.delivery_id, "accepted": answer.accepted, "reason": answer.reason},
        )

    def _node(self, request: Request, serializer: type[NodeInput]) -> Node:
        data = rpc_input(request, serializer)
        return self._found(request, data["node_id"])

    def _found(self, request: Request, node_id: str) -> Node:
        """The node, if the credential's node scope covers it (PERMISSION_DENIED otherwise)."""
        scope = decide_node_scope(principal=principal_of(request), permissions=(INVENTORY_REPORT,))
        return node_in_scope(scope, node_id=node_id)
