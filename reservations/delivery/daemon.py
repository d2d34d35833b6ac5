"""A fake node daemon: guard 6, defence in depth on the node side.

The real daemon keeps its own record of what it was told to run and refuses
an assignment that overlaps one it already holds, whatever the control plane
believes. This stand-in keeps that record in its own tables:

* `fake_daemon_assignments`: the atoms (node, device uid, reservation,
  `[starts_at, ends_at)`), checked for overlaps in Python against what it
  holds, never trusting the control plane's constraint;
* `fake_daemon_claims`: one row per allocation with its scalar claims
  (`vcpu`, `memoryGiB`, `hugepages1Gi`) and the node profile it was asked to
  run, for the allocation's window. An assignment whose claims, added to what
  the node already holds for overlapping windows, exceed what the node has
  (`floor(allocatable * ratio)`, what it reported) is refused like an
  overlapping atom.

A refused assignment answers `AllocationFailed` and leaves no trace on the
node; the control plane releases the reservation. The node side never calls
the control plane: it answers, and the caller acts.

Assignments are delivered after the booking transaction commits, through the
outbox (`reservations.delivery.outbox`), never while the placer's locks are held. Every
delivery is idempotent: an assignment the node already holds adds nothing.
"""

from __future__ import annotations

import json
import logging
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any

from django.db import connection, transaction

logger = logging.getLogger(__name__)


class AllocationFailed(Exception):
    """The node refused an assignment: an atom overlaps one it holds, or its scalar claims do not fit."""

    def __init__(
        self, device_uid: str, holder: str, *, message: str = "", holders: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message or f"{device_uid} is already assigned to {holder}")
        self.device_uid = device_uid
        self.holder = holder
        # Every reservation whose hold on the node stands in the way (one for an atom).
        self.holders = holders or (holder,)


Assignment = tuple[str, datetime, datetime]  # (device uid, start, end)


@dataclass(frozen=True)
class NodeAssignment:
    """What one node is told about one allocation: its atoms, scalar claims and node profile."""

    node_id: str
    reservation_id: str
    allocation_id: str
    atoms: list[Assignment]
    resources: dict[str, int] = field(default_factory=dict)
    node_profile: dict[str, Any] | None = None


def _json(value: Any) -> Any:
    # Django hands raw jsonb columns back as text.
    return json.loads(value) if isinstance(value, str) else value


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
        for name, amount in (_json(claims) or {}).items():
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


def _joined() -> AbstractContextManager[Any]:
    """The caller's transaction when there is one (no savepoint: a refusal raises before any write), else one.

    Each message's writes commit with whatever delivered it (the outbox row's
    deletion); called on its own (a test, the resync), a message is its own
    transaction, so the node's lock is held until its writes commit.
    """
    return nullcontext() if connection.in_atomic_block else transaction.atomic()


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
    with _joined(), connection.cursor() as cursor:
        _lock_nodes(cursor, [node_id])
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


# The node's new atoms and its claims row, in one statement.
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


Held = dict[
    str, list[tuple[int, str, str, datetime, datetime]]
]  # uid → (row, holder, allocation, start, end)


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


def _assignments_of(reservation_id: str, node_id: str | None = None) -> list[NodeAssignment]:
    """What the control plane committed for a reservation (on one node, if named), one per allocation."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT a.node_id, a.id, a.resources, r.request -> 'node', d.uid,"
            " lower(b.during), upper(b.during)"
            " FROM reservations_allocation a JOIN reservations_reservation r ON r.id = a.reservation_id"
            " JOIN device_bookings b ON b.allocation_id = a.id"
            " JOIN inventory_device d ON d.id = b.device_id WHERE a.reservation_id = %s"
            " AND (%s::varchar IS NULL OR a.node_id = %s)"
            " ORDER BY a.node_id, a.id, d.uid",
            [reservation_id, node_id, node_id],
        )
        out: dict[tuple[str, str], NodeAssignment] = {}
        for node_id, allocation_id, resources, profile, uid, start, end in cursor.fetchall():
            key = (node_id, allocation_id)
            if key not in out:
                out[key] = NodeAssignment(
                    node_id=node_id,
                    reservation_id=reservation_id,
                    allocation_id=allocation_id,
                    atoms=[],
                    resources={name: int(amount) for name, amount in (_json(resources) or {}).items()},
                    node_profile=_json(profile),
                )
            out[key].atoms.append((uid, start, end))
    return [out[key] for key in sorted(out)]


# What the control plane committed for a reservation on these nodes, and what those nodes
# already hold of the same atoms (any reservation's), in one statement read with the nodes'
# daemons held.
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
  FROM fake_daemon_assignments f WHERE (f.node_id, f.device_uid) IN (SELECT node_id, uid FROM mine)
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
                resources={name: int(amount) for name, amount in (_json(resources) or {}).items()},
                node_profile=_json(profile),
            )
        out[key].atoms.append((uid, start, end))
    return [out[key] for key in sorted(out)], held


def _known_reservation(reservation_id: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM reservations_reservation WHERE id = %s", [reservation_id])
        return cursor.fetchone() is not None


def _lock_nodes(cursor: Any, node_ids: list[str]) -> None:
    """One node's daemon handles one message at a time, as a real agent would (held to commit).

    Several nodes in one statement, in id order (every message takes them in that order).
    """
    cursor.execute(
        "SELECT count(pg_advisory_xact_lock(hashtext('fake-daemon:' || n)))"
        " FROM (SELECT n FROM unnest(%s::varchar[]) AS n ORDER BY n) AS nodes",
        [sorted(set(node_ids))],
    )


# Whether the reservation still runs, its nodes without and with an agent, and (when it runs)
# the daemons of the first held, in node order: one round trip. Which node an allocation is
# on never changes, so the node lists need no lock; the bookings are read in the next statement.
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
        with _joined(), connection.cursor() as cursor:
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
                _lock_nodes(cursor, node_ids)
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


# What the node keeps of a reservation, set against its bookings now: an atom (a claim) whose
# booking ended before its start, or that has none, is dropped; one whose booking ends sooner is
# cut to that end. Rows are cut or dropped, never added. Run once the nodes' locks are held.
_SHORTEN_SQL = """
WITH booked AS (
    SELECT a.id AS allocation_id, d.uid, max(upper(b.during)) AS ends_at
      FROM reservations_allocation a JOIN device_bookings b ON b.allocation_id = a.id
      JOIN inventory_device d ON d.id = b.device_id
     WHERE a.reservation_id = %(reservation)s
     GROUP BY a.id, d.uid
), allocation_ends AS (
    SELECT allocation_id, max(ends_at) AS ends_at FROM booked GROUP BY allocation_id
), atoms_dropped AS (
    DELETE FROM fake_daemon_assignments f
     WHERE f.reservation_id = %(reservation)s
       AND (%(node)s::varchar IS NULL OR f.node_id = %(node)s)
       AND NOT EXISTS (SELECT 1 FROM booked k WHERE k.allocation_id = f.allocation_id
                          AND k.uid = f.device_uid AND k.ends_at > f.starts_at)
    RETURNING 1
), atoms_cut AS (
    UPDATE fake_daemon_assignments f SET ends_at = k.ends_at FROM booked k
     WHERE f.reservation_id = %(reservation)s
       AND (%(node)s::varchar IS NULL OR f.node_id = %(node)s) AND k.allocation_id = f.allocation_id
       AND k.uid = f.device_uid AND k.ends_at > f.starts_at AND k.ends_at < f.ends_at
    RETURNING 1
), claims_dropped AS (
    DELETE FROM fake_daemon_claims c
     WHERE c.reservation_id = %(reservation)s
       AND (%(node)s::varchar IS NULL OR c.node_id = %(node)s)
       AND NOT EXISTS (SELECT 1 FROM allocation_ends e WHERE e.allocation_id = c.allocation_id
                          AND e.ends_at > c.starts_at)
    RETURNING 1
), claims_cut AS (
    UPDATE fake_daemon_claims c SET ends_at = e.ends_at FROM allocation_ends e
     WHERE c.reservation_id = %(reservation)s
       AND (%(node)s::varchar IS NULL OR c.node_id = %(node)s) AND e.allocation_id = c.allocation_id
       AND e.ends_at > c.starts_at AND e.ends_at < c.ends_at
    RETURNING 1
)
SELECT (SELECT count(*) FROM atoms_dropped), (SELECT count(*) FROM atoms_cut),
       (SELECT count(*) FROM claims_dropped), (SELECT count(*) FROM claims_cut)
"""

# Each node holding the reservation, its daemon held, in node order (one statement); how many.
# Takes `%(reservation)s` and `%(node)s` (NULL: every node).
SHORTEN_LOCK_SQL = """
SELECT count(pg_advisory_xact_lock(hashtext('fake-daemon:' || node_id))) FROM (
    SELECT node_id FROM fake_daemon_assignments WHERE reservation_id = %(reservation)s
       AND (%(node)s::varchar IS NULL OR node_id = %(node)s)
     UNION SELECT node_id FROM fake_daemon_claims WHERE reservation_id = %(reservation)s
       AND (%(node)s::varchar IS NULL OR node_id = %(node)s)
     ORDER BY 1) AS held
"""


def daemon_shorten(*, reservation_id: str, node_id: str | None = None, held: int | None = None) -> None:
    """Bring the node's record of a reservation in line with its (shortened) bookings.

    Atoms and claims alike: only what the node accepted is ever kept, rows are
    cut or dropped, never added, so a refused assignment leaves no trace.
    Two statements: the nodes' locks, then the cut (its snapshot, and so the
    bookings it reads, taken once the locks are held). `held`: how many nodes'
    daemons the caller's transaction already holds for it (`SHORTEN_LOCK_SQL`
    in a statement of its own).
    """
    params = {"reservation": reservation_id, "node": node_id}
    if held is not None and not connection.in_atomic_block:
        raise ValueError("daemon_shorten(held=...) runs in the transaction that held them")
    with _joined(), connection.cursor() as cursor:
        if held is None:
            cursor.execute(SHORTEN_LOCK_SQL, params)
            row = cursor.fetchone()
            held = int(row[0]) if row is not None else 0
        if not held:
            return  # the node holds nothing of it
        cursor.execute(_SHORTEN_SQL, params)


def daemon_holdings(*, device_uid: str) -> list[tuple[str, datetime, datetime]]:
    """What the node believes it holds for one device: (reservation id, start, end)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT reservation_id, starts_at, ends_at FROM fake_daemon_assignments WHERE device_uid = %s"
            " ORDER BY starts_at",
            [device_uid],
        )
        return [(row[0], row[1], row[2]) for row in cursor.fetchall()]


@dataclass(frozen=True)
class ClaimHolding:
    """What the node believes one allocation claims: its scalars and profile, for a window."""

    node_id: str
    reservation_id: str
    allocation_id: str
    resources: dict[str, int]
    node_profile: dict[str, Any] | None
    starts_at: datetime
    ends_at: datetime


def daemon_claims(*, reservation_id: str) -> list[ClaimHolding]:
    """What the nodes believe a reservation claims besides atoms, one row per allocation."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT node_id, reservation_id, allocation_id, resources, node_profile, starts_at, ends_at"
            " FROM fake_daemon_claims WHERE reservation_id = %s ORDER BY node_id, allocation_id",
            [reservation_id],
        )
        return [
            ClaimHolding(
                node_id=node_id,
                reservation_id=holder,
                allocation_id=allocation_id,
                resources={name: int(amount) for name, amount in (_json(resources) or {}).items()},
                node_profile=_json(profile),
                starts_at=start,
                ends_at=end,
            )
            for node_id, holder, allocation_id, resources, profile, start, end in cursor.fetchall()
        ]


def daemon_behind(*, limit: int = 500) -> list[str]:
    """Live reservations some node does not hold as booked (an atom cut or missing, claims missing).

    Oldest id first. The outbox (`reservations.delivery.outbox`) makes this empty after
    its deliveries; it stays as an on-demand resync for a node that lost its
    own record (`reservations.delivery.sending.reservations_redeliver`).
    """
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT DISTINCT r.id FROM reservations_reservation r
              JOIN reservations_allocation a ON a.reservation_id = r.id
              JOIN inventory_node n ON n.id = a.node_id AND NOT n.agent
              JOIN device_bookings b ON b.allocation_id = a.id
              JOIN inventory_device d ON d.id = b.device_id
             WHERE r.state IN ('scheduled', 'active') AND upper(b.during) > compute_now()
               AND (NOT EXISTS (
                   SELECT 1 FROM fake_daemon_assignments f
                    WHERE f.node_id = a.node_id AND f.reservation_id = r.id AND f.device_uid = d.uid
                      AND f.starts_at = lower(b.during) AND f.ends_at = upper(b.during))
                 OR NOT EXISTS (SELECT 1 FROM fake_daemon_claims c WHERE c.allocation_id = a.id))
             ORDER BY r.id LIMIT %s
            """,
            [limit],
        )
        return [row[0] for row in cursor.fetchall()]
