"""BookingRepair's invariant, recounted from the rows; check it once `bookings_repair()` ran, at rest.

Every live reservation with a booking still counted somewhere (phase 0 or 1,
not over) on an atom that is not counted (its node outside the schedulable
bucket, or the device unhealthy or unbookable) or inside a maintenance window
of its node must be marked at risk: it is
running, bound to its nodes, or nothing else fits. And the other way round: a
mark stands only on a live reservation that still has such a booking.
"""

from __future__ import annotations

from typing import Any

from django.db import connection

from inventory.schedulability import schedulable_sql
from reservations.maintenance.windows import IN_WINDOW_RESERVATIONS_SQL

_ON_UNCOUNTED = f"""
SELECT DISTINCT a.reservation_id
  FROM reservations_allocation a
  JOIN device_bookings b ON b.allocation_id = a.id
  JOIN inventory_device d ON d.id = b.device_id
  JOIN inventory_node n ON n.id = d.node_id
  JOIN inventory_pool p ON p.id = n.pool_id
 WHERE NOT a.released AND b.phase IN (0, 1) AND upper(b.during) > compute_now()
   AND NOT ({schedulable_sql("n", "p.owner_id")} AND d.healthy AND d.bookable)
UNION
SELECT x.id FROM ({IN_WINDOW_RESERVATIONS_SQL}) x
"""

_LIVE = "r.state IN ('scheduled', 'active') AND r.ends_at > compute_now()"


def _rows(sql: str) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchall()


def check_repaired() -> list[str]:
    """What BookingRepair left undone: unmarked reservations on uncounted atoms, marks that no longer hold."""
    unmarked = _rows(
        f"SELECT r.id FROM reservations_reservation r WHERE r.id IN ({_ON_UNCOUNTED})"
        f" AND {_LIVE} AND r.at_risk_since IS NULL ORDER BY r.id"
    )
    stale = _rows(
        f"SELECT r.id, r.at_risk_reason FROM reservations_reservation r WHERE r.at_risk_since IS NOT NULL"
        f" AND NOT ({_LIVE} AND r.id IN ({_ON_UNCOUNTED})) ORDER BY r.id"
    )
    return [
        *(
            f"{rid}: a live booking on an atom that is not counted, and it is not at risk"
            for (rid,) in unmarked
        ),
        *(f"{rid}: marked at risk ({reason}) with nothing left at risk" for rid, reason in stale),
    ]


def at_risk_count() -> int:
    """How many reservations carry the mark (the runs print it)."""
    return int(_rows("SELECT count(*) FROM reservations_reservation WHERE at_risk_since IS NOT NULL")[0][0])
