"""Hourly usage: what each tenant actually held, per hour, pool, project, resource and spot flag.

What counts (the one definition, in `COMPUTE_SQL`):

* **Atoms**: each allocation booking (`purpose = 'allocation'`; layout-change
  windows are nobody's usage) for the part of its `during` inside the hour.
  `during` is already what was really held: a release, a lease expiry, a spot
  notice or a preemption shortens it (or deletes a booking that had not
  started), so no state of the reservation is read again here.
* **Host scalars** (`vcpu`, `memoryGiB`, ...): each allocation's claims, held
  from the earliest start to the latest end of its bookings, clipped the same
  way. A claim taken ahead of a future start is not usage: nothing ran on it.
* Usage is never counted past `compute_now()`: a booking that runs on is usage
  up to now, so an open hour grows until it closes.

Amounts are exact: quantity times microseconds (`usage_us`), summed as
integers, so the sum of any hours equals the sum of the clipped bookings to the
microsecond. The API adds `amount` in atom-hours or unit-hours for people.

Both jobs count with this definition: the worker's `usage-close` writes closed
hours once (`capacity.services`), and the reads take closed hours from the
table and compute the others from the bookings (`capacity.selectors.usage`).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from inventory.choices import ATOM_CLASSES

HOUR = timedelta(hours=1)
# Microseconds per hour: `amount` = usage_us / this.
US_PER_HOUR = 3_600_000_000

# The clipped usage per hour and key over `[lo, hi)`, optionally for one tenant,
# pool or project (`{filters}` is built from fixed fragments only). The window
# is `lo` to `hi`, both on the hour but for `hi` clipped to now on a read.
BOOKINGS_ALL = """
      FROM device_bookings b
      JOIN reservations_allocation a ON a.id = b.allocation_id
      JOIN reservations_reservation r ON r.id = a.reservation_id"""

# One tenant's bookings, found from its reservations that overlap the window
# (index `reservation_tenant_ends`; a reservation's bookings lie within its
# `[starts_at, ends_at)`), not from every tenant's bookings in the window: a
# read of the open hour then costs what the tenant holds, not what the fleet does.
BOOKINGS_OF_TENANT = """
      FROM reservations_reservation r
      JOIN reservations_allocation a ON a.reservation_id = r.id
      JOIN device_bookings b ON b.allocation_id = a.id"""

COMPUTE_SQL = """
WITH bk AS MATERIALIZED (
    SELECT a.id AS allocation_id, a.resources, d.device_class,
           r.tenant_id, r.pool_id, COALESCE(r.project_id, '') AS project_id, r.spot,
           greatest(lower(b.during), %(lo)s) AS s,
           least(COALESCE(upper(b.during), 'infinity'::timestamptz), %(hi)s) AS e
      {bookings}
      JOIN inventory_device d ON d.id = b.device_id
     WHERE b.purpose = 'allocation' AND b.during && tstzrange(%(lo)s, %(hi)s, '[)'){filters}
), held AS (
    -- Atoms: how many of one class share a span (an allocation books its atoms together).
    SELECT tenant_id, pool_id, project_id, spot, device_class AS resource, s, e, count(*)::numeric AS qty
      FROM bk
     GROUP BY 1, 2, 3, 4, 5, 6, 7
    UNION ALL
    -- Host scalars: each allocation's claims over the span of its bookings.
    SELECT sp.tenant_id, sp.pool_id, sp.project_id, sp.spot, kv.key, sp.s, sp.e, kv.value::numeric
      FROM (SELECT allocation_id, tenant_id, pool_id, project_id, spot, resources, min(s) AS s, max(e) AS e
              FROM bk
             GROUP BY allocation_id, tenant_id, pool_id, project_id, spot, resources) sp
     CROSS JOIN LATERAL jsonb_each_text(sp.resources) AS kv
     WHERE jsonb_typeof(sp.resources -> kv.key) = 'number' AND kv.value::numeric > 0
)
SELECT h.hour, held.tenant_id, held.pool_id, held.project_id, held.resource, held.spot,
       sum(held.qty * extract(epoch FROM least(held.e, h.hour + interval '1 hour') - greatest(held.s, h.hour))
           * 1000000)::bigint AS usage_us
  FROM held
 CROSS JOIN LATERAL generate_series(
           date_trunc('hour', held.s, 'UTC'), held.e - interval '1 microsecond', interval '1 hour') AS h(hour)
 WHERE held.e > held.s
 GROUP BY 1, 2, 3, 4, 5, 6
"""

# A usage row's key columns, in `COMPUTE_SQL`'s order (and the stored table's unique key).
KEY_COLUMNS = "hour, tenant_id, pool_id, project_id, resource, spot"


def unit_of(resource: str) -> str:
    """`atom-hours` for an atom class, `unit-hours` for a host scalar."""
    return "atom-hours" if resource in ATOM_CLASSES else "unit-hours"


def hour_floor(value: datetime) -> datetime:
    return value.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def no_jit(cursor: Any) -> None:
    """Plan this transaction's statements without JIT.

    `generate_series` is estimated at 1,000 rows a call, so the planner prices
    these statements far above `jit_above_cost` and compiles them: about a
    second of compilation for a statement that runs in a tenth of that.
    """
    cursor.execute("SET LOCAL jit = off")
