"""The stand-in daemon accepts a reservation's atoms and claims on a node, or refuses them all (guard 6)."""

from __future__ import annotations

import json
import logging
from datetime import datetime
from functools import partial
from typing import Any

from django.db import connection

from reservations.delivery.daemon.base import (
    AllocationFailed,
    Assignment,
    Held,
    NodeAssignment,
    joined,
    json_value,
    lock_nodes,
)
from reservations.delivery.daemon.shorten import daemon_shorten

logger = logging.getLogger(__name__)


def _check_claims(
    cursor: Any,
    *,
    node_id: str,
    reservation_id: str,
    resources: dict[str, int],
    start: datetime,
    end: datetime,
) -> None:
    """Refuse (AllocationFailed) claims that do not fit what the node has over `[start, end)`."""
    wanted = {name: int(amount) for name, amount in resources.items() if int(amount) > 0}
    if not wanted:
        return
    # What the node has, as it reported it.
    cursor.execute(
        "SELECT resource, floor(allocatable * ratio)::bigint FROM inventory_noderesource"
        " WHERE node_id = %s AND resource = ANY(%s)",
        [node_id, sorted(wanted)],
    )
    capacity = {name: int(amount) for name, amount in cursor.fetchall()}
    # What it already holds for windows overlapping this one (its own earlier rows excepted:
    # a redelivery replaces them).
    cursor.execute(
        "SELECT reservation_id, resources FROM fake_daemon_claims"
        " WHERE node_id = %s AND reservation_id <> %s AND starts_at < %s AND %s < ends_at ORDER BY id",
        [node_id, reservation_id, end, start],
    )
    held: dict[str, int] = {}
    holders: dict[str, list[str]] = {}
    for holder, claims in cursor.fetchall():
        for name, amount in (json_value(claims) or {}).items():
            if name in wanted and int(amount) > 0:
                held[name] = held.get(name, 0) + int(amount)
                holders.setdefault(name, []).append(holder)
    for name, amount in sorted(wanted.items()):
        has = capacity.get(name, 0)
        if held.get(name, 0) + amount > has:
            by = holders.get(name, [])
            raise AllocationFailed(
                f"{name} on {node_id}",
                by[0] if by else "",
                message=f"{name} on {node_id}: {amount} asked, {held.get(name, 0)} of {has} already claimed"
                + (f" by {', '.join(sorted(set(by)))}" if by else ""),
                holders=tuple(sorted(set(by))),
            )


def daemon_assign(
    *,
    node_id: str,
    reservation_id: str,
    allocation_id: str,
    assignments: list[Assignment],
    resources: dict[str, int] | None = None,
    node_profile: dict[str, Any] | None = None,
) -> None:
    """Accept the atoms and claims on this node, or refuse them all with AllocationFailed."""
    with joined(), connection.cursor() as cursor:
        lock_nodes(cursor, [node_id])
        _assign_held(
            cursor,
            NodeAssignment(
                node_id=node_id,
                reservation_id=reservation_id,
                allocation_id=allocation_id,
                atoms=assignments,
                resources=resources or {},
                node_profile=node_profile,
            ),
        )


_ACCEPT_SQL = """
WITH atoms AS (
    INSERT INTO fake_daemon_assignments
           (node_id, device_uid, reservation_id, allocation_id, starts_at, ends_at)
    SELECT %(node)s, f.uid, %(reservation)s, %(allocation)s, f.starts_at, f.ends_at
      FROM unnest(%(uids)s::varchar[], %(starts)s::timestamptz[], %(ends)s::timestamptz[])
           AS f(uid, starts_at, ends_at)
)
INSERT INTO fake_daemon_claims
       (node_id, reservation_id, allocation_id, resources, node_profile, starts_at, ends_at)
VALUES (%(node)s, %(reservation)s, %(allocation)s, %(resources)s::jsonb, %(profile)s::jsonb,
        %(start)s, %(end)s)
ON CONFLICT (allocation_id) DO UPDATE SET resources = EXCLUDED.resources,
    node_profile = EXCLUDED.node_profile, starts_at = EXCLUDED.starts_at, ends_at = EXCLUDED.ends_at
"""


def _assign_held(cursor: Any, assignment: NodeAssignment, held: Held | None = None) -> None:
    """`daemon_assign`'s work, with the node's lock held: every check before the first write.

    `held`: what the node holds of these atoms, when read since the lock was taken.
    """
    node_id, reservation_id, allocation_id = (
        assignment.node_id,
        assignment.reservation_id,
        assignment.allocation_id,
    )
    assignments, resources = assignment.atoms, assignment.resources
    if held is None:
        cursor.execute(
            "SELECT id, device_uid, reservation_id, allocation_id, starts_at, ends_at"
            " FROM fake_daemon_assignments WHERE node_id = %s AND device_uid = ANY(%s)",
            [node_id, [uid for uid, _, _ in assignments]],
        )
        held = {}
        for row_id, uid, holder, held_allocation, start, end in cursor.fetchall():
            held.setdefault(uid, []).append((row_id, holder, held_allocation, start, end))
    fresh: list[Assignment] = []
    moved: list[tuple[int, datetime, datetime]] = []
    for uid, start, end in assignments:
        same: list[tuple[int, datetime, datetime]] = []
        for row_id, holder, held_allocation, held_start, held_end in held.get(uid, []):
            if holder == reservation_id:
                if held_allocation == allocation_id:
                    same.append((row_id, held_start, held_end))
            elif start < held_end and held_start < end:
                raise AllocationFailed(uid, holder)
        if any((held_start, held_end) == (start, end) for _, held_start, held_end in same):
            continue  # a redelivery adds only what the node lacks
        if same:
            moved.append((same[0][0], start, end))  # the control plane's latest word on its own booking
        else:
            fresh.append((uid, start, end))
    if not assignments:
        return
    window_start = min(start for _, start, _ in assignments)
    window_end = max(end for _, _, end in assignments)
    _check_claims(
        cursor,
        node_id=node_id,
        reservation_id=reservation_id,
        resources=resources,
        start=window_start,
        end=window_end,
    )
    for row_id, start, end in moved:
        cursor.execute(
            "UPDATE fake_daemon_assignments SET starts_at = %s, ends_at = %s WHERE id = %s",
            [start, end, row_id],
        )
    cursor.execute(
        _ACCEPT_SQL,
        {
            "node": node_id,
            "reservation": reservation_id,
            "allocation": allocation_id,
            "uids": [uid for uid, _, _ in fresh],
            "starts": [start for _, start, _ in fresh],
            "ends": [end for _, _, end in fresh],
            "resources": json.dumps({name: int(amount) for name, amount in sorted(resources.items())}),
            "profile": None if assignment.node_profile is None else json.dumps(assignment.node_profile),
            "start": window_start,
            "end": window_end,
        },
    )


# The node's record is read per atom of the reservation (`LATERAL`, by the device index): the
# record keeps every holder an atom ever had, so the scan of it the planner chose for a
# semi-join grew with the fleet's history (0.47 ms at 3,400 rows, against 0.17 ms per atom).
_ASSIGNMENTS_AND_HOLDINGS_SQL = """
WITH mine AS (
    SELECT a.node_id, a.id AS allocation_id, a.resources, r.request -> 'node' AS profile, d.uid,
           lower(b.during) AS lo, upper(b.during) AS hi
      FROM reservations_allocation a JOIN reservations_reservation r ON r.id = a.reservation_id
      JOIN device_bookings b ON b.allocation_id = a.id
      JOIN inventory_device d ON d.id = b.device_id
     WHERE a.reservation_id = %(reservation)s AND a.node_id = ANY(%(nodes)s)
)
SELECT true, node_id, allocation_id, resources, profile, uid, lo, hi, NULL::bigint, NULL::varchar
  FROM mine
UNION ALL
SELECT false, f.node_id, f.allocation_id, NULL::jsonb, NULL::jsonb, f.device_uid, f.starts_at, f.ends_at,
       f.id, f.reservation_id
  FROM (SELECT DISTINCT node_id, uid FROM mine) m
 CROSS JOIN LATERAL (
    SELECT * FROM fake_daemon_assignments f WHERE f.device_uid = m.uid AND f.node_id = m.node_id
       -- Another holder that ended before this reservation's first booking starts overlaps none
       -- of them: an atom booked again and again would otherwise bring every earlier holder back.
       AND (f.reservation_id = %(reservation)s OR f.ends_at > (SELECT min(lo) FROM mine))
    OFFSET 0  -- kept a subquery run per atom: not flattened into one join over the whole record
 ) f
 ORDER BY 1 DESC, 2, 3, 6, 9
"""


def _assignments_and_holdings(
    reservation_id: str, node_ids: list[str]
) -> tuple[list[NodeAssignment], dict[str, Held]]:
    """The reservation's assignments on `node_ids`, and per node what it holds of their atoms."""
    with connection.cursor() as cursor:
        cursor.execute(_ASSIGNMENTS_AND_HOLDINGS_SQL, {"reservation": reservation_id, "nodes": node_ids})
        rows = cursor.fetchall()
    out: dict[tuple[str, str], NodeAssignment] = {}
    held: dict[str, Held] = {}
    for mine, node_id, allocation_id, resources, profile, uid, start, end, row_id, holder in rows:
        if not mine:
            held.setdefault(node_id, {}).setdefault(uid, []).append(
                (row_id, holder, allocation_id, start, end)
            )
            continue
        key = (node_id, allocation_id)
        if key not in out:
            out[key] = NodeAssignment(
                node_id=node_id,
                reservation_id=reservation_id,
                allocation_id=allocation_id,
                atoms=[],
                resources={name: int(amount) for name, amount in (json_value(resources) or {}).items()},
                node_profile=json_value(profile),
            )
        out[key].atoms.append((uid, start, end))
    return [out[key] for key in sorted(out)], held


def _known_reservation(reservation_id: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM reservations_reservation WHERE id = %s", [reservation_id])
        return cursor.fetchone() is not None


_OPEN_SQL = """
WITH r AS (
    SELECT r.id, r.state IN ('scheduled', 'active') AS live,
           ARRAY(SELECT DISTINCT a.node_id FROM reservations_allocation a
                   JOIN inventory_node n ON n.id = a.node_id AND NOT n.agent
                  WHERE a.reservation_id = r.id ORDER BY 1) AS daemons,
           ARRAY(SELECT DISTINCT a.node_id FROM reservations_allocation a
                   JOIN inventory_node n ON n.id = a.node_id AND n.agent
                  WHERE a.reservation_id = r.id ORDER BY 1) AS agents
      FROM reservations_reservation r WHERE r.id = %s
)
SELECT r.live, r.daemons, r.agents,
       CASE WHEN r.live THEN (SELECT count(pg_advisory_xact_lock(hashtext('fake-daemon:' || n)))
                                FROM unnest(r.daemons) AS n) END
  FROM r
"""


def daemon_open(*, reservation_id: str) -> tuple[bool, list[str], list[str]]:
    """(still runs, nodes without an agent, nodes with one); when it runs, the former's daemons are held.

    For the caller's transaction: `daemon_deliver(node_ids=...)` then sends to
    the held nodes. A reservation that is gone runs nowhere.
    """
    with connection.cursor() as cursor:
        cursor.execute(_OPEN_SQL, [reservation_id])
        row = cursor.fetchone()
    if row is None:
        return False, [], []
    return bool(row[0]), list(row[1]), list(row[2])


def daemon_deliver(*, reservation_id: str, node_ids: list[str] | None = None) -> AllocationFailed | None:
    """Send a committed reservation's assignments (atoms, claims, profile) to its nodes; the refusal, if any.

    The daemon only answers; the control plane (`reservations.delivery.sending.reservation_deliver`)
    releases a refused reservation. An unreachable node raises (the outbox retries).
    `node_ids` are the reservation's nodes without an agent, their daemons
    already held in the caller's transaction (`daemon_open`).

    What is sent to a node is read from the bookings while that node's daemon
    is held, so a message never carries a state older than one the node has
    already been told: a create's delivery that runs after its own release
    sends the shortened bookings, not the ones it was created with. The nodes'
    locks are taken in one statement and the bookings read in the next (its
    snapshot is taken once the locks are held).
    """
    try:
        with joined(), connection.cursor() as cursor:
            if node_ids is None:
                cursor.execute(
                    # A node with its own agent hears through `reservations.delivery.agent` instead.
                    "SELECT DISTINCT a.node_id FROM reservations_allocation a"
                    " JOIN inventory_node n ON n.id = a.node_id AND NOT n.agent"
                    " WHERE a.reservation_id = %s ORDER BY 1",
                    [reservation_id],
                )
                node_ids = [node_id for (node_id,) in cursor.fetchall()]
                if not node_ids:
                    return None
                lock_nodes(cursor, node_ids)
            elif not connection.in_atomic_block:
                raise ValueError("daemon_deliver(node_ids=...) runs in the transaction that held them")
            assignments, held = _assignments_and_holdings(reservation_id, node_ids)
            for assignment in assignments:
                _assign_or_refresh(cursor, assignment, held.get(assignment.node_id, {}))
    except AllocationFailed as exc:
        logger.warning("node refused reservation %s: %s", reservation_id, exc)
        return exc
    return None


def _assign_or_refresh(cursor: Any, assignment: NodeAssignment, held: Held) -> None:
    assign = partial(_assign_held, cursor, assignment)
    try:
        assign(held)
    except AllocationFailed as exc:
        # A release commits, then tells the node (after commit); a create that
        # books the freed atoms or scalars can deliver before that news arrives.
        # When every holder is a reservation the control plane knows, bring the
        # node's record of them up to date and ask once more: a holder still
        # booked keeps its rows, and one the node holds without the control plane
        # knowing it is never dropped, so a true overlap is still refused.
        if not exc.holders or not all(_known_reservation(holder) for holder in exc.holders):
            raise
        for holder in exc.holders:
            daemon_shorten(reservation_id=holder, node_id=assignment.node_id)
        assign()
