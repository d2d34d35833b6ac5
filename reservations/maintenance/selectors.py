"""Maintenance windows read: the dry run (`maintenance_plan`), the list, one window.

The dry run schedules the window and repairs what is inside it exactly as
`nodes/scheduleMaintenance` would (`services.maintenance_schedule_impact`),
inside a transaction it then rolls back: nothing is written, no audit event or
notification leaves it, and its numbers are the ones scheduling produces on the
same rows. While it runs it holds the nodes `FOR UPDATE`, as scheduling does,
so creates on those nodes wait for it (for the length of one repair pass).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection, transaction

from core.clock import to_millis
from core.errors import InvalidInput, NotFound
from inventory.models import Node
from inventory.schedulability import schedulable_sql
from reservations.maintenance.services import (
    MOVED,
    RUNNING,
    STUCK,
    ConflictOutcome,
    ScheduleImpact,
    maintenance_schedule_impact,
)
from reservations.models import MaintenanceWindow, Reservation

__all__ = [
    "LIST_MAX",
    "MaintenancePlan",
    "NodeImpact",
    "PlannedReservation",
    "PoolLowest",
    "TenantCounts",
    "maintenance_get",
    "maintenance_list",
    "maintenance_nodes_resolve",
    "maintenance_plan",
    "pool_lowest_available",
]

LIST_MAX = 500


@dataclass(frozen=True)
class PlannedReservation:
    """A reservation the window touches, and (moved ones) where it goes."""

    reservation_id: str
    tenant_id: str
    starts_at: datetime
    ends_at: datetime
    to_node_ids: tuple[str, ...] = ()
    reason: str = ""


@dataclass
class NodeImpact:
    """One node of the window: its reservations in the three groups."""

    node_id: str
    hostname: str
    running: list[PlannedReservation] = field(default_factory=list)
    moved: list[PlannedReservation] = field(default_factory=list)
    stuck: list[PlannedReservation] = field(default_factory=list)


@dataclass
class TenantCounts:
    """Per tenant, how many of its reservations fall in each group (each reservation once)."""

    tenant_id: str
    running: int = 0
    moved: int = 0
    stuck: int = 0


@dataclass(frozen=True)
class PoolLowest:
    """A pool's lowest `available` of one atom resource over the window, with and without the nodes."""

    pool_id: str
    resource: str
    with_nodes: int
    without_nodes: int


@dataclass
class MaintenancePlan:
    """What scheduling the window would do: per node, per tenant, and to the pools' availability."""

    starts_at: datetime
    ends_at: datetime
    nodes: list[NodeImpact]
    tenants: list[TenantCounts]
    pools: list[PoolLowest]

    def count(self, group: str) -> int:
        """Reservations in a group (`running`, `moved`, `stuck`), each once."""
        return sum(getattr(t, group) for t in self.tenants)


def maintenance_nodes_resolve(
    *, node_ids: list[str] | None = None, pool_id: str | None = None, labels: dict[str, str] | None = None
) -> list[str]:
    """The window's nodes: the ids given, or the pool's nodes whose labels hold every `labels` pair."""
    if node_ids:
        return sorted(set(node_ids))
    if not pool_id:
        raise InvalidInput.field("nodeIds", "give nodeIds, or poolId (with an optional selector)")
    nodes = Node.objects.filter(pool_id=pool_id)
    if labels:
        nodes = nodes.filter(labels__contains=labels)
    found = sorted(nodes.values_list("pk", flat=True))
    if not found:
        raise NotFound(
            f"no node of pool {pool_id} matches", [{"field": "selector", "message": "no node matches"}]
        )
    return found


# Per atom resource of the pool, its counted atoms (not in `without`) minus the most booked at
# once in the window. Ends before starts at one instant: bookings are `[start, end)`.
_LOWEST_SQL = f"""
WITH atoms AS MATERIALIZED (
    SELECT d.id, d.device_class FROM inventory_device d
      JOIN inventory_node n ON n.id = d.node_id JOIN inventory_pool p ON p.id = n.pool_id
     WHERE n.pool_id = %(pool)s AND d.bookable AND d.healthy AND {schedulable_sql("n", "p.owner_id")}
       AND NOT (n.id = ANY(%(without)s::varchar[]))
),
bk AS (
    SELECT a.device_class, GREATEST(lower(b.during), %(start)s) AS lo,
           LEAST(COALESCE(upper(b.during), 'infinity'::timestamptz), %(end)s) AS hi
      FROM atoms a JOIN device_bookings b ON b.device_id = a.id
     WHERE COALESCE(upper(b.during), 'infinity'::timestamptz) > %(start)s AND lower(b.during) < %(end)s
),
steps AS (
    SELECT device_class, sum(delta) OVER (PARTITION BY device_class ORDER BY at, delta
                                          ROWS UNBOUNDED PRECEDING) AS booked
      FROM (SELECT device_class, lo AS at, 1 AS delta FROM bk
            UNION ALL SELECT device_class, hi, -1 FROM bk) e
)
SELECT c.device_class, (c.atoms - COALESCE(s.peak, 0))::bigint
  FROM (SELECT device_class, count(*) AS atoms FROM atoms GROUP BY 1) c
  LEFT JOIN (SELECT device_class, max(booked) AS peak FROM steps GROUP BY 1) s USING (device_class)
 ORDER BY 1
"""


def pool_lowest_available(
    *, pool_id: str, starts_at: datetime, ends_at: datetime, without: list[str] | None = None
) -> dict[str, int]:
    """Per atom resource, the fewest atoms of the pool free at any instant of `[starts_at, ends_at)`."""
    with connection.cursor() as cursor:
        cursor.execute(
            _LOWEST_SQL, {"pool": pool_id, "start": starts_at, "end": ends_at, "without": without or []}
        )
        return {resource: int(free) for resource, free in cursor.fetchall()}


def _plan_of(impact: ScheduleImpact, pools: list[PoolLowest]) -> MaintenancePlan:
    window = impact.window
    hostnames = dict(Node.objects.filter(pk__in=impact.node_ids).values_list("pk", "hostname"))
    nodes = {
        node_id: NodeImpact(node_id=node_id, hostname=hostnames.get(node_id, ""))
        for node_id in impact.node_ids
    }
    spans = dict(
        (r, (s, e))
        for r, s, e in Reservation.objects.filter(
            pk__in=[c.reservation_id for c in impact.conflicts]
        ).values_list("pk", "starts_at", "ends_at")
    )
    tenants: dict[str, TenantCounts] = {}
    for conflict in impact.conflicts:
        starts_at, ends_at = spans[conflict.reservation_id]
        planned = PlannedReservation(
            reservation_id=conflict.reservation_id,
            tenant_id=conflict.tenant_id,
            starts_at=starts_at,
            ends_at=ends_at,
            to_node_ids=conflict.to_node_ids,
            reason=conflict.reason,
        )
        for node_id in conflict.node_ids:
            getattr(nodes[node_id], _GROUP_ATTR[conflict.group]).append(planned)
        counts = tenants.setdefault(conflict.tenant_id, TenantCounts(tenant_id=conflict.tenant_id))
        setattr(counts, _GROUP_ATTR[conflict.group], getattr(counts, _GROUP_ATTR[conflict.group]) + 1)
    return MaintenancePlan(
        starts_at=window.starts_at,
        ends_at=window.ends_at,
        nodes=[nodes[node_id] for node_id in impact.node_ids],
        tenants=[tenants[t] for t in sorted(tenants)],
        pools=pools,
    )


_GROUP_ATTR = {RUNNING: "running", MOVED: "moved", STUCK: "stuck"}


def maintenance_plan(
    *, node_ids: list[str], starts_at: datetime, ends_at: datetime, actor: str, reason: str = "maintenance"
) -> MaintenancePlan:
    """`nodes/planMaintenance`: what scheduling this window would do now, without writing anything.

    Per node, the reservations it touches: `running` (they would have to end),
    `moved` (BookingRepair would move them, and to which nodes), `stuck` (they
    cannot move and would be marked at risk); counts per tenant; and per pool
    of the nodes and atom resource, the lowest `available` during the window
    with the nodes and without them (after the moves). Raises what scheduling
    would raise (NOT_FOUND, INVALID_INPUT, CONFLICT).
    """
    ids = sorted(set(node_ids))
    pool_ids = sorted(set(Node.objects.filter(pk__in=ids).values_list("pool_id", flat=True)))
    with transaction.atomic():
        before = {p: pool_lowest_available(pool_id=p, starts_at=starts_at, ends_at=ends_at) for p in pool_ids}
        impact = maintenance_schedule_impact(
            node_ids=ids, starts_at=starts_at, ends_at=ends_at, reason=reason, actor=actor
        )
        after = {
            p: pool_lowest_available(pool_id=p, starts_at=starts_at, ends_at=ends_at, without=ids)
            for p in pool_ids
        }
        pools = [
            PoolLowest(pool_id=p, resource=r, with_nodes=free, without_nodes=after[p].get(r, 0))
            for p in pool_ids
            for r, free in sorted(before[p].items())
        ]
        plan = _plan_of(impact, pools)
        transaction.set_rollback(True)
    return plan


def impact_plan(impact: ScheduleImpact) -> MaintenancePlan:
    """A scheduled window's outcome in the dry run's shape (per node and per tenant; no pool numbers)."""
    return _plan_of(impact, [])


def maintenance_get(*, window_id: str) -> MaintenanceWindow:
    window = MaintenanceWindow.objects.filter(pk=window_id).first()
    if window is None:
        raise NotFound(f"maintenance window {window_id} not found")
    return window


def maintenance_list(
    *,
    pool_id: str | None = None,
    node_id: str | None = None,
    live: bool = True,
    limit: int = LIST_MAX,
) -> list[MaintenanceWindow]:
    """Windows by start, then id: the live ones (scheduled, active), or every one; of a pool or a node."""
    windows = MaintenanceWindow.objects.all()
    if live:
        windows = windows.filter(state__in=["scheduled", "active"])
    if pool_id:
        windows = windows.filter(members__node__pool_id=pool_id)
    if node_id:
        windows = windows.filter(members__node_id=node_id)
    return list(windows.distinct().order_by("starts_at", "id").prefetch_related("members")[:limit])


def window_detail(window: MaintenanceWindow) -> dict[str, Any]:
    """A window as the API answers it."""
    return {
        "id": window.pk,
        "reason": window.reason,
        "from": to_millis(window.starts_at),
        "to": to_millis(window.ends_at),
        "state": window.state,
        "nodeIds": sorted(m.node_id for m in window.members.all()),
        "createdBy": window.created_by,
    }


def conflicts_by_group(conflicts: list[ConflictOutcome]) -> dict[str, list[str]]:
    """Reservation ids per group, for an audit event or a quick look."""
    out: dict[str, list[str]] = defaultdict(list)
    for c in conflicts:
        out[c.group].append(c.reservation_id)
    return dict(out)
