"""BookingRepair: move future bookings off nodes and atoms that left the schedulable set.

A booking is counted (`reserved` while it is in the future, `allocated` while
it runs) only while its atom is: the node in the schedulable bucket, the
device healthy and bookable. When a node is cordoned, tainted `NoSchedule`,
put in maintenance or disconnected, or a device turns unhealthy or vanishes,
the live bookings on it are left standing: this job finds their reservations
and, one reservation per transaction (its row locked `FOR UPDATE SKIP LOCKED`,
so two workers never repair one reservation at once):

* a reservation that has not started and is bound by `hold` is placed again,
  whole: the same pool, window `[starts_at, ends_at)`, selector, gang topology
  and scalars, onto schedulable atoms through the placer's guarded commit
  (guards 1, 3 and 4; the rollup deltas in this transaction, guard 2's layout
  bookings block it like any booking). Inside one savepoint its old bookings
  and allocations are removed (their scalar claims and rollup counts given
  back) and the new ones written; the quota is not touched, since the same
  request charges the same amounts (guard 5 holds unchanged). The nodes are
  told through the outbox, the old assignment shortened and the new one
  assigned (guard 6: a node that refuses the new one releases it).
  A repair never displaces a spot reservation (it would cut someone else's
  booking and move the window). When nothing fits, the savepoint rolls back
  and the reservation is marked at risk instead;
* a reservation bound to its nodes (`binding: node`, a whole-node lease) is
  never moved: it is marked at risk;
* a reservation that already runs cannot move: it is marked at risk.

A booking inside a maintenance window of its node (one that was there when
the window was scheduled) is treated as one on an uncounted atom, with the
reason "maintenance window 'firmware' on node_… from … to …": the window's
own bookings hold the rest of its atoms, so the placer moves the reservation
off the window's nodes, or it is marked at risk.

The mark (`at_risk_reason`, `at_risk_since`) is set once (`since` is not bumped
by later runs; the reason follows what is wrong now). A marked reservation is
looked at again on every run, so a later run moves it when capacity frees up
(the worker runs this job on every release and every 'repair' notification),
and the mark is cleared once every booking of the reservation is on counted
atoms again, or once it is no longer live. Every mark, change of reason,
repair and clearing is written to the audit trail.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import OperationalError, connection, transaction

from core.errors import InvalidInput
from core.retry import deadlock_retried, lost_deadlock
from core.services import audit_record
from inventory.models import Pool
from inventory.schedulability import (
    EXCLUDED,
    MAINTENANCE,
    PROVISIONING,
    SCHEDULABLE,
    UNREACHABLE,
    bucket_sql,
    schedulable_sql,
)
from inventory.services.resources import node_resources_give_back
from reservations.maintenance.windows import reservation_windows
from reservations.models import Binding, Reservation
from reservations.placer.commit import MAX_REPLANS, Placement, placement_deltas, plan_commit
from reservations.placer.filters import Window
from reservations.placer.plan import placement_plan
from reservations.request.parse import parse_reservation_request
from reservations.request.types import ReservationRequest
from reservations.rollups.deltas import rollup_apply_deltas

logger = logging.getLogger(__name__)

ACTOR = "booking-repair"
LIVE_STATES = ("scheduled", "active")
# A reason names at most this many problems, then counts the rest.
REASON_PROBLEMS = 5

# An atom is counted by the rollups when its node is schedulable and it is healthy and bookable.
COUNTED_SQL = f"({schedulable_sql('n', 'p.owner_id')} AND d.healthy AND d.bookable)"

# A booking still counted somewhere (FUTURE or RUNNING) that has not ended: `b` of `device_bookings`.
LIVE_BOOKING_SQL = "b.phase IN (0, 1) AND COALESCE(upper(b.during), 'infinity') > compute_now()"


def uncounted_bookings_sql(reservation: str) -> str:
    """FROM and WHERE of the reservation's live bookings on atoms that are not counted (`a b d n p`).

    `reservation` is an SQL expression: a parameter, or a column of an outer query.
    """
    return f"""  FROM reservations_allocation a
  JOIN device_bookings b ON b.allocation_id = a.id
  JOIN inventory_device d ON d.id = b.device_id
  JOIN inventory_node n ON n.id = d.node_id
  JOIN inventory_pool p ON p.id = n.pool_id
 WHERE a.reservation_id = {reservation} AND NOT a.released AND {LIVE_BOOKING_SQL}
   AND NOT {COUNTED_SQL}"""


# What is wrong with one reservation's live bookings, per atom that is not counted.
_PROBLEMS_SQL = f"""
SELECT DISTINCT n.id, n.hostname, {bucket_sql("n", "p.owner_id")} AS bucket,
       n.cordoned, n.cordon_reason, n.maintenance, n.maintenance_reason, n.connectivity,
       (SELECT string_agg(t.key || COALESCE(' (' || NULLIF(t.reason, '') || ')', ''), ', ' ORDER BY t.key)
          FROM inventory_taint t WHERE t.node_id = n.id AND t.effect = 'NoSchedule') AS taints,
       d.uid, d.device_class, d.healthy, d.bookable, d.vanished_at IS NOT NULL AS vanished
{uncounted_bookings_sql("%(reservation)s")}
 ORDER BY n.hostname, d.uid
"""

# The reservation's nodes, locked FOR SHARE in id order: a node change (which takes the
# node FOR UPDATE and recounts its contribution around its write) then serializes with
# this transaction, so the counts given back below are the ones the rollups hold.
_LOCK_NODES_SQL = """
SELECT n.id FROM inventory_node n
 WHERE n.id IN (SELECT a.node_id FROM reservations_allocation a WHERE a.reservation_id = %(reservation)s)
 ORDER BY n.id
   FOR SHARE
"""

# Remove every booking of the reservation; count the removed ones the rollups held, by class
# and phase (the phase as the deleted row had it, whatever a concurrent writer did before).
_REMOVE_BOOKINGS_SQL = f"""
WITH gone AS (
    DELETE FROM device_bookings b USING reservations_allocation a
     WHERE b.allocation_id = a.id AND a.reservation_id = %(reservation)s
    RETURNING b.device_id, b.phase
)
SELECT d.device_class, g.phase, count(*) FILTER (WHERE {COUNTED_SQL})
  FROM gone g
  JOIN inventory_device d ON d.id = g.device_id
  JOIN inventory_node n ON n.id = d.node_id
  JOIN inventory_pool p ON p.id = n.pool_id
 GROUP BY 1, 2
"""

# Remove the allocations; their scalar claims, and whether the rollups counted them.
_REMOVE_ALLOCATIONS_SQL = f"""
WITH gone AS (
    DELETE FROM reservations_allocation WHERE reservation_id = %(reservation)s AND NOT released
    RETURNING node_id, resources
)
SELECT g.node_id, g.resources, {schedulable_sql("n", "p.owner_id")}
  FROM gone g
  JOIN inventory_node n ON n.id = g.node_id
  JOIN inventory_pool p ON p.id = n.pool_id
 ORDER BY g.node_id
"""

_CLASS_NAMES = {
    "gpu": "GPU",
    "gpu.mig": "MIG instance",
    "gpu.slot": "GPU slot",
    "nic.vf": "NIC VF",
    "disk": "disk",
    "node": "node atom",
}


@dataclass(frozen=True)
class Outcome:
    """What one look at a reservation did: `repaired`, `at-risk`, `cleared`, or nothing."""

    action: str | None
    reason: str = ""


class _NoPlacement(Exception):
    """No placement holds for the reservation's window: roll the savepoint back."""


def rows(sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """What one statement of BookingRepair returns (its SQL is plain text, not the ORM's)."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def _node_problem(row: tuple[Any, ...]) -> str | None:
    """Why the node keeps the booking from being counted, or None when the node is fine."""
    hostname, bucket, cordoned, cordon_reason, maintenance, maintenance_reason = row[1:7]
    connectivity, taints = row[7:9]
    if bucket == SCHEDULABLE:
        return None
    if bucket == EXCLUDED:
        return f"node {hostname} is excluded from scheduling"
    if bucket == PROVISIONING:
        return f"node {hostname} is provisioning"
    if bucket == MAINTENANCE:
        parts = []
        if cordoned:
            parts.append(f"node {hostname} is cordoned" + (f": {cordon_reason}" if cordon_reason else ""))
        if maintenance:
            why = f": {maintenance_reason}" if maintenance_reason else ""
            parts.append(f"node {hostname} is in maintenance{why}")
        return "; ".join(parts)
    if bucket == UNREACHABLE:
        return f"node {hostname} is {connectivity}"
    return f"node {hostname} is tainted NoSchedule" + (f": {taints}" if taints else "")


def _device_problem(row: tuple[Any, ...]) -> str:
    uid, device_class, healthy, bookable, vanished = row[9:14]
    name = f"{_CLASS_NAMES.get(device_class, device_class)} {uid}"
    if vanished:
        return f"{name} is no longer reported"
    if not healthy:
        return f"{name} is unhealthy"
    if not bookable:
        return f"{name} is no longer bookable"
    return f"{name} is not counted"  # pragma: no cover - COUNTED_SQL says one of the above holds


def problems_reason(reservation_id: str) -> str:
    """What keeps the reservation's live bookings off counted atoms, as one sentence ('' when nothing).

    A node's problem is said once for all its atoms; at most `REASON_PROBLEMS`
    problems are named, then the rest are counted.
    """
    problems: list[str] = []
    for row in rows(_PROBLEMS_SQL, {"reservation": reservation_id}):
        problem = _node_problem(row) or _device_problem(row)
        if problem not in problems:
            problems.append(problem)
    problems.extend(window.phrase for window in reservation_windows(reservation_id))
    if len(problems) > REASON_PROBLEMS:
        rest = len(problems) - REASON_PROBLEMS
        problems = [*problems[:REASON_PROBLEMS], f"and {rest} more"]
    return "; ".join(problems)


def _request_of(reservation: Reservation) -> ReservationRequest:
    """The reservation's request as it was asked, without its start and wait (the window is kept)."""
    raw = reservation.request
    if isinstance(raw, str):  # pragma: no cover - raw jsonb read as text
        raw = json.loads(raw)
    body = {key: value for key, value in dict(raw or {}).items() if key not in ("start", "wait")}
    return parse_reservation_request(body)


def _remove(reservation: Reservation) -> tuple[list[str], dict[str, tuple[int, int]]]:
    """Delete the reservation's bookings and allocations; their nodes and the rollup deltas to give back."""
    deltas: Counter[tuple[str, str]] = Counter()
    for device_class, phase, counted in rows(_REMOVE_BOOKINGS_SQL, {"reservation": reservation.pk}):
        if phase == 1:
            deltas[(device_class, "allocated")] -= counted
        elif phase == 0:
            deltas[(device_class, "reserved")] -= counted
    claims: list[tuple[str, str, int]] = []
    nodes: list[str] = []
    for node_id, resources, counted in rows(_REMOVE_ALLOCATIONS_SQL, {"reservation": reservation.pk}):
        nodes.append(node_id)
        if isinstance(resources, str):  # raw jsonb read as text
            resources = json.loads(resources)
        for resource, amount in sorted((resources or {}).items()):
            if int(amount) > 0:
                claims.append((node_id, resource, int(amount)))
                if counted:
                    deltas[(resource, "allocated")] -= int(amount)
    node_resources_give_back(claims=claims)
    return nodes, _as_rollup(deltas)


def _as_rollup(deltas: Counter[tuple[str, str]]) -> dict[str, tuple[int, int]]:
    resources = sorted({resource for resource, _ in deltas})
    return {r: (deltas[(r, "allocated")], deltas[(r, "reserved")]) for r in resources}


def _place(*, reservation: Reservation, request: ReservationRequest, pool: Pool, window: Window) -> Placement:
    """The placer's guarded commit for the kept window, replanned a bounded number of times; no displacing."""
    reason = "the request does not fit"
    for _attempt in range(MAX_REPLANS + 1):
        plan = placement_plan(request=request, pool=pool, window=window)
        if not plan.fits:
            reason = plan.reason.message if plan.reason else reason
            break
        placement = plan_commit(reservation=reservation, request=request, plan=plan, window=window)
        if placement is not None:
            return placement
    raise _NoPlacement(reason)


def _merge(*parts: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for part in parts:
        for resource, (allocated, reserved) in part.items():
            old = out.get(resource, (0, 0))
            out[resource] = (old[0] + allocated, old[1] + reserved)
    return out


def _at_risk_save(reservation: Reservation, *, reason: str, since: datetime | None) -> None:
    reservation.at_risk_reason = reason
    reservation.at_risk_since = since
    if since is None:
        reservation.at_risk_freed = None  # a later mark waits for nothing it did not try
    reservation.save(update_fields=["at_risk_reason", "at_risk_since", "at_risk_freed"])


def _audit(reservation: Reservation, *, action: str, reason: str, data: dict[str, Any]) -> None:
    """The repair's trail: every move, mark and cleared mark, by `ACTOR`."""
    audit_record(
        actor=ACTOR,
        action=action,
        subject_type="reservation",
        subject_id=reservation.pk,
        reason=reason,
        data=data,
    )


def _mark(
    reservation: Reservation, *, reason: str, now: datetime, data: dict[str, Any], freed: int | None = None
) -> Outcome:
    """Mark at risk (since now, if not already), or update the reason; audited when it changes.

    `freed`: the pool's count of given-back capacity read before a failed attempt to move it
    (kept, so the next attempt waits for capacity to be given back).
    """
    if freed is not None and reservation.at_risk_freed != freed:
        reservation.at_risk_freed = freed
        reservation.save(update_fields=["at_risk_freed"])
    if reservation.at_risk_since is not None and reservation.at_risk_reason == reason:
        return Outcome(None, reason)
    first = reservation.at_risk_since is None
    since = now if first else reservation.at_risk_since
    _at_risk_save(reservation, reason=reason, since=since)
    _audit(
        reservation,
        action="reservation.at-risk",
        reason=reason,
        data={**data, "since": (since or now).isoformat(), "first": first},
    )
    return Outcome("at-risk", reason)


def _clear(reservation: Reservation, *, why: str, data: dict[str, Any]) -> Outcome:
    previous = reservation.at_risk_reason
    _at_risk_save(reservation, reason="", since=None)
    _audit(
        reservation,
        action="reservation.at-risk.cleared",
        reason=why,
        data={**data, "previousReason": previous},
    )
    return Outcome("cleared", why)


def _pool_freed(pool_id: str) -> int:
    found = rows(
        "SELECT COALESCE(sum(freed), 0) FROM pool_capacity_rollup WHERE pool_id = %(pool)s", {"pool": pool_id}
    )
    return int(found[0][0])


def _enqueue_deliveries(reservation_id: str) -> None:
    from reservations.delivery.outbox import delivery_enqueue

    # The old nodes drop what they no longer run, the new ones take the assignment.
    delivery_enqueue(reservation_id=reservation_id, kind="shorten")
    delivery_enqueue(reservation_id=reservation_id, kind="assign")


def _locked(reservation_id: str) -> Reservation | None:
    from django.db.models import DateTimeField
    from django.db.models.expressions import RawSQL

    now = RawSQL("compute_now()", [], output_field=DateTimeField())
    return (
        Reservation.objects.filter(pk=reservation_id)
        .annotate(db_now=now)
        .select_for_update(skip_locked=True, of=("self",))
        .first()
    )


# The reason of the look a lost deadlock ended (`reservation_repair_or_later`).
LOST_DEADLOCK = "it lost a deadlock every time; the worker's next run looks again"


def reservation_repair_or_later(*, reservation_id: str) -> Outcome:
    """`reservation_repair` for a caller whose own work has committed: a lost deadlock is not its failure.

    The sweep, a maintenance change that freed or took capacity: the look is
    left to the worker's next run (nothing was written), and the caller goes on.
    """
    try:
        return reservation_repair(reservation_id=reservation_id)
    except OperationalError as exc:
        if not lost_deadlock(exc):
            raise
        logger.warning("repair of %s lost a deadlock; the next run retries it", reservation_id)
        return Outcome(None, LOST_DEADLOCK)


@deadlock_retried
def reservation_repair(*, reservation_id: str) -> Outcome:
    """Look at one reservation in its own transaction: move it, mark it, clear its mark, or nothing.

    Skips (nothing) a reservation another transaction holds: a release, a
    renewal, or another worker repairing it. A lost deadlock runs the look
    again (`core.retry`); the last one lost raises.
    """
    with transaction.atomic():
        reservation = _locked(reservation_id)
        if reservation is None:
            return Outcome(None)
        now: datetime = reservation.db_now  # type: ignore[attr-defined]
        data: dict[str, Any] = {"tenantId": reservation.tenant_id, "poolId": reservation.pool_id}
        if reservation.state not in LIVE_STATES or reservation.ends_at <= now:
            if reservation.at_risk_since is not None:
                return _clear(
                    reservation, why=f"the reservation is no longer live ({reservation.state})", data=data
                )
            return Outcome(None)
        rows(_LOCK_NODES_SQL, {"reservation": reservation.pk})
        reason = problems_reason(reservation.pk)
        if not reason:
            if reservation.at_risk_since is not None:
                return _clear(reservation, why="every booking is on schedulable atoms again", data=data)
            return Outcome(None)
        if reservation.starts_at <= now:
            return _mark(reservation, reason=f"{reason}; it is running and cannot move", now=now, data=data)
        if reservation.binding == Binding.NODE:
            return _mark(reservation, reason=f"{reason}; a whole-node lease is not moved", now=now, data=data)
        try:
            request = _request_of(reservation)
            pool = Pool.objects.get(pk=reservation.pool_id)
        except InvalidInput as exc:
            return _mark(
                reservation, reason=f"{reason}; its request cannot be placed again: {exc}", now=now, data=data
            )
        window = Window(start=reservation.starts_at, end=reservation.ends_at, now=now)
        # Read before the attempt (an earlier statement, an earlier snapshot): capacity given
        # back after it is counted as new, so a failed attempt that could not see it is retried.
        freed = _pool_freed(reservation.pool_id)
        try:
            with transaction.atomic():
                old_nodes, given_back = _remove(reservation)
                placement = _place(reservation=reservation, request=request, pool=pool, window=window)
        except _NoPlacement as exc:
            return _mark(
                reservation,
                reason=f"{reason}; no other placement fits: {exc}",
                now=now,
                data=data,
                freed=freed,
            )
        rollup_apply_deltas(
            pool_id=reservation.pool_id,
            # Every atom was locked schedulable, healthy and bookable: all of it is counted.
            deltas=_merge(given_back, placement_deltas(placement)),
        )
        was_at_risk = reservation.at_risk_since is not None
        if was_at_risk:
            _at_risk_save(reservation, reason="", since=None)
        new_nodes = sorted(allocation.node_id for allocation, _member in placement.allocations)
        _audit(
            reservation,
            action="reservation.repaired",
            reason=reason,
            data={**data, "fromNodes": sorted(old_nodes), "toNodes": new_nodes, "atRiskCleared": was_at_risk},
        )
        _enqueue_deliveries(reservation.pk)
        return Outcome("repaired", reason)
