"""Maintenance windows written: scheduled, shortened or extended, cancelled; each audited.

A window holds every bookable atom of its nodes for `[from, to)` with
`maintenance` bookings (guard 1 then refuses any tenant booking into it, with
no code of the placer's). Scheduling, in one transaction: the nodes locked
`FOR UPDATE` (a placement holds them `FOR SHARE`, so a create either committed
before and its booking is seen here, or waits and then finds the window's
bookings), the window and its nodes written, every free piece of the window
booked (`maintenance_windows_fill`, migration 0014). Then each reservation
that was already inside it goes through BookingRepair in its own transaction:
moved off the window's nodes when it fits elsewhere, marked at risk ("
maintenance window …") when it does not or when it is running.

`maintenance_schedule_impact` is the one path the dry run runs too, inside a
transaction it rolls back (`reservations.maintenance.selectors.maintenance_plan`),
so what the dry run says is what scheduling then does on the same rows.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection, transaction

from core.clock import StatementNow, compute_now
from core.constants import WORKER_CHANNEL
from core.errors import Conflict, InvalidInput, NotFound
from core.retry import deadlock_retried
from core.services import audit_record
from inventory.models import Node
from reservations.lifecycle.repair import LOST_DEADLOCK, reservation_repair_or_later
from reservations.maintenance.windows import iso, window_conflicts, windows_overlapping
from reservations.models import MaintenanceWindow, MaintenanceWindowNode, MaintenanceWindowState, Reservation
from reservations.nodes.changes import REPAIR_WAKE, repair_requested
from reservations.rollups.deltas import rollup_capacity_freed

__all__ = [
    "ConflictOutcome",
    "ScheduleImpact",
    "maintenance_cancel",
    "maintenance_extend",
    "maintenance_schedule",
    "maintenance_schedule_impact",
    "maintenance_shorten",
    "maintenance_update",
]

# At most this many nodes in one window.
MAX_NODES = 1000
# What a conflicting reservation came to: it runs in the window (it would have to end), it was
# moved off the window's nodes, or it is still in the window, marked at risk.
RUNNING, MOVED, STUCK = "running", "moved", "stuck"
LIVE = (MaintenanceWindowState.SCHEDULED, MaintenanceWindowState.ACTIVE)


@dataclass(frozen=True)
class ConflictOutcome:
    """One reservation that was inside the window: what repair did with it."""

    reservation_id: str
    tenant_id: str
    # The window's nodes it had bookings on (it appears in each of their groups).
    node_ids: tuple[str, ...]
    group: str
    to_node_ids: tuple[str, ...] = ()
    reason: str = ""


@dataclass
class ScheduleImpact:
    """A window and what scheduling it did (or would do) to the reservations inside it."""

    window: MaintenanceWindow
    node_ids: list[str]
    conflicts: list[ConflictOutcome] = field(default_factory=list)

    def by_group(self, group: str) -> list[ConflictOutcome]:
        return [c for c in self.conflicts if c.group == group]


def _audit(window: MaintenanceWindow, *, actor: str, action: str, reason: str, **data: Any) -> None:
    audit_record(
        actor=actor,
        action=action,
        subject_type="maintenance-window",
        subject_id=window.pk,
        reason=reason,
        data={
            "from": iso(window.starts_at),
            "to": iso(window.ends_at),
            "nodeIds": sorted(window.members.values_list("node_id", flat=True)),
            **data,
        },
    )


def _wake_worker(at: datetime | None = None) -> None:
    """Tell the worker of a new deadline (the window's start), or ask for a repair sweep."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_notify(%s, %s)", [WORKER_CHANNEL, at.isoformat() if at is not None else REPAIR_WAKE]
        )


def _lock_nodes(node_ids: list[str]) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id FROM inventory_node WHERE id = ANY(%s::varchar[]) ORDER BY id FOR UPDATE", [node_ids]
        )
        cursor.fetchall()


def _fill(node_ids: list[str]) -> int:
    """Book every free piece of the live windows on these nodes' bookable atoms; how many bookings."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT maintenance_windows_fill(ARRAY(SELECT id FROM inventory_device"
            " WHERE node_id = ANY(%s::varchar[]) AND bookable ORDER BY id))",
            [node_ids],
        )
        row = cursor.fetchone()
    return int(row[0]) if row else 0


def _checked_nodes(node_ids: Iterable[str]) -> list[str]:
    ids = sorted(set(node_ids))
    if not ids:
        raise InvalidInput.field("nodeIds", "name at least one node")
    if len(ids) > MAX_NODES:
        raise InvalidInput.field("nodeIds", f"at most {MAX_NODES} nodes in one window")
    found = set(Node.objects.filter(pk__in=ids).values_list("pk", flat=True))
    missing = [node_id for node_id in ids if node_id not in found]
    if missing:
        raise NotFound(
            f"node {missing[0]} not found", [{"field": "nodeIds", "message": f"{missing[0]}: not found"}]
        )
    return ids


def _checked_span(*, starts_at: datetime, ends_at: datetime, now: datetime) -> None:
    if ends_at <= starts_at:
        raise InvalidInput.field("to", "must be after from")
    if ends_at <= now:
        raise InvalidInput.field("to", "must be in the future")


def _refuse_overlap(
    node_ids: list[str], *, starts_at: datetime, ends_at: datetime, exclude: str = ""
) -> None:
    """Two live windows never hold one node at one instant: the second is refused, naming the first."""
    others = [
        w for w in windows_overlapping(start=starts_at, end=ends_at, node_ids=node_ids) if w.id != exclude
    ]
    if others:
        raise Conflict(
            f"nodes already held by {others[0].phrase} ({others[0].id})",
            [{"field": "nodeIds", "message": f"{w.phrase} ({w.id})"} for w in others],
        )


@deadlock_retried
def _window_create(
    *, node_ids: list[str], starts_at: datetime, ends_at: datetime, reason: str, actor: str
) -> MaintenanceWindow:
    """The window's transaction: nodes locked, rows written, every free piece booked, audited."""
    with transaction.atomic():
        _lock_nodes(node_ids)
        _refuse_overlap(node_ids, starts_at=starts_at, ends_at=ends_at)
        # Created when it holds its nodes: a create that shared a node's lock with a placement ahead
        # of ours commits while we wait (a waiting FOR UPDATE does not stop a new FOR SHARE), after
        # this transaction's now(); it is inside, found below, and was made before the window.
        window = MaintenanceWindow.objects.create(
            reason=reason, starts_at=starts_at, ends_at=ends_at, created_by=actor, created_at=StatementNow()
        )
        MaintenanceWindowNode.objects.bulk_create(
            [MaintenanceWindowNode(window=window, node_id=node_id) for node_id in node_ids]
        )
        booked = _fill(node_ids)
        _audit(window, actor=actor, action="maintenance.scheduled", reason=reason, bookings=booked)
        _wake_worker(starts_at)
    return window


def _allocation_nodes(reservation_id: str) -> set[str]:
    return set(
        Reservation.objects.get(pk=reservation_id)
        .allocations.filter(released=False)
        .values_list("node_id", flat=True)
    )


def _repair_conflicts(window: MaintenanceWindow, node_ids: list[str]) -> list[ConflictOutcome]:
    """BookingRepair for each reservation inside the window, one transaction each; what became of it."""
    outcomes = []
    members = set(node_ids)
    now = compute_now()
    held = False
    for reservation_id, _ in window_conflicts(window_id=window.pk):
        reservation = Reservation.objects.get(pk=reservation_id)
        before = _allocation_nodes(reservation_id) & members
        outcome = reservation_repair_or_later(reservation_id=reservation_id)
        reservation.refresh_from_db()
        if outcome.action == "repaired":
            group, to_nodes = MOVED, tuple(sorted(_allocation_nodes(reservation_id)))
        elif reservation.starts_at <= now:
            group, to_nodes = RUNNING, ()
        else:
            group, to_nodes = STUCK, ()
        # Held by another transaction right now: the worker's next run looks at the window's nodes.
        held |= outcome.action is None and not reservation.at_risk_since
        outcomes.append(
            ConflictOutcome(
                reservation_id=reservation_id,
                tenant_id=reservation.tenant_id,
                node_ids=tuple(sorted(before)),
                group=group,
                to_node_ids=to_nodes,
                reason=reservation.at_risk_reason or outcome.reason,
            )
        )
    if held:
        repair_requested(node_ids)
    return outcomes


def maintenance_schedule_impact(
    *, node_ids: Iterable[str], starts_at: datetime, ends_at: datetime, reason: str, actor: str
) -> ScheduleImpact:
    """Schedule the window, then repair what was inside it; the one path the dry run shares.

    Validates the nodes (NOT_FOUND), the span (INVALID_INPUT naming `to`) and
    that no other live window holds one of the nodes then (CONFLICT naming it).
    """
    if not reason.strip():
        raise InvalidInput.field("reason", "a maintenance window needs a reason")
    ids = _checked_nodes(node_ids)
    _checked_span(starts_at=starts_at, ends_at=ends_at, now=compute_now())
    window = _window_create(node_ids=ids, starts_at=starts_at, ends_at=ends_at, reason=reason, actor=actor)
    return ScheduleImpact(window=window, node_ids=ids, conflicts=_repair_conflicts(window, ids))


def maintenance_schedule(
    *, node_ids: Iterable[str], starts_at: datetime, ends_at: datetime, reason: str, actor: str
) -> ScheduleImpact:
    """`nodes/scheduleMaintenance`: hold every atom of the nodes for `[starts_at, ends_at)`.

    Future reservations inside are moved or marked at risk at once; running
    ones are marked at risk (they would have to end). The worker puts the
    nodes in maintenance at `starts_at` and takes them out at `ends_at`.
    """
    return maintenance_schedule_impact(
        node_ids=node_ids, starts_at=starts_at, ends_at=ends_at, reason=reason, actor=actor
    )


def _locked_window(window_id: str) -> MaintenanceWindow:
    window = MaintenanceWindow.objects.select_for_update().filter(pk=window_id).first()
    if window is None:
        raise NotFound(f"maintenance window {window_id} not found")
    window.updated_at = compute_now()
    return window


def _member_ids(window: MaintenanceWindow) -> list[str]:
    return sorted(window.members.values_list("node_id", flat=True))


def _require_live(window: MaintenanceWindow) -> None:
    if window.state not in LIVE:
        raise Conflict(f"maintenance window {window.pk} is {window.state}; only a live window changes")


def _recheck(reservation_ids: Iterable[str]) -> None:
    """BookingRepair on reservations a change freed: their marks are cleared (or reworded) at once."""
    lost = False
    for reservation_id in sorted(set(reservation_ids)):
        lost |= reservation_repair_or_later(reservation_id=reservation_id).reason == LOST_DEADLOCK
    if lost:
        _wake_worker()


@deadlock_retried
def maintenance_shorten(*, window_id: str, ends_at: datetime, actor: str) -> MaintenanceWindow:
    """End the window earlier: its bookings after the new end are given back; marks it caused are cleared."""
    before = {r for r, _ in window_conflicts(window_id=window_id)}
    with transaction.atomic():
        window = _locked_window(window_id)
        _require_live(window)
        now = compute_now()
        if ends_at >= window.ends_at:
            raise InvalidInput.field("to", "shortening ends the window earlier than it ends now")
        if ends_at <= max(window.starts_at, now):
            raise InvalidInput.field(
                "to", "must be after the window's start and in the future; cancel it instead"
            )
        _lock_nodes(_member_ids(window))
        old_end = window.ends_at
        with connection.cursor() as cursor:
            cursor.execute(
                "DELETE FROM device_bookings WHERE window_id = %s AND lower(during) >= %s",
                [window.pk, ends_at],
            )
            cursor.execute(
                "UPDATE device_bookings SET during = tstzrange(lower(during), %s, '[)')"
                " WHERE window_id = %s AND upper(during) > %s",
                [ends_at, window.pk, ends_at],
            )
        rollup_capacity_freed(node_ids=_member_ids(window))
        window.ends_at = ends_at
        window.save(update_fields=["ends_at", "updated_at"])
        _audit(window, actor=actor, action="maintenance.shortened", reason="", previousTo=iso(old_end))
        _wake_worker(ends_at)
    _recheck(before)
    return window


def _blockers(node_ids: list[str], *, window: MaintenanceWindow, start: datetime, end: datetime) -> list[str]:
    """What stands on the nodes' atoms in `[start, end)`, besides the window itself, in words."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT b.purpose, a.reservation_id, r.tenant_id, w.reason, w.id, d.node_id,"
            " lower(b.during), upper(b.during)"
            " FROM device_bookings b JOIN inventory_device d ON d.id = b.device_id"
            " LEFT JOIN reservations_allocation a ON a.id = b.allocation_id"
            " LEFT JOIN reservations_reservation r ON r.id = a.reservation_id"
            " LEFT JOIN reservations_maintenancewindow w ON w.id = b.window_id"
            " WHERE d.node_id = ANY(%s::varchar[]) AND b.window_id IS DISTINCT FROM %s"
            " AND COALESCE(upper(b.during), 'infinity'::timestamptz) > %s AND lower(b.during) < %s"
            " ORDER BY 7, 2, 6",
            [node_ids, window.pk, start, end],
        )
        rows = cursor.fetchall()
    found: list[str] = []
    for purpose, reservation_id, tenant_id, reason, other, node_id, lower, upper in rows:
        until = "open-ended" if upper is None else iso(upper)
        if purpose == "allocation":
            text = (
                f"reservation {reservation_id} of tenant {tenant_id} on {node_id}"
                f" from {iso(lower)} to {until}"
            )
        elif purpose == "maintenance":
            text = f"maintenance window {reason!r} ({other}) on {node_id} from {iso(lower)} to {until}"
        else:
            text = f"a layout change on {node_id} until {until}"
        if text not in found:
            found.append(text)
    return found


@deadlock_retried
def maintenance_extend(*, window_id: str, ends_at: datetime, actor: str) -> MaintenanceWindow:
    """End the window later; refused (CONFLICT naming the booking) where the extension meets one."""
    with transaction.atomic():
        window = _locked_window(window_id)
        _require_live(window)
        if ends_at <= window.ends_at:
            raise InvalidInput.field("to", "extending ends the window later than it ends now")
        node_ids = _member_ids(window)
        _lock_nodes(node_ids)
        blockers = _blockers(node_ids, window=window, start=window.ends_at, end=ends_at)
        if blockers:
            raise Conflict(
                f"the extension meets {blockers[0]}",
                [{"field": "to", "message": text} for text in blockers],
            )
        old_end = window.ends_at
        rollup_capacity_freed(node_ids=_member_ids(window))
        window.ends_at = ends_at
        window.save(update_fields=["ends_at", "updated_at"])
        booked = _fill(node_ids)
        _audit(
            window,
            actor=actor,
            action="maintenance.extended",
            reason="",
            previousTo=iso(old_end),
            bookings=booked,
        )
        _wake_worker(old_end)
    return window


def maintenance_update(*, window_id: str, ends_at: datetime, actor: str) -> MaintenanceWindow:
    """`nodes/updateMaintenance`: a new end, earlier (shorten) or later (extend)."""
    window = MaintenanceWindow.objects.filter(pk=window_id).first()
    if window is None:
        raise NotFound(f"maintenance window {window_id} not found")
    if ends_at < window.ends_at:
        return maintenance_shorten(window_id=window_id, ends_at=ends_at, actor=actor)
    if ends_at > window.ends_at:
        return maintenance_extend(window_id=window_id, ends_at=ends_at, actor=actor)
    _require_live(window)
    return window


@deadlock_retried
def maintenance_cancel(*, window_id: str, actor: str, reason: str = "") -> MaintenanceWindow:
    """Call the window off: its bookings from now on given back, its nodes out of the maintenance it set."""
    from reservations.maintenance.toggle import members_switch_off

    before = {r for r, _ in window_conflicts(window_id=window_id)}
    with transaction.atomic():
        window = _locked_window(window_id)
        _require_live(window)
        node_ids = _member_ids(window)
        _lock_nodes(node_ids)
        was = window.state
        window.state = MaintenanceWindowState.CANCELLED
        window.save(update_fields=["state", "updated_at"])
        now = compute_now()
        with connection.cursor() as cursor:
            cursor.execute(
                "DELETE FROM device_bookings WHERE window_id = %s AND lower(during) >= %s", [window.pk, now]
            )
            cursor.execute(
                "UPDATE device_bookings SET during = tstzrange(lower(during), %s, '[)')"
                " WHERE window_id = %s AND upper(during) > %s",
                [now, window.pk, now],
            )
        rollup_capacity_freed(node_ids=node_ids)
        if was == MaintenanceWindowState.ACTIVE:
            members_switch_off(window, actor=actor)
        _audit(window, actor=actor, action="maintenance.cancelled", reason=reason, previousState=was)
    _recheck(before)
    return window
