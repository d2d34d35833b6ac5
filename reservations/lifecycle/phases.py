"""Booking phases on time: move bookings from `reserved` to `allocated` to over, with their deltas.

A booking's `phase` (`reservations.models.BookingPhase`) says where the
rollups count it: FUTURE in `reserved`, RUNNING in `allocated`, OVER nowhere.
The insert trigger sets it from the clock; this module moves it forward when
the clock passes the booking's start or end, and applies the matching rollup
deltas in the same transaction, so the rows never wait for a rebuild.

Each batch is its own transaction, taking its locks in the order every
other writer of bookings takes them (nodes, then bookings, then rollup rows):

1. find due bookings (no lock yet);
2. lock their nodes `FOR SHARE`, in id order: a node or device change (which
   holds the node `FOR UPDATE`, `reservations.nodes.changes`) either committed
   before, and is seen by step 4, or waits for this batch;
3. lock the bookings still due `FOR UPDATE SKIP LOCKED`: two workers never
   move one booking twice, and a booking a release is cutting is left to the
   release (which ends it from the phase it has);
4. in a new statement (a snapshot taken after the locks), set the new phase
   and count the moved bookings on counted atoms (a maintenance window's
   bookings never count: `reservations.rollups.counts`), then apply the deltas of
   every pool in one statement, in the rebuild's row order.

A booking that ends wakes the creates waiting on its pool.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from django.db import connection, transaction

from reservations.models import BookingPhase
from reservations.rollups.counts import COUNTED_ATOM_SQL
from reservations.rollups.deltas import rollup_apply_count_deltas
from reservations.waits import notify_release

# Step 1: the due bookings of each kind, oldest deadline first, through the
# partial indexes `booking_phase_future` and `booking_phase_running`.
_DUE_SQL = """
(SELECT b.id, b.device_id, 0 FROM device_bookings b
  WHERE b.phase = 0 AND lower(b.during) <= compute_now()
  ORDER BY lower(b.during) LIMIT %(limit)s)
UNION ALL
(SELECT b.id, b.device_id, 1 FROM device_bookings b
  WHERE b.phase = 1 AND upper(b.during) <= compute_now()
  ORDER BY upper(b.during) LIMIT %(limit)s)
"""

# Step 2.
_LOCK_NODES_SQL = """
SELECT n.id FROM inventory_node n
 WHERE n.id IN (SELECT d.node_id FROM inventory_device d WHERE d.id = ANY(%(devices)s::bigint[]))
 ORDER BY n.id
   FOR SHARE OF n
"""

# Step 3: the condition is checked again on the row as locked (another worker may have moved it).
_LOCK_BOOKINGS_SQL = """
SELECT b.id FROM device_bookings b
 WHERE b.id = ANY(%(ids)s::bigint[])
   AND ((b.phase = 0 AND lower(b.during) <= compute_now())
        OR (b.phase = 1 AND upper(b.during) <= compute_now()))
 ORDER BY b.id
   FOR UPDATE SKIP LOCKED
"""

# Step 4: the bookings are ours, so their old phase is read from the snapshot.
_MOVE_SQL = f"""
WITH moved AS (
    UPDATE device_bookings b
       SET phase = CASE WHEN upper(b.during) <= compute_now() THEN 2 ELSE 1 END
      FROM device_bookings old
     WHERE old.id = b.id AND b.id = ANY(%(ids)s::bigint[])
       AND ((b.phase = 0 AND lower(b.during) <= compute_now())
            OR (b.phase = 1 AND upper(b.during) <= compute_now()))
    RETURNING b.device_id, b.purpose, old.phase AS was, b.phase AS now
)
SELECT n.pool_id, d.device_class, m.was, m.now,
       {COUNTED_ATOM_SQL} AND m.purpose <> 'maintenance' AS counted, count(*)
  FROM moved m
  JOIN inventory_device d ON d.id = m.device_id
  JOIN inventory_node n ON n.id = d.node_id
  JOIN inventory_pool p ON p.id = n.pool_id
 GROUP BY 1, 2, 3, 4, 5
"""

# The column of a phase in the rollup rows (OVER: none).
_COLUMN = {BookingPhase.FUTURE: "reserved", BookingPhase.RUNNING: "allocated"}


def _advance_batch(limit: int) -> tuple[int, bool]:
    """One transaction: move up to `limit` bookings of each kind; (how many moved, whether more are due)."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_DUE_SQL, {"limit": limit})
        due = cursor.fetchall()
        if not due:
            return 0, False
        kinds = [kind for _, _, kind in due]
        more = kinds.count(0) >= limit or kinds.count(1) >= limit
        cursor.execute(_LOCK_NODES_SQL, {"devices": sorted({device for _, device, _ in due})})
        cursor.fetchall()
        cursor.execute(_LOCK_BOOKINGS_SQL, {"ids": [booking for booking, _, _ in due]})
        ours = [booking for (booking,) in cursor.fetchall()]
        if not ours:
            # All held by other transactions: theirs to move (or the next call's), not ours to spin on.
            return 0, False
        cursor.execute(_MOVE_SQL, {"ids": ours})
        groups = cursor.fetchall()
        deltas: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
        ended: set[str] = set()
        moved = 0
        for pool_id, resource, was, now, counted, count in groups:
            moved += count
            if not counted:
                continue
            deltas[(pool_id, resource)][_COLUMN[was]] -= count
            if now in _COLUMN:
                deltas[(pool_id, resource)][_COLUMN[now]] += count
            else:
                ended.add(pool_id)
        rollup_apply_count_deltas(deltas=deltas)
        for pool_id in sorted(ended):
            notify_release(pool_id=pool_id)
    return moved, more


def bookings_advance(*, limit: int = 5000) -> int:
    """Move every booking whose start or end has passed to its phase; return how many moved.

    FUTURE bookings that started become RUNNING (`reserved` to `allocated`),
    RUNNING ones that ended become OVER (out of `allocated`), and a FUTURE one
    whose whole window passed goes straight to OVER; each batch of up to
    `limit` of each kind is its own transaction. Bookings another transaction
    holds are skipped, to be moved by whoever holds them or by the next call.
    """
    total = 0
    while True:
        moved, more = _advance_batch(limit)
        total += moved
        if not more:
            return total


_NEXT_BOUNDARY_SQL = """
SELECT LEAST(
    (SELECT min(lower(b.during)) FROM device_bookings b WHERE b.phase = 0),
    (SELECT min(upper(b.during)) FROM device_bookings b WHERE b.phase = 1)
)
"""


def bookings_next_boundary() -> datetime | None:
    """When the next booking starts or ends (the worker sleeps until then); None when none will.

    Two probes of the partial phase indexes; the instant may already have
    passed when a booking is waiting for `bookings_advance`.
    """
    with connection.cursor() as cursor:
        cursor.execute(_NEXT_BOUNDARY_SQL)
        row = cursor.fetchone()
    return None if row is None else row[0]
