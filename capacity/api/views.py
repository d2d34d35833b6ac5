"""`capacity/summary` and `capacity/byPool` (also `pools/capacity`): rollup reads."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from rest_framework.request import Request
from rest_framework.response import Response

from capacity.api.serializers import ByPoolInput, ByPoolOutput, SummaryInput, SummaryOutput
from capacity.selectors.pools import capacity_summary, pool_capacity, pool_fragmentation
from core.api.fields import StrictSerializer
from core.api.rpc import RpcViewSet, rpc_action, rpc_input, rpc_tenant_input
from core.authentication import principal_of
from core.decisions import CAPACITY_READ
from inventory.models import Pool
from ledger.access import decide_pool

F = TypeVar("F", bound=Callable[..., Any])


def pool_read_input(request: Request, serializer: type[StrictSerializer]) -> tuple[dict[str, Any], Pool]:
    """Validate a `{tenantId, poolId, ...}` body and decide capacity read on the pool.

    NOT_FOUND when the pool is not visible to the tenant (`decide_pool`).
    """
    data = rpc_input(request, serializer)
    pool = decide_pool(
        principal=principal_of(request),
        tenant_id=data["tenant_id"],
        pool_id=data["pool_id"],
        permission=CAPACITY_READ,
    )
    return data, pool


def by_pool_answer(request: Request) -> Response:
    _, pool = pool_read_input(request, ByPoolInput)
    # The selector already answers in the contract's shape (plain ints and
    # strings), so the output serializer only documents it (OpenAPI): walking
    # every row through DRF fields again would cost more than the query.
    answer = pool_capacity(pool_id=pool.pk)
    answer["fragmentation"] = pool_fragmentation(pool_id=pool.pk, sharing=pool.sharing)
    return Response(answer)


BY_POOL_DESCRIPTION = (
    "One pool's rollup rows, one per resource, ordered by resource name. `available` is conservative: "
    "an atom booked now and again later counts in both `allocated` and `reserved`. "
    "`atRiskReservations` counts the pool's live reservations (every tenant's) that BookingRepair could "
    "not move off a node or atom that left the schedulable set. `fragmentation` says, per value of the "
    "node label `fabric`, how many schedulable nodes have atoms of the pool's GPU class, how many of them "
    "have none booked now, how many of those hold eight or more whole GPUs (the largest gang of whole "
    "8-GPU nodes that would fit now; every free node in a MIG or time-slice pool) and how many free atoms "
    "sit on partly booked nodes (stranded). NOT_FOUND when the "
    "pool is not owned by or offered to the tenant, or is archived and the tenant is not its owner."
)


def by_pool_action(method: str, summary: str) -> Callable[[F], F]:
    """`capacity/byPool` and `pools/capacity`: one method under two names."""
    return rpc_action(
        method, request=ByPoolInput, response=ByPoolOutput, summary=summary, description=BY_POOL_DESCRIPTION
    )


class CapacityViewSet(RpcViewSet):
    """The capacity group."""

    @rpc_action(
        "summary",
        request=SummaryInput,
        response=SummaryOutput,
        summary="Every pool the tenant owns or is offered, with rollup rows and whole-GPU totals per model",
        description=(
            "Archived pools appear only for their owner. `byGpuModel` sums only each pool's `gpu` row; "
            "a pool without a GPU model is counted under `other`. Decided on the tenant."
        ),
    )
    def summary(self, request: Request) -> Response:
        data = rpc_tenant_input(request, SummaryInput, permission=CAPACITY_READ)
        # Already in the contract's shape; see `_by_pool`.
        return Response(capacity_summary(tenant_id=data["tenant_id"]))

    @by_pool_action("byPool", "One pool's rollup rows")
    def by_pool(self, request: Request) -> Response:
        return by_pool_answer(request)
