"""Pool and offering management for platform operators: `pools/*` (but `pools/capacity`) and `offerings/*`.

Every view: validate → decide (operators on the platform, `compute:pools:manage`;
`offerings/list` also for a tenant's own offerings) → find the pool
(NOT_FOUND) → call one service → answer the pool or offering as it is after
the change. The services are the ones fleet files use (`inventory.services.pools`,
`ledger.services.offerings`); each audits its change with
the actor, and a change that would break a rule is refused whole.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import transaction
from drf_spectacular.utils import OpenApiExample
from rest_framework.request import Request
from rest_framework.response import Response

from capacity.api.views import by_pool_action, by_pool_answer
from core.api.rpc import RpcViewSet, rpc_action, rpc_input, rpc_platform_input
from core.api.schema import CURSOR_RULE, Rule
from core.authentication import actor_of, principal_of
from core.decisions import CAPACITY_READ, POOLS_MANAGE, decide_platform, decide_tenant
from inventory.services.pools import (
    pool_create,
    pool_find,
    pool_payload,
    pool_set_archived,
    pool_update,
    pools_list,
)
from ledger.models import Offering
from ledger.selectors import offering_find, offerings_list, offerings_payload
from ledger.services.offerings import offering_create, offering_update, offering_withdraw
from operations.api.serializers import (
    OfferingCreateInput,
    OfferingInput,
    OfferingListInput,
    OfferingListOutput,
    OfferingOutput,
    OfferingUpdateInput,
    PoolCreateInput,
    PoolInput,
    PoolListInput,
    PoolListOutput,
    PoolOutput,
    PoolUpdateInput,
    WithdrawnOutput,
)
from reservations.selectors import reservations_live_count

OPERATORS = "Platform operators only (`compute:pools:manage`). Audited with the caller as the actor."
EXAMPLE_POOL_ID = "pool_01hzy5v6k8d9c0m7w3q2r1t4ab"
EXAMPLE_POOL = {
    "poolId": EXAMPLE_POOL_ID,
    "ownerTenantId": "acme",
    "name": "h100-east",
    "gpuModel": "H100",
    "sharing": "exclusive",
    "slotsPerGpu": None,
    "noticeSeconds": 30,
    "labels": {"region": "us-east"},
    "gangTopologyKey": "fabric",
    "archived": False,
    "archivedAt": None,
    "apiChangedAt": 1764547200000,
}
EXAMPLE_OFFERING = {
    "poolId": EXAMPLE_POOL_ID,
    "poolName": "h100-east",
    "ownerTenantId": "acme",
    "tenantId": "beta",
    "quota": [{"resource": "gpu", "max": 16, "used": 4, "mode": "concurrent"}],
}


def _answer_pool(pool: Any, status: int = 200) -> Response:
    return Response(pool_payload(pool), status=status)


def _answer_offering(pool_id: str, tenant_id: str, status: int = 200) -> Response:
    offering = offering_find(pool_id=pool_id, tenant_id=tenant_id)
    return Response(offerings_payload([offering])[0], status=status)


def _set_offering(
    request: Request,
    serializer: type[OfferingInput],
    service: Callable[..., Offering],
    status: int = 200,
) -> Response:
    """`offerings/create` and `update`: the service on the locked pool, then the offering as it is."""
    data = rpc_platform_input(request, serializer, permission=POOLS_MANAGE)
    pool_id, tenant_id, actor = data["pool_id"], data["tenant_id"], actor_of(request)
    with transaction.atomic():
        pool = pool_find(pool_id=pool_id, lock=True)
        service(pool=pool, tenant_id=tenant_id, quota=data["quota"], mode=data.get("quota_mode"), actor=actor)
    return _answer_offering(pool_id, tenant_id, status=status)


SLOTS_RULE = Rule(
    ("slotsPerGpu",),
    "`slotsPerGpu` is required for a timeslice or mps pool and refused for the others",
)
OWNER_RULE = Rule(("ownerTenantId",), "`ownerTenantId` names a tenant that exists")
OFFER_RULE = Rule(("tenantId",), "`tenantId` names a tenant that exists and is not the pool's owner")


class PoolManagementMixin:
    """`pools/create`, `update`, `archive`, `unarchive` and `list`, mixed into the pools group."""

    @rpc_action(
        "create",
        request=PoolCreateInput,
        response=PoolOutput,
        status=201,
        refuses=("CONFLICT",),
        rules=(SLOTS_RULE, OWNER_RULE),
        summary="Create a pool for an owner tenant",
        description=OPERATORS
        + " CONFLICT when the owner already has a pool of that name; `slotsPerGpu` is required for "
        "`timeslice` and `mps` pools and refused otherwise. Nodes join it through fleet files and reports.",
        examples=[
            OpenApiExample(
                "An exclusive H100 pool",
                request_only=True,
                value={
                    "ownerTenantId": "acme",
                    "name": "h100-east",
                    "gpuModel": "H100",
                    "labels": {"region": "us-east"},
                },
            ),
            OpenApiExample("The pool", response_only=True, status_codes=["201"], value=EXAMPLE_POOL),
        ],
    )
    def create_pool(self, request: Request) -> Response:
        data = rpc_platform_input(request, PoolCreateInput, permission=POOLS_MANAGE)
        with transaction.atomic():
            pool = pool_create(actor=actor_of(request), **data)
        return _answer_pool(pool, status=201)

    @rpc_action(
        "update",
        request=PoolUpdateInput,
        response=PoolOutput,
        refuses=("CONFLICT",),
        rules=(SLOTS_RULE,),
        summary="Change a pool's name, GPU model, labels, notice period, gang topology key or sharing mode",
        description=OPERATORS
        + " Only the fields given change. `sharing` may change only while none of the pool's GPU atoms "
        "is of a class the new mode cannot book (CONFLICT otherwise); `slotsPerGpu` goes with it. A name "
        "the owner already uses is CONFLICT. Fleet files leave a pool changed here as it is.",
        examples=[
            OpenApiExample(
                "Longer spot notice and a region label",
                request_only=True,
                value={"poolId": EXAMPLE_POOL_ID, "noticeSeconds": 120, "labels": {"region": "us-east"}},
            ),
            OpenApiExample("The pool", response_only=True, value=EXAMPLE_POOL),
        ],
    )
    def update_pool(self, request: Request) -> Response:
        data = rpc_platform_input(request, PoolUpdateInput, permission=POOLS_MANAGE)
        pool_id = data.pop("pool_id")
        with transaction.atomic():
            pool = pool_update(pool_id=pool_id, changes=data, actor=actor_of(request))
        return _answer_pool(pool)

    @rpc_action(
        "archive",
        request=PoolInput,
        response=PoolOutput,
        summary="Archive a pool: visible to its owner only, no new reservation",
        description=OPERATORS
        + " Reservations already made keep running; their tenants can still get, renew and release "
        "them. Offerings and quotas stay, for an unarchive. Archiving an archived pool changes nothing.",
        examples=[OpenApiExample("Archive", request_only=True, value={"poolId": EXAMPLE_POOL_ID})],
    )
    def archive(self, request: Request) -> Response:
        return self._set_archived(request, archived=True)

    @rpc_action(
        "unarchive",
        request=PoolInput,
        response=PoolOutput,
        summary="Unarchive a pool: its offerings are visible again",
        description=OPERATORS,
        examples=[OpenApiExample("Unarchive", request_only=True, value={"poolId": EXAMPLE_POOL_ID})],
    )
    def unarchive(self, request: Request) -> Response:
        return self._set_archived(request, archived=False)

    def _set_archived(self, request: Request, *, archived: bool) -> Response:
        data = rpc_platform_input(request, PoolInput, permission=POOLS_MANAGE)
        with transaction.atomic():
            pool = pool_set_archived(pool_id=data["pool_id"], archived=archived, actor=actor_of(request))
        return _answer_pool(pool)

    @rpc_action(
        "list",
        request=PoolListInput,
        response=PoolListOutput,
        rules=(CURSOR_RULE,),
        summary="Pools in creation order, by owner and archived state",
        description=OPERATORS.split(" Audited")[0] + " `nextCursor` pages on (pass it as `cursor`).",
        examples=[
            OpenApiExample("acme's pools", request_only=True, value={"ownerTenantId": "acme", "limit": 50}),
            OpenApiExample(
                "One page", response_only=True, value={"pools": [EXAMPLE_POOL], "nextCursor": None}
            ),
        ],
    )
    def list_pools(self, request: Request) -> Response:
        data = rpc_platform_input(request, PoolListInput, permission=POOLS_MANAGE)
        limit = data["limit"]
        pools = list(
            pools_list(
                owner_id=data.get("owner_id"),
                archived=data["archived"],
                after=data.get("cursor"),
                limit=limit + 1,
            )
        )
        more = len(pools) > limit
        pools = pools[:limit]
        return Response(
            {"pools": [pool_payload(pool) for pool in pools], "nextCursor": pools[-1].pk if more else None}
        )


class OfferingsViewSet(RpcViewSet):
    """The offerings group."""

    @rpc_action(
        "create",
        request=OfferingCreateInput,
        response=OfferingOutput,
        status=201,
        refuses=("CONFLICT",),
        rules=(OFFER_RULE,),
        summary="Offer a pool to a tenant, with a quota per resource",
        description=OPERATORS
        + " `quota` maps a resource (`gpu`, `gpu.mig`, `gpu.slot`, scalars) to its limit; a resource "
        "without one is unlimited. `quotaMode` `counter` (default) limits the sum of what the tenant "
        "holds, `concurrent` what it holds at any instant. CONFLICT when the pool is already offered to "
        "the tenant; INVALID_INPUT for the pool's owner or an unknown tenant.",
        examples=[
            OpenApiExample(
                "16 GPUs at a time",
                request_only=True,
                value={
                    "poolId": EXAMPLE_POOL_ID,
                    "tenantId": "beta",
                    "quota": {"gpu": 16},
                    "quotaMode": "concurrent",
                },
            ),
            OpenApiExample("The offering", response_only=True, status_codes=["201"], value=EXAMPLE_OFFERING),
        ],
    )
    def create_offering(self, request: Request) -> Response:
        return _set_offering(request, OfferingCreateInput, offering_create, status=201)

    @rpc_action(
        "update",
        request=OfferingUpdateInput,
        response=OfferingOutput,
        refuses=("CONFLICT",),
        summary="Change an offering's limits, or the mode of its quota",
        description=OPERATORS
        + " The resources named in `quota` get the limit given (`null` removes the limit); the others "
        "keep theirs. `quotaMode` switches every limit of the offering. A `counter` limit below what the "
        "tenant holds now is refused (CONFLICT, details name each resource with its `used`), and nothing "
        "changes; a `concurrent` limit may be lowered: what is held stays, new reservations are refused "
        "where their window's peak would pass it.",
        examples=[
            OpenApiExample(
                "Raise the GPUs, drop the vCPU limit",
                request_only=True,
                value={"poolId": EXAMPLE_POOL_ID, "tenantId": "beta", "quota": {"gpu": 32, "vcpu": None}},
            ),
            OpenApiExample("The offering", response_only=True, value=EXAMPLE_OFFERING),
        ],
    )
    def update_offering(self, request: Request) -> Response:
        return _set_offering(request, OfferingUpdateInput, offering_update)

    @rpc_action(
        "withdraw",
        request=OfferingInput,
        response=WithdrawnOutput,
        refuses=("CONFLICT",),
        summary="Withdraw an offering and its quota",
        description=OPERATORS
        + " CONFLICT while the tenant holds live (scheduled or active) reservations in the pool: they "
        "are released, or end, first. NOT_FOUND when the pool is not offered to the tenant.",
        examples=[
            OpenApiExample(
                "Withdraw", request_only=True, value={"poolId": EXAMPLE_POOL_ID, "tenantId": "beta"}
            ),
            OpenApiExample(
                "Withdrawn",
                response_only=True,
                value={"poolId": EXAMPLE_POOL_ID, "tenantId": "beta", "withdrawn": True},
            ),
        ],
    )
    def withdraw(self, request: Request) -> Response:
        data = rpc_platform_input(request, OfferingInput, permission=POOLS_MANAGE)
        with transaction.atomic():
            pool = pool_find(pool_id=data["pool_id"], lock=True)
            offering_withdraw(
                pool=pool,
                tenant_id=data["tenant_id"],
                actor=actor_of(request),
                live_reservations=lambda: reservations_live_count(
                    pool_id=pool.pk, tenant_id=data["tenant_id"]
                ),
            )
        return Response({"poolId": pool.pk, "tenantId": data["tenant_id"], "withdrawn": True})

    @rpc_action(
        "list",
        request=OfferingListInput,
        response=OfferingListOutput,
        summary="Offerings with their quotas: a tenant's own, or (operators) any pool's",
        description=(
            "With `tenantId`: the offerings made to that tenant, decided on the tenant "
            "(`compute:capacity:read`: viewer, member, operator); archived pools are left out, as they "
            "are visible to their owner only. Without it: operators only (`compute:pools:manage`), every "
            "offering, or one pool's with `poolId`. At most 1,000, in (pool, tenant) order."
        ),
        examples=[
            OpenApiExample("beta's offerings", request_only=True, value={"tenantId": "beta"}),
            OpenApiExample("The offerings", response_only=True, value={"offerings": [EXAMPLE_OFFERING]}),
        ],
    )
    def list_offerings(self, request: Request) -> Response:
        data = rpc_input(request, OfferingListInput)
        principal = principal_of(request)
        if "tenant_id" in data:
            decide_tenant(principal=principal, tenant_id=data["tenant_id"], permission=CAPACITY_READ)
        else:
            decide_platform(principal=principal, permission=POOLS_MANAGE)
        offerings = offerings_list(tenant_id=data.get("tenant_id"), pool_id=data.get("pool_id"))
        return Response({"offerings": offerings_payload(offerings)})


class PoolsViewSet(PoolManagementMixin, RpcViewSet):
    """The pools group: `pools/capacity` answers exactly as `capacity/byPool`; the rest is management."""

    @by_pool_action("capacity", "One pool's rollup rows (same as capacity.byPool)")
    def capacity(self, request: Request) -> Response:
        return by_pool_answer(request)
