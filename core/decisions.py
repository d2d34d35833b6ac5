"""Permission decisions: on the tenant, on the pool (owned or offered), and on the platform.

A method "decided on the tenant" needs a binding whose role holds the
permission on `tenantId`, or a platform binding of an operator (which covers
every tenant). "Decided on the pool" (`inventory.access`) adds that the pool is owned by or
offered to the tenant.
"""

from __future__ import annotations

from django.db.models import Q

from core.errors import PermissionDenied
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

# Only these roles mean anything on the platform. A platform binding of a
# viewer or member (which `token_issue` refuses, but a hand-made row could
# hold) must not silently cover every tenant.
PLATFORM_ROLES = frozenset({Role.OPERATOR, Role.NODE_AGENT})


# Where `core.authentication` leaves the principal's role bindings, read in
# the same round trip as the token. Set on the per-request `Principal`
# instance only, never cached across requests, so a revoked binding is seen
# by the very next request.
_BINDINGS_ATTR = "_role_bindings"


def principal_bindings_set(principal: Principal, bindings: list[tuple[str, str | None]]) -> None:
    """Attach `(role, tenant_id or None)` pairs, read with the token, to this request's principal."""
    setattr(principal, _BINDINGS_ATTR, frozenset(bindings))


def has_permission(*, principal: Principal, permission: str, tenant_id: str | None) -> bool:
    """Whether one of the principal's bindings grants `permission` on the tenant (None: the platform)."""
    roles = ROLES_HOLDING[permission]
    tenant_scoped = tenant_id is not None and permission not in PLATFORM_ONLY
    bindings: frozenset[tuple[str, str | None]] | None = getattr(principal, _BINDINGS_ATTR, None)
    if bindings is not None:
        # The same rule as the query below, over the bindings authentication read.
        return any(
            (scope is None and role in roles & PLATFORM_ROLES)
            or (tenant_scoped and scope == tenant_id and role in roles)
            for role, scope in bindings
        )
    scope_q = Q(tenant__isnull=True, role__in=roles & PLATFORM_ROLES)
    if tenant_scoped:
        scope_q |= Q(tenant_id=tenant_id, role__in=roles)
    return RoleBinding.objects.filter(scope_q, principal=principal).exists()


def decide_tenant(*, principal: Principal, tenant_id: str, permission: str) -> None:
    """PERMISSION_DENIED unless the principal holds `permission` on `tenant_id`."""
    if not has_permission(principal=principal, permission=permission, tenant_id=tenant_id):
        raise PermissionDenied("the credential does not grant this method on this tenant")


def decide_platform_any(*, principal: Principal, permissions: tuple[str, ...]) -> None:
    """PERMISSION_DENIED unless a platform binding grants one of `permissions`."""
    if not any(has_permission(principal=principal, permission=p, tenant_id=None) for p in permissions):
        raise PermissionDenied("the credential does not grant this method")


def decide_platform(*, principal: Principal, permission: str) -> None:
    """PERMISSION_DENIED unless a platform binding grants `permission`."""
    if not has_permission(principal=principal, permission=permission, tenant_id=None):
        raise PermissionDenied("the credential does not grant this method")
