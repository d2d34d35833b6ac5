"""`capacity/{preview,explain,earliest}`: the placer asked about a reservation request, nothing written.

Each method takes the `reservations/create` body through the one path create
uses, `reservations.request.resolve.reservation_request_resolve` (parse, decide
on the pool, the project, the pool's sharing mode), so preview and create never
disagree on it; then it calls one selector and serializes.
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiExample
from rest_framework.request import Request
from rest_framework.response import Response

from capacity.api.serializers import (
    EARLIEST_HORIZON_DEFAULT_SECONDS,
    EARLIEST_RULES,
    EarliestInput,
    EarliestOutput,
    ExplainInput,
    ExplainNodeInput,
    ExplainOutput,
    PreviewOutput,
    earliest_input_split,
)
from capacity.selectors.planning import capacity_earliest, capacity_explain, capacity_preview
from core.api.rpc import RpcViewSet, rpc_action, rpc_output
from core.authentication import principal_of
from core.decisions import CAPACITY_READ
from reservations.request.resolve import reservation_request_resolve, resolve_refusals
from reservations.request.serializers import RESERVATION_REQUEST_RULES, ReservationRequestSerializer

EXPLAIN_EXAMPLES = [
    OpenApiExample(
        "Why do 4 GPUs with 80 GiB not fit?",
        request_only=True,
        value={
            "tenantId": "acme",
            "poolId": "pool_01hzy5v6k8d9c0m7w3q2r1t4ab",
            "devices": [{"class": "gpu", "count": 4, "selector": {"vramGiB": {"gte": 80}}}],
            "duration": "1h",
            "resources": {"vcpu": 8},
            "idempotencyKey": "why-1",
        },
    ),
    OpenApiExample(
        "Two of six nodes fit",
        response_only=True,
        value={
            "nodes": 6,
            "removed": {
                "notSchedulable": {"maintenance": 1},
                "scalars": 1,
                "selector": 1,
                "noFreeAtoms": 1,
                "topology": 0,
            },
            "fit": 2,
            "samples": {
                "notSchedulable": [
                    {
                        "nodeId": "node_01hzy5v6k8d9c0m7w3q2r1t4cd",
                        "reason": "maintenance; cordoned: RMA 1234",
                    }
                ],
                "scalars": [
                    {
                        "nodeId": "node_01hzy5v6k8d9c0m7w3q2r1t4ce",
                        "reason": "vcpu 60 of 64 claimed, 8 asked",
                    }
                ],
                "selector": [
                    {
                        "nodeId": "node_01hzy5v6k8d9c0m7w3q2r1t4cf",
                        "reason": "0 gpu atoms match the selector, 4 gpu asked",
                    }
                ],
                "noFreeAtoms": [
                    {
                        "nodeId": "node_01hzy5v6k8d9c0m7w3q2r1t4cg",
                        "reason": "3 of 8 free for the window, 4 gpu asked; GPU-3 booked until "
                        "2026-12-01T14:00:00Z",
                    }
                ],
            },
            "preview": {
                "fits": True,
                "start": 1796092200000,
                "end": 1796095800000,
                "candidates": [
                    {
                        "nodeId": "node_01hzy5v6k8d9c0m7w3q2r1t4ch",
                        "atoms": ["GPU-0", "GPU-1"],
                        "score": 0.9,
                    }
                ],
                "reason": None,
                "preemptible": None,
            },
        },
    ),
]


EARLIEST_EXAMPLES = [
    OpenApiExample(
        "A 4x8 gang for a day, within the next week",
        request_only=True,
        value={
            "tenantId": "acme",
            "poolId": "pool_01hzy5v6k8d9c0m7w3q2r1t4ab",
            "devices": [{"class": "gpu", "count": 8}],
            "gang": {"size": 4},
            "duration": "1d",
            "horizon": "7d",
            "idempotencyKey": "plan-2026-12-01",
        },
    ),
    OpenApiExample(
        "It fits in 12 hours",
        response_only=True,
        value={
            "fits": True,
            "start": 1796135400000,
            "end": 1796221800000,
            "candidates": [
                {
                    "nodeId": "node_01hzy5v6k8d9c0m7w3q2r1t4cd",
                    "atoms": ["gpu-0", "gpu-1"],
                    "score": 0.93,
                }
            ],
            "reason": None,
            "searchedFrom": 1796092200000,
            "searchedTo": 1796697000000,
            "instantsTried": 2,
        },
    ),
]


class PlanningViewSet(RpcViewSet):
    """`capacity/preview`, `explain` and `earliest`: the placer on a reservation request, nothing written."""

    @rpc_action(
        "preview",
        request=ReservationRequestSerializer,
        response=PreviewOutput,
        summary="Would a reservation request fit now, and where?",
        description=(
            "The reservations.create input, validated the same way. Nothing is written and no quota is "
            "checked. Up to 10 ranked candidates; with `gang` the members of the best gang; with "
            "`binding: node` the whole nodes. `preemptible` gives how many spot reservations a regular "
            "request would displace and when it would start, never their ids. "
            + resolve_refusals("reservations/create")
        ),
        rules=RESERVATION_REQUEST_RULES,
    )
    def preview(self, request: Request) -> Response:
        resolved = reservation_request_resolve(
            principal=principal_of(request), data=request.data, permission=CAPACITY_READ
        )
        return rpc_output(PreviewOutput, capacity_preview(request=resolved.request, pool=resolved.pool))

    @rpc_action(
        "explain",
        request=ExplainInput,
        response=ExplainOutput,
        summary="Why not: how many nodes each filter of the placer removes, and why",
        description=(
            "The capacity.preview input, plus an optional `nodeId` to explain that one node. Every node of "
            "the pool falls in the first filter that removes it, in the order the placer applies them: "
            "`notSchedulable` (per bucket), `scalars`, `selector` (too few healthy atoms of the class "
            "match), "
            "`noFreeAtoms` (too few of those are free for the window), `topology` (NVLink domain or the "
            "gang's label); the rest `fit`, so the counts add up to `nodes`. Up to 10 nodes per filter "
            "come with the precise reason, naming atoms, counts and times, never a booking or another "
            "tenant's reservation. `preview` is what capacity.preview answers for the same request. "
            + resolve_refusals("reservations/create")
            + " NOT_FOUND too when `nodeId` is not a node of the pool."
        ),
        examples=EXPLAIN_EXAMPLES,
        rules=RESERVATION_REQUEST_RULES,
    )
    def explain(self, request: Request) -> Response:
        body = request.data
        node_id = None
        if isinstance(body, dict) and "nodeId" in body:
            body = dict(body)
            node = ExplainNodeInput(data={"nodeId": body.pop("nodeId")})
            node.is_valid(raise_exception=True)
            node_id = node.validated_data["nodeId"]
        resolved = reservation_request_resolve(
            principal=principal_of(request), data=body, permission=CAPACITY_READ
        )
        answer = capacity_explain(request=resolved.request, pool=resolved.pool, node_id=node_id)
        return rpc_output(ExplainOutput, answer)

    @rpc_action(
        "earliest",
        request=EarliestInput,
        response=EarliestOutput,
        summary="When is the earliest start at which a request fits for its whole duration?",
        description=(
            "The capacity.preview input without `start`, plus `from` (ms; default now) and `horizon` "
            "(seconds or a duration string, at most 30 days; default 7 days). Answers the earliest start "
            "in `[from, from + horizon]` at which the request (gang, selector, binding and scalars "
            "included) fits for its whole `duration` without displacing anyone, with the candidates "
            "capacity.preview would give at that start; or `fits: false` and the reason. The search "
            "looks only at `from` and the instants where a booking of a usable atom ends, so the start "
            "is exact to the millisecond: a create at `start` fits, and nothing earlier does. Nothing is "
            "written and no quota is checked. " + resolve_refusals("reservations/create")
        ),
        examples=EARLIEST_EXAMPLES,
        rules=EARLIEST_RULES,
    )
    def earliest(self, request: Request) -> Response:
        body, search = earliest_input_split(request.data)
        resolved = reservation_request_resolve(
            principal=principal_of(request), data=body, permission=CAPACITY_READ
        )
        answer = capacity_earliest(
            request=resolved.request,
            pool=resolved.pool,
            from_ms=search.get("from"),
            horizon_seconds=search.get("horizon", EARLIEST_HORIZON_DEFAULT_SECONDS),
        )
        return rpc_output(EarliestOutput, answer)
