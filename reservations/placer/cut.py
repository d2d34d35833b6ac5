"""The cut: the one way a reservation's bookings are ended, and what they held given back.

A release, a lease expiry, a settlement (a reservation that ran to its end)
and a spot notice all end bookings through `reservation_cut`: later bookings
are deleted, running ones shortened (bookings are history), and the scalars,
the quota and the rollup counts they held are given back once, in the
caller's transaction.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection

from inventory.services.resources import node_resources_give_back
from ledger.services.quota import quota_give_back
from reservations.models import BookingPhase
from reservations.rollups.counts import COUNTED_ATOM_SQL, COUNTED_NODE_SQL
from reservations.rollups.deltas import rollup_deltas_piggyback

# Step 1 of a cut: mark the allocations released (once: the guarded UPDATE) and
# lock their nodes FOR SHARE in id order, in one statement. A node or device
# change (which holds the node FOR UPDATE, `reservations.nodes.changes`) then
# either committed before the next statement's snapshot, and is counted there,
# or waits for this transaction; scalars are counted where their node is.
_CUT_RELEASE_SQL = f"""
WITH released AS (
    UPDATE reservations_allocation SET released = true
     WHERE reservation_id = %(reservation)s AND NOT released
    RETURNING id, node_id, resources
),
locked AS (
    SELECT n.id, {COUNTED_NODE_SQL} AS counted
      FROM inventory_node n JOIN inventory_pool p ON p.id = n.pool_id
     WHERE n.id IN (SELECT node_id FROM released)
     ORDER BY n.id
       FOR SHARE OF n
)
SELECT r.id, r.node_id, r.resources, COALESCE(l.counted, false)
  FROM released r LEFT JOIN locked l ON l.id = r.node_id
"""

# Step 2: lock the bookings (a phase move by the worker then either committed
# and is read here, or waits for this cut, which sees its rows first), count them
# by class, whether their atom is counted, their phase, and what the cut does to
# them: removes it (it starts at or after `at`), shortens it (it ends after `at`)
# or keeps it (it already ends by `at`: settlement); and do it, in the same
# statement. Bookings are history: the ones that started keep their past and end at
# `at`; later ones go. The delete and the cut touch the rows `bk` locked (disjoint:
# a booking starts before `at` or not) and run after the count, which reads the
# rows as they were.
#
# Written twice: for one allocation (most reservations) with `=`; for several, as the
# reservation's allocations among the ones released. A statement sent again and again
# is prepared, and PostgreSQL then plans it once (a generic plan) only if that plan's
# estimate is no worse than the ones it made for the actual values. For
# `allocation_id = ANY($1)` alone it must guess the array's length (ten), estimates ten
# allocations' bookings, and so planned the statement afresh for every release: about
# 0.7 ms of the database's CPU, more than running it. Through the reservation's key,
# the estimate is the reservation's allocations, whatever the array.
_CUT_COUNT_SQL = f"""
WITH bk AS MATERIALIZED (
    SELECT b.id, b.device_id, b.phase, lower(b.during) AS lo, upper(b.during) AS hi
      FROM device_bookings b
     WHERE b.allocation_id {{allocations}}
     ORDER BY b.id
       FOR UPDATE OF b
), removed AS (
    DELETE FROM device_bookings d USING bk WHERE d.id = bk.id AND bk.lo >= %(at)s
    RETURNING 1
), shortened AS (
    UPDATE device_bookings d SET during = tstzrange(lower(d.during), %(at)s, '[)'),
           phase = CASE WHEN %(at)s <= compute_now() THEN 2 ELSE d.phase END
      FROM bk WHERE d.id = bk.id AND bk.hi > %(at)s AND bk.lo < %(at)s
    RETURNING 1
)
SELECT d.device_class, {COUNTED_ATOM_SQL} AS counted, bk.phase,
       CASE WHEN bk.lo >= %(at)s THEN 'removed' WHEN bk.hi > %(at)s THEN 'shortened' ELSE 'kept' END,
       %(at)s <= compute_now() AS ends_by_now, count(*)
  FROM bk
  JOIN inventory_device d ON d.id = bk.device_id
  JOIN inventory_node n ON n.id = d.node_id
  JOIN inventory_pool p ON p.id = n.pool_id
 GROUP BY 1, 2, 3, 4, 5
"""
_CUT_COUNT_ONE_SQL = _CUT_COUNT_SQL.replace("{allocations}", "= %(allocation)s")
_CUT_COUNT_MANY_SQL = _CUT_COUNT_SQL.replace(
    "{allocations}",
    "IN (SELECT a.id FROM reservations_allocation a"
    " WHERE a.reservation_id = %(reservation)s AND a.id = ANY(%(allocations)s))",
)

# The rollup column a booking of this phase is counted in (OVER: none).
_PHASE_COLUMN = {BookingPhase.FUTURE: "reserved", BookingPhase.RUNNING: "allocated"}


@dataclass
class _GivenBack:
    """What a cut gives back: quota by resource, rollup counts by column, scalar claims by node."""

    quota: Counter[str] = field(default_factory=Counter)
    allocated: Counter[str] = field(default_factory=Counter)
    reserved: Counter[str] = field(default_factory=Counter)
    scalars: list[tuple[str, str, int]] = field(default_factory=list)

    def count_bookings(self, counts: list[tuple[Any, ...]]) -> None:
        """The bookings' atoms: all back to quota; out of the rollups those that leave their phase's count."""
        for device_class, counted, phase, fate, ends_by_now, count in counts:
            self.quota[device_class] += count
            leaves = fate == "removed" or (fate == "shortened" and ends_by_now)
            if counted and leaves and phase in _PHASE_COLUMN:
                column = self.allocated if _PHASE_COLUMN[phase] == "allocated" else self.reserved
                column[device_class] += count

    def count_scalars(self, allocations: list[tuple[Any, ...]]) -> None:
        """The allocations' scalar claims: back to their node and quota, out of the rollups where counted."""
        for _id, node_id, resources, node_counted in allocations:
            if isinstance(resources, str):  # Django leaves raw jsonb as text
                resources = json.loads(resources)
            for resource, amount in sorted((resources or {}).items()):
                amount = int(amount)
                if amount <= 0:
                    continue
                self.scalars.append((node_id, resource, amount))
                self.quota[resource] += amount
                if node_counted:
                    self.allocated[resource] += amount

    def give_back(self, *, pool_id: str, tenant_id: str) -> None:
        """Scalars to their nodes, quota to the tenant, counts out of the pool's rollups."""
        node_resources_give_back(claims=self.scalars)
        # The rollup deltas ride in the give-back's statement: one round trip for both.
        rollups = rollup_deltas_piggyback(
            pool_id=pool_id,
            deltas={
                resource: (-self.allocated[resource], -self.reserved[resource])
                for resource in set(self.allocated) | set(self.reserved)
            },
        )
        quota_give_back(pool_id=pool_id, tenant_id=tenant_id, amounts=self.quota, piggyback=rollups)


def reservation_cut(
    *,
    reservation_id: str,
    at: datetime,
    now: datetime,
    pool_id: str | None = None,
    tenant_id: str | None = None,
) -> bool:
    """End a reservation's bookings at `at`: later ones are deleted, running ones shortened.

    Gives back its scalars, quota and rollup counts once (the allocations'
    `released` flag is flipped with a guarded UPDATE, so a second cut gives
    nothing back twice). Returns whether anything was given back. A caller
    that holds the reservation row passes its `pool_id` and `tenant_id`,
    which saves reading them again.

    The rollups lose what they count of these bookings, by phase and only on
    counted atoms (`reservations.rollups.counts`): a deleted booking its phase's
    count; a booking cut to end by now (`at <= compute_now()`) its phase's
    count, and it becomes OVER; a booking cut to a later end (a spot notice)
    keeps its phase, and the worker moves it when the clock gets there. A
    booking the cut leaves as it was (settlement: it already ends at `at`) is
    the worker's to move too, so nothing is subtracted twice. Which bookings end
    by now is decided by the transaction's `compute_now()` (the clock of the
    insert trigger and of the worker), of which `now` is the caller's copy.
    """
    given = _GivenBack()
    with connection.cursor() as cursor:
        cursor.execute(_CUT_RELEASE_SQL, {"reservation": reservation_id})
        allocations = cursor.fetchall()
        if not allocations:
            return False
        if len(allocations) == 1:
            cursor.execute(_CUT_COUNT_ONE_SQL, {"allocation": allocations[0][0], "at": at})
        else:
            cursor.execute(
                _CUT_COUNT_MANY_SQL,
                {"reservation": reservation_id, "allocations": [row[0] for row in allocations], "at": at},
            )
        given.count_bookings(cursor.fetchall())
        if pool_id is None or tenant_id is None:
            cursor.execute(
                "SELECT pool_id, tenant_id FROM reservations_reservation WHERE id = %s", [reservation_id]
            )
            pool_id, tenant_id = cursor.fetchone()  # type: ignore[misc]
        assert pool_id is not None and tenant_id is not None
        given.count_scalars(allocations)
    given.give_back(pool_id=pool_id, tenant_id=tenant_id)
    return True
