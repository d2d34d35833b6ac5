"""Permission decisions: on the tenant, on the pool (owned or offered), and on the platform.

A method "decided on the tenant" needs a binding whose role holds the
permission on `tenantId`, or a platform binding of an operator (which covers
every tenant). "Decided on the pool" (`ledger.access`) adds that the pool is owned by or
offered to the tenant. "Decided on a node" (`decide_node_scope`, then
`decide_node`) is the platform decision of node agents, whose binding may be
narrowed to one pool's nodes or to one node.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from core.errors import PermissionDenied
from core.models import Principal, Role, RoleBinding

CAPACITY_READ = "compute:capacity:read"
RESERVATIONS_READ = "compute:reservations:read"
RESERVATIONS_WRITE = "compute:reservations:write"
NODES_OPERATE = "compute:nodes:operate"
INVENTORY_REPORT = "compute:inventory:report"
# Pools and offerings: create, change, archive, withdraw (`pools/*`, `offerings/*`).
POOLS_MANAGE = "compute:pools:manage"
# The Prometheus scrape (`GET /metrics`): the fleet's numbers, every tenant's pools among them.
METRICS_READ = "compute:metrics:read"

# The permissions whose methods change something: counted against the write rate limits.
WRITE_PERMISSIONS = frozenset({RESERVATIONS_WRITE})

ROLES_HOLDING: dict[str, frozenset[str]] = {
    CAPACITY_READ: frozenset({Role.VIEWER, Role.MEMBER, Role.OPERATOR}),
    RESERVATIONS_READ: frozenset({Role.VIEWER, Role.MEMBER, Role.OPERATOR}),
    RESERVATIONS_WRITE: frozenset({Role.MEMBER, Role.OPERATOR}),
    NODES_OPERATE: frozenset({Role.OPERATOR}),
    INVENTORY_REPORT: frozenset({Role.NODE_AGENT, Role.OPERATOR}),
    POOLS_MANAGE: frozenset({Role.OPERATOR}),
    METRICS_READ: frozenset({Role.METRICS}),
}

# Node operations and node reports act on the platform's machines: only a
# platform binding may grant them.
PLATFORM_ONLY = frozenset({NODES_OPERATE, INVENTORY_REPORT, POOLS_MANAGE, METRICS_READ})

# Only these roles mean anything on the platform. A platform binding of a
# viewer or member (which `token_issue` refuses, but a hand-made row could
# hold) must not silently cover every tenant.
PLATFORM_ROLES = frozenset({Role.OPERATOR, Role.NODE_AGENT, Role.METRICS})

# The answer for a node outside a narrowed credential's scope, and for one that
# does not exist: a node agent learns nothing about nodes it was not issued for.
NODE_OUT_OF_SCOPE = "the credential does not grant this method on this node"


# Where `core.authentication` leaves the principal's role bindings, read in
# the same round trip as the token. Set on the per-request `Principal`
# instance only, never cached across requests, so a revoked binding is seen
# by the very next request.
_BINDINGS_ATTR = "_role_bindings"


class Binding(NamedTuple):
    """One role binding as the decisions read it; the scopes are "" when the binding is not narrowed."""

    role: str
    tenant_id: str | None
    scope_pool_id: str = ""
    scope_node_id: str = ""

    @property
    def narrowed(self) -> bool:
        return bool(self.scope_pool_id or self.scope_node_id)


@dataclass(frozen=True)
class NodeScope:
    """The nodes a principal may act on with a node permission: every node, or these pools' and these nodes.

    Plain ids, so `core` never reads a node: the caller that found the node
    asks `covers` with the node's id and its pool's id.
    """

    everywhere: bool
    pool_ids: frozenset[str] = frozenset()
    node_ids: frozenset[str] = frozenset()

    def covers(self, *, node_id: str, pool_id: str) -> bool:
        return self.everywhere or node_id in self.node_ids or pool_id in self.pool_ids


def principal_bindings_set(principal: Principal, bindings: Iterable[Sequence[str | None]]) -> None:
    """Attach the `(role, tenant_id, scope_pool_id, scope_node_id)` rows read with the token."""
    rows = frozenset(
        Binding(str(role), tenant_id, pool_id or "", node_id or "")
        for role, tenant_id, pool_id, node_id in bindings
    )
    setattr(principal, _BINDINGS_ATTR, rows)


def _bindings(principal: Principal) -> frozenset[Binding]:
    """The bindings authentication attached, or (a principal read some other way) the rows, read now."""
    attached: frozenset[Binding] | None = getattr(principal, _BINDINGS_ATTR, None)
    if attached is not None:
        return attached
    rows = RoleBinding.objects.filter(principal=principal).values_list(
        "role", "tenant_id", "scope_pool_id", "scope_node_id"
    )
    return frozenset(Binding(*row) for row in rows)


def principal_tenant_ids(principal: Principal) -> list[str]:
    """The tenants the bindings attached at authentication name, sorted (none: a platform credential).

    What a log line calls the request's tenant; never a query, so a log line costs none.
    """
    attached: frozenset[Binding] = getattr(principal, _BINDINGS_ATTR, frozenset())
    return sorted({b.tenant_id for b in attached if b.tenant_id})


def has_permission(*, principal: Principal, permission: str, tenant_id: str | None) -> bool:
    """Whether one of the principal's bindings grants `permission` on the tenant (None: the platform).

    A binding narrowed to a pool or a node never grants anything platform-wide:
    only `decide_node_scope` reads it, for the callers that check the node.
    """
    roles = ROLES_HOLDING[permission]
    tenant_scoped = tenant_id is not None and permission not in PLATFORM_ONLY
    return any(
        (b.tenant_id is None and not b.narrowed and b.role in roles & PLATFORM_ROLES)
        or (tenant_scoped and b.tenant_id == tenant_id and b.role in roles)
        for b in _bindings(principal)
    )


def decide_tenant(*, principal: Principal, tenant_id: str, permission: str) -> None:
    """PERMISSION_DENIED unless the principal holds `permission` on `tenant_id`."""
    if not has_permission(principal=principal, permission=permission, tenant_id=tenant_id):
        raise PermissionDenied("the credential does not grant this method on this tenant")


def decide_platform(*, principal: Principal, permission: str) -> None:
    """PERMISSION_DENIED unless a platform binding grants `permission`."""
    if not has_permission(principal=principal, permission=permission, tenant_id=None):
        raise PermissionDenied("the credential does not grant this method")


def decide_node_scope(*, principal: Principal, permissions: tuple[str, ...]) -> NodeScope:
    """The nodes on which a platform binding grants one of `permissions`; PERMISSION_DENIED if none does.

    An unnarrowed binding (an operator, a node agent issued for every node)
    covers every node; narrowed node-agent bindings add up. The caller checks
    each node it acts on with `decide_node`, or lists only what `covers`.
    """
    pool_ids: set[str] = set()
    node_ids: set[str] = set()
    granted = False
    for b in _bindings(principal):
        if b.tenant_id is not None or not any(
            b.role in ROLES_HOLDING[p] & PLATFORM_ROLES for p in permissions
        ):
            continue
        if not b.narrowed:
            return NodeScope(everywhere=True)
        granted = True
        if b.scope_pool_id:
            pool_ids.add(b.scope_pool_id)
        if b.scope_node_id:
            node_ids.add(b.scope_node_id)
    if not granted:
        raise PermissionDenied("the credential does not grant this method")
    return NodeScope(everywhere=False, pool_ids=frozenset(pool_ids), node_ids=frozenset(node_ids))


def decide_node(scope: NodeScope, *, node_id: str, pool_id: str) -> None:
    """PERMISSION_DENIED unless `scope` covers the node (found by the caller, with its pool's id)."""
    if not scope.covers(node_id=node_id, pool_id=pool_id):
        raise PermissionDenied(NODE_OUT_OF_SCOPE)
