"""Maintenance planned ahead, for platform operators: `nodes/planMaintenance` (the dry run),
`nodes/scheduleMaintenance`, `nodes/listMaintenance`, `nodes/updateMaintenance` (shorten or extend)
and `nodes/cancelMaintenance`.

Every view: validate → decide on the platform (`compute:nodes:operate`) → call one
service or selector of `reservations.maintenance` → answer.
"""

from __future__ import annotations

from rest_framework.request import Request
from rest_framework.response import Response

from core.api.rpc import RpcViewSet, rpc_action, rpc_output, rpc_platform_input
from core.api.schema import Rule
from core.authentication import actor_of
from core.decisions import NODES_OPERATE
from operations.api.maintenance_serializers import (
    CancelMaintenanceInput,
    ListMaintenanceInput,
    PlanMaintenanceInput,
    PlanOutput,
    ScheduleMaintenanceInput,
    ScheduleOutput,
    UpdateMaintenanceInput,
    WindowListOutput,
    WindowOutput,
    plan_answer,
)
from reservations.maintenance import selectors, services

OPERATORS_ONLY = "Platform operators only (`compute:nodes:operate`)."
SPAN_RULES = (
    Rule(("to",), "`to` is after `from` and in the future"),
    Rule(("nodeIds",), "every node exists (NOT_FOUND names the first that does not)"),
)


class MaintenanceViewSet(RpcViewSet):
    """The nodes group's maintenance window methods."""

    @rpc_action(
        "planMaintenance",
        request=PlanMaintenanceInput,
        response=PlanOutput,
        refuses=("CONFLICT",),
        rules=(
            *SPAN_RULES,
            Rule(("nodeIds", "poolId"), "exactly one of nodeIds and poolId"),
            Rule(("selector",), "a selector needs a poolId, and some node of the pool matches it"),
        ),
        summary="What a maintenance window would do, without doing it",
        description=(
            OPERATORS_ONLY + " Writes nothing. Per node, the reservations the window touches: `running` "
            "(would have to end), `moved` (BookingRepair would move them, with where to), `stuck` (cannot "
            "move: would be marked at risk); counts per tenant; per pool and atom resource the lowest "
            "`available` during the window with and without the nodes. The same numbers as "
            "`nodes/scheduleMaintenance` then produces on the same state."
        ),
    )
    def plan_maintenance(self, request: Request) -> Response:
        data = rpc_platform_input(request, PlanMaintenanceInput, permission=NODES_OPERATE)
        node_ids = selectors.maintenance_nodes_resolve(
            node_ids=data.get("node_ids"), pool_id=data.get("pool_id"), labels=data.get("selector")
        )
        plan = selectors.maintenance_plan(
            node_ids=node_ids,
            starts_at=data["starts_at"],
            ends_at=data["ends_at"],
            reason=data["reason"] or "maintenance",
            actor=actor_of(request),
        )
        return rpc_output(PlanOutput, plan_answer(plan))

    @rpc_action(
        "scheduleMaintenance",
        request=ScheduleMaintenanceInput,
        response=ScheduleOutput,
        status=201,
        refuses=("CONFLICT",),
        rules=(*SPAN_RULES, Rule(("nodeIds",), "no other live window holds one of the nodes then")),
        summary="Book a maintenance window on nodes",
        description=(
            OPERATORS_ONLY + " Holds every atom of the nodes for `[from, to)`: no tenant booking can enter "
            'it. Future reservations inside are moved at once, or marked at risk ("maintenance window '
            '…"); running ones are marked at risk. The nodes go into maintenance at `from` and out at `to`.'
        ),
    )
    def schedule_maintenance(self, request: Request) -> Response:
        data = rpc_platform_input(request, ScheduleMaintenanceInput, permission=NODES_OPERATE)
        impact = services.maintenance_schedule(
            node_ids=data["node_ids"],
            starts_at=data["starts_at"],
            ends_at=data["ends_at"],
            reason=data["reason"],
            actor=actor_of(request),
        )
        answer = plan_answer(selectors.impact_plan(impact))
        body = {"window": selectors.window_detail(impact.window), **answer}
        return rpc_output(ScheduleOutput, body, status=201)

    @rpc_action(
        "listMaintenance",
        request=ListMaintenanceInput,
        response=WindowListOutput,
        summary="Maintenance windows by start",
        description=OPERATORS_ONLY + " The live ones (scheduled, active) unless `includeEnded`.",
    )
    def list_maintenance(self, request: Request) -> Response:
        data = rpc_platform_input(request, ListMaintenanceInput, permission=NODES_OPERATE)
        windows = selectors.maintenance_list(
            pool_id=data.get("pool_id"),
            node_id=data.get("node_id"),
            live=not data["include_ended"],
            limit=data["limit"],
        )
        return rpc_output(WindowListOutput, {"windows": [selectors.window_detail(w) for w in windows]})

    @rpc_action(
        "updateMaintenance",
        request=UpdateMaintenanceInput,
        response=WindowOutput,
        refuses=("CONFLICT",),
        summary="Shorten or extend a maintenance window",
        description=(
            OPERATORS_ONLY + " An earlier `to` gives the atoms back from then on; a later one is refused "
            "(CONFLICT naming it) where the extension meets a booking."
        ),
    )
    def update_maintenance(self, request: Request) -> Response:
        data = rpc_platform_input(request, UpdateMaintenanceInput, permission=NODES_OPERATE)
        window = services.maintenance_update(
            window_id=data["window_id"], ends_at=data["ends_at"], actor=actor_of(request)
        )
        return rpc_output(WindowOutput, selectors.window_detail(window))

    @rpc_action(
        "cancelMaintenance",
        request=CancelMaintenanceInput,
        response=WindowOutput,
        refuses=("CONFLICT",),
        summary="Cancel a maintenance window",
        description=(
            OPERATORS_ONLY + " The atoms are given back from now on; nodes the window put in maintenance "
            "come out of it."
        ),
    )
    def cancel_maintenance(self, request: Request) -> Response:
        data = rpc_platform_input(request, CancelMaintenanceInput, permission=NODES_OPERATE)
        window = services.maintenance_cancel(
            window_id=data["window_id"], actor=actor_of(request), reason=data["reason"]
        )
        return rpc_output(WindowOutput, selectors.window_detail(window))
