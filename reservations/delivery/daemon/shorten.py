"""The stand-in daemon cuts its record of a reservation to its shortened bookings, never adding a row."""

from __future__ import annotations

from django.db import connection

from reservations.delivery.daemon.base import joined

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
    with joined(), connection.cursor() as cursor:
        if held is None:
            cursor.execute(SHORTEN_LOCK_SQL, params)
            row = cursor.fetchone()
            held = int(row[0]) if row is not None else 0
        if not held:
            return  # the node holds nothing of it
        cursor.execute(_SHORTEN_SQL, params)
