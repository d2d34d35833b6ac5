"""Reads for the operator admin's node page and node actions.

Kept out of the admin classes so that they stay thin and so that the numbers
an operator sees (GPUs that left `allocatable`) are computed in one place that
tests call directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import Count, Q, QuerySet

from core.models import AuditEvent
from inventory.models import Device, Node
from inventory.schedulability import SCHEDULABLE, node_bucket

GPU_ATOM_CLASSES = ("gpu", "gpu.mig", "gpu.slot")


def node_allocatable_atoms(*, node: Node) -> dict[str, int]:
    """GPU atoms per class (`gpu`, `gpu.mig`, `gpu.slot`) this node adds to `allocatable` now.

    The same rule as the rebuild's: healthy, bookable atoms, and only while the
    node is in the `schedulable` bucket; otherwise the node contributes nothing.
    """
    if node_bucket(node) != SCHEDULABLE:
        return {}
    rows = (
        Device.objects.filter(node=node, device_class__in=GPU_ATOM_CLASSES, bookable=True, healthy=True)
        .values_list("device_class")
        .annotate(n=Count("id"))
        .order_by("device_class")
    )
    return {cls: n for cls, n in rows}


def node_allocatable_gpus(*, node: Node) -> int:
    """All GPU atoms (whole GPUs, MIG instances, slots) this node adds to `allocatable` now."""
    return sum(node_allocatable_atoms(node=node).values())


@dataclass(frozen=True)
class NodeChange:
    """What one operator action did to one node, in the terms an operator reads."""

    node: Node
    bucket_before: str
    bucket_after: str
    atoms_before: dict[str, int]
    atoms_after: dict[str, int]
    changed: bool = True

    @property
    def gpu_delta(self) -> int:
        return sum(self.atoms_after.values()) - sum(self.atoms_before.values())


def node_change_summary(*, changes: list[NodeChange]) -> str:
    """One sentence: how many GPU atoms left or joined allocatable, by class when not all whole GPUs."""
    by_class: dict[str, int] = {}
    for c in changes:
        for cls in set(c.atoms_before) | set(c.atoms_after):
            by_class[cls] = by_class.get(cls, 0) + c.atoms_after.get(cls, 0) - c.atoms_before.get(cls, 0)
    by_class = {cls: n for cls, n in sorted(by_class.items()) if n}
    delta = sum(by_class.values())
    noun = "GPU" if set(by_class) <= {"gpu"} else "GPU atom"
    if delta:
        count = abs(delta)
        gpus = f"{count} {noun}{'s' if count != 1 else ''} {'left' if delta < 0 else 'joined'} allocatable"
        if noun != "GPU":
            gpus += " [" + ", ".join(f"{abs(n)} {cls}" for cls, n in by_class.items()) + "]"
    else:
        gpus = "allocatable GPUs unchanged"
    moved = [c for c in changes if c.bucket_before != c.bucket_after]
    buckets = ", ".join(f"{c.node.hostname}: {c.bucket_before} → {c.bucket_after}" for c in moved[:5])
    if len(moved) > 5:
        buckets += f", and {len(moved) - 5} more"
    return gpus + (f" ({buckets})" if buckets else "")


def node_operator_state(*, node: Node) -> tuple[Any, ...]:
    """What the operator actions write, to tell a real change from a repeat (the services no-op those)."""
    taints = tuple(node.taints.order_by("key").values_list("key", "value", "effect"))
    return (
        node.cordoned,
        node.cordon_reason,
        node.maintenance,
        node.maintenance_reason,
        node.noschedule_taints,
        taints,
    )


@dataclass(frozen=True)
class BookingRef:
    """A booking as the node page shows it."""

    start: datetime
    end: datetime | None
    reservation_id: str | None
    tenant_id: str | None
    purpose: str


@dataclass
class AtomRow:
    """A device on the node page, with its current and next booking."""

    device: Device
    current: BookingRef | None
    next: BookingRef | None
    children: list[AtomRow] = field(default_factory=list)

    @property
    def description(self) -> str:
        """Model or MIG profile and memory, e.g. 'H100 · 80 GiB' or '3g.40gb · 40 GiB'."""
        attrs = self.device.attributes or {}
        parts = [str(attrs.get("migProfile") or attrs.get("gpuModel") or attrs.get("media") or "")]
        memory = attrs.get("vramGiB") or attrs.get("memoryGiB") or attrs.get("sizeGiB")
        if memory:
            parts.append(f"{memory} GiB")
        if attrs.get("linkGbps"):
            parts.append(f"{attrs['linkGbps']} Gb/s")
        return " · ".join(p for p in parts if p)

    @property
    def numa(self) -> str:
        value = (self.device.attributes or {}).get("numaNode")
        return "" if value is None else str(value)


# One query for every device of a node with its current and next booking: two
# LATERAL lookups served by the exclusion constraint's gist index on
# (device_id, during), instead of a query per atom. `booking` is a booking as
# the page shows it; NOT MATERIALIZED, each lookup's WHERE reaches the index.
_ATOMS_SQL = """
WITH booking AS NOT MATERIALIZED (
    SELECT b.device_id, b.during, lower(b.during) AS lo, upper(b.during) AS hi,
           a.reservation_id AS rsv, r.tenant_id AS tenant, b.purpose
      FROM device_bookings b
      LEFT JOIN reservations_allocation a ON a.id = b.allocation_id
      LEFT JOIN reservations_reservation r ON r.id = a.reservation_id
)
SELECT d.id,
       cur.lo AS cur_start, cur.hi AS cur_end, cur.rsv AS cur_rsv, cur.tenant AS cur_tenant,
       cur.purpose AS cur_purpose,
       nxt.lo AS next_start, nxt.hi AS next_end, nxt.rsv AS next_rsv, nxt.tenant AS next_tenant,
       nxt.purpose AS next_purpose
  FROM inventory_device d
  LEFT JOIN LATERAL (
        SELECT * FROM booking WHERE booking.device_id = d.id AND booking.during @> compute_now()
         LIMIT 1) cur ON TRUE
  LEFT JOIN LATERAL (
        SELECT * FROM booking WHERE booking.device_id = d.id AND booking.lo > compute_now()
         ORDER BY booking.lo
         LIMIT 1) nxt ON TRUE
 WHERE d.node_id = %s
 ORDER BY d.device_class, d.uid
"""


def node_atoms(*, node: Node) -> tuple[list[AtomRow], list[AtomRow]]:
    """The node's devices grouped for display: (GPUs with their MIG/slot atoms, other devices).

    Two queries in all, whatever the number of atoms: the devices, and their bookings.
    """
    devices = {d.id: d for d in Device.objects.filter(node=node)}
    bookings: dict[int, dict[str, Any]] = {}
    with connection.cursor() as cursor:
        cursor.execute(_ATOMS_SQL, [node.pk])
        cols = [c.name for c in cursor.description or []]
        for values in cursor.fetchall():
            rec = dict(zip(cols, values, strict=True))
            bookings[rec["id"]] = rec

    def ref(rec: dict[str, Any] | None, which: str) -> BookingRef | None:
        if rec is None or rec[f"{which}_start"] is None:
            return None
        return BookingRef(
            start=rec[f"{which}_start"],
            end=rec[f"{which}_end"],
            reservation_id=rec[f"{which}_rsv"],
            tenant_id=rec[f"{which}_tenant"],
            purpose=rec[f"{which}_purpose"],
        )

    rows: dict[int, AtomRow] = {}
    ordered = sorted(devices.values(), key=lambda d: (d.device_class, d.uid))
    for d in ordered:
        found = bookings.get(d.id)
        rows[d.id] = AtomRow(device=d, current=ref(found, "cur"), next=ref(found, "next"))
    gpus: list[AtomRow] = []
    others: list[AtomRow] = []
    for d in ordered:
        row = rows[d.id]
        if d.parent_id is not None and d.parent_id in rows:
            rows[d.parent_id].children.append(row)
        elif d.device_class in GPU_ATOM_CLASSES:
            gpus.append(row)
        else:
            others.append(row)
    return gpus, others


@dataclass(frozen=True)
class ScalarRow:
    resource: str
    allocated: int
    allocatable: int
    ratio: float
    capacity: int

    @property
    def percent(self) -> int:
        return round(100 * self.allocated / self.capacity) if self.capacity else 0


def node_scalars(*, node: Node) -> list[ScalarRow]:
    """Scalar resources with allocated against floor(allocatable * ratio), the guard-3 ceiling."""
    rows = []
    for r in node.resources.order_by("resource"):
        capacity = int(r.allocatable * r.ratio)  # floor for non-negative values
        rows.append(ScalarRow(r.resource, r.allocated, r.allocatable, float(r.ratio), capacity))
    return rows


def node_audit_trail(*, node: Node, limit: int = 50) -> QuerySet[AuditEvent]:
    """The node's audit events and its devices', newest first (served by `audit_subject_at`)."""
    device_keys = [str(pk) for pk in node.devices.values_list("id", flat=True)]
    device_keys += list(node.devices.values_list("uid", flat=True))
    return AuditEvent.objects.filter(
        Q(subject_type="node", subject_id=node.pk) | Q(subject_type="device", subject_id__in=device_keys)
    ).order_by("-at", "-id")[:limit]


@dataclass(frozen=True)
class GanttBar:
    """One booking of one atom, clipped to the chart's window."""

    uid: str
    start: datetime
    end: datetime
    reservation_id: str | None
    tenant_id: str | None
    state: str
    spot: bool
    at_risk: bool
    # The maintenance window a `maintenance` booking holds the atom for, and its reason.
    window_id: str | None = None
    window_reason: str = ""


@dataclass(frozen=True)
class GanttWindow:
    """A maintenance window of the node, over the whole window (its bar is clipped when drawn)."""

    window_id: str
    reason: str
    start: datetime
    end: datetime


@dataclass(frozen=True)
class Gantt:
    """A node's bookable atoms (rows, in uid order) and their bookings in `[start, end)`."""

    atoms: list[tuple[str, str]]
    bars: list[GanttBar]
    start: datetime
    end: datetime
    now: datetime
    windows: list[GanttWindow] = field(default_factory=list)


# One query for the chart: the window around the database's now, the node's
# bookable atoms, and each one's bookings overlapping the window (a layout
# change has no reservation).
_GANTT_SQL = """
WITH w AS (
    SELECT compute_now() - make_interval(secs => %(before)s) AS lo,
           compute_now() + make_interval(secs => %(after)s) AS hi,
           compute_now() AS now
)
SELECT w.lo, w.hi, w.now, d.uid, d.device_class, lower(b.during), upper(b.during), r.id, r.tenant_id,
       r.state, COALESCE(r.spot, false), r.at_risk_since IS NOT NULL, b.purpose,
       mw.id, mw.reason, mw.starts_at, mw.ends_at
  FROM w
  LEFT JOIN inventory_device d ON d.node_id = %(node)s AND d.bookable
  LEFT JOIN device_bookings b
         ON b.device_id = d.id
        AND COALESCE(upper(b.during), 'infinity'::timestamptz) > w.lo
        AND lower(b.during) < w.hi
  LEFT JOIN reservations_allocation a ON a.id = b.allocation_id
  LEFT JOIN reservations_reservation r ON r.id = a.reservation_id
  LEFT JOIN reservations_maintenancewindow mw ON mw.id = b.window_id
 ORDER BY d.uid, lower(b.during)
"""


def node_gantt(*, node: Node, hours: int) -> Gantt:
    """Every bookable atom of the node and its bookings over `hours` around now (a quarter of it past)."""
    atoms: dict[str, str] = {}
    bars: list[GanttBar] = []
    windows: dict[str, GanttWindow] = {}
    with connection.cursor() as cursor:
        cursor.execute(_GANTT_SQL, {"node": node.pk, "before": hours * 900, "after": hours * 2700})
        rows = cursor.fetchall()
    start, end, now = rows[0][:3]
    for row in rows:
        uid, device_class, lower, upper, rid, tenant, state, spot, at_risk, purpose = row[3:13]
        window_id, window_reason, window_start, window_end = row[13:]
        if uid is None:
            continue
        atoms.setdefault(uid, device_class)
        if lower is None:
            continue
        if window_id is not None:
            windows.setdefault(window_id, GanttWindow(window_id, window_reason, window_start, window_end))
        bars.append(
            GanttBar(
                uid=uid,
                start=max(lower, start),
                end=min(upper or end, end),
                reservation_id=rid,
                tenant_id=tenant,
                state=state or purpose,
                spot=bool(spot),
                at_risk=bool(at_risk),
                window_id=window_id,
                window_reason=window_reason or "",
            )
        )
    ordered = sorted(windows.values(), key=lambda w: (w.start, w.window_id))
    return Gantt(atoms=list(atoms.items()), bars=bars, start=start, end=end, now=now, windows=ordered)
