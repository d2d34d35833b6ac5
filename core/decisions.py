"""Permission decisions: on the tenant, and on the pool (owned or offered).

A method "decided on the tenant" needs a binding whose role holds the
permission on `tenantId` (or on the platform). "Decided on the pool" adds that
the pool is owned by or offered to the tenant, else NOT_FOUND; archived pools
are visible to their owner only.
"""

from __future__ import annotations

from django.db.models import Exists, OuterRef, Q

from core.errors import NotFound, PermissionDenied
from core.models import Principal, Role, RoleBinding

CAPACITY_READ = "compute:capacity:read"
RESERVATIONS_READ = "compute:reservations:read"
RESERVATIONS_WRITE = "compute:reservations:write"
NODES_OPERATE = "compute:nodes:operate"
INVENTORY_REPORT = "compute:inventory:report"

ROLES_HOLDING: dict[str, frozenset[str]] = {
    CAPACITY_READ: frozenset({Role.VIEWER, Role.MEMBER, Role.OPERATOR}),
    RESERVATIONS_READ: frozenset({Role.VIEWER, Role.MEMBER, Role.OPERATOR}),
    RESERVATIONS_WRITE: frozenset({Role.MEMBER, Role.OPERATOR}),
    NODES_OPERATE: frozenset({Role.OPERATOR}),
    INVENTORY_REPORT: frozenset({Role.NODE_AGENT, Role.OPERATOR}),
}

# Node operations and node reports act on the platform's machines: only a
# platform binding may grant them.
PLATFORM_ONLY = frozenset({NODES_OPERATE, INVENTORY_REPORT})


def has_permission(*, principal: Principal, permission: str, tenant_id: str | None) -> bool:
    roles = ROLES_HOLDING[permission]
    scope = Q(tenant__isnull=True)
    if tenant_id is not None and permission not in PLATFORM_ONLY:
        scope |= Q(tenant_id=tenant_id)
    return RoleBinding.objects.filter(scope, principal=principal, role__in=roles).exists()


def decide_tenant(*, principal: Principal, tenant_id: str, permission: str) -> None:
    if not has_permission(principal=principal, permission=permission, tenant_id=tenant_id):
        raise PermissionDenied("the credential does not grant this method on this tenant")


def decide_platform(*, principal: Principal, permission: str) -> None:
    if not has_permission(principal=principal, permission=permission, tenant_id=None):
        raise PermissionDenied("the credential does not grant this method")


def visible_pools(*, tenant_id: str):  # type: ignore[no-untyped-def]
    """Pools the tenant owns, or is offered and are not archived."""
    from inventory.models import Offering, Pool

    offered = Exists(Offering.objects.filter(pool=OuterRef("pk"), tenant_id=tenant_id))
    return Pool.objects.filter(Q(owner_id=tenant_id) | (offered & Q(archived_at__isnull=True)))


def decide_pool(*, principal: Principal, tenant_id: str, pool_id: str, permission: str):  # type: ignore[no-untyped-def]
    """Decide on the tenant, then return the pool if the tenant can see it (else NOT_FOUND)."""
    decide_tenant(principal=principal, tenant_id=tenant_id, permission=permission)
    pool = visible_pools(tenant_id=tenant_id).filter(pk=pool_id).first()
    if pool is None:
        raise NotFound("pool not found")
    return pool
