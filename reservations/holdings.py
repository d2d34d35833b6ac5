"""A tenant's holdings over time: the peak of its concurrent use, for `concurrent` quotas.

A `concurrent` quota (`ledger.models.QuotaMode`) limits how much a tenant holds
at any one instant, not the sum of everything it ever booked. Its check needs
the reservations' rows, which this layer owns, so the ledger's charge asks
for the peak through the callable `placement_charge` gives it
(`ledger.services.quota.quota_charge`), after it has locked the quota row.

What a tenant holds of a resource at an instant, counted the way the charge
counts it (`placer.commit.placement_charges`): the atoms of each class booked
then by its live allocations (not released, of a scheduled or active
reservation in the pool), one per booking, and the scalars its live
allocations claim over their reservation's `[starts_at, ends_at)`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from django.db import connection

from reservations.models import BookingPurpose

# The peak per resource of the tenant's live holdings over [start, end), by a
# sweep: each holding adds its amount where it starts (clipped to the window)
# and takes it away where it ends (if inside the window); the running sum in
# time order is the use at each instant, and the changes at one instant are
# peers of one window frame (RANGE), so an end and a start at the same instant
# never count together (the ranges are half-open).
#
# The cost follows the tenant's live reservations in the pool, never the
# pool's or the platform's bookings: `reservation_tenant_pool_live` finds the
# reservations that overlap the window, and each one's holdings are read by a
# LATERAL subquery per reservation (its GROUP BY keeps the planner from
# flattening it into a join it could drive from the bookings of every tenant),
# through the allocations' (reservation, node) index and `booking_allocation`.
_PEAKS_SQL = f"""
WITH held AS (
    SELECT h.resource, h.lo, h.hi, h.amount
      FROM reservations_reservation r
     CROSS JOIN LATERAL (
           SELECT d.device_class AS resource, lower(b.during) AS lo, upper(b.during) AS hi,
                  count(*) AS amount
             FROM reservations_allocation a
             JOIN device_bookings b ON b.allocation_id = a.id
             JOIN inventory_device d ON d.id = b.device_id
            WHERE a.reservation_id = r.id AND NOT a.released AND b.purpose = '{BookingPurpose.ALLOCATION}'
              AND d.device_class = ANY(%(resources)s::varchar[])
            GROUP BY 1, 2, 3
           UNION ALL
           SELECT kv.key, r.starts_at, r.ends_at, sum((kv.value #>> '{{}}')::bigint)
             FROM reservations_allocation a, jsonb_each(a.resources) kv
            WHERE a.reservation_id = r.id AND NOT a.released AND kv.key = ANY(%(resources)s::varchar[])
            GROUP BY 1
           ) h
     WHERE r.tenant_id = %(tenant)s AND r.pool_id = %(pool)s AND r.state IN ('scheduled', 'active')
       AND r.starts_at < %(end)s AND r.ends_at > %(start)s
       AND h.lo < %(end)s AND h.hi > %(start)s
),
changes AS (
    SELECT resource, GREATEST(lo, %(start)s) AS at, amount FROM held
    UNION ALL
    SELECT resource, hi, -amount FROM held WHERE hi < %(end)s
)
SELECT resource, max(in_use)::bigint
  FROM (SELECT resource, sum(amount) OVER (PARTITION BY resource ORDER BY at) AS in_use FROM changes) s
 GROUP BY resource
"""


def holdings_peaks(
    resources: Sequence[str], *, tenant_id: str, pool_id: str, start: datetime, end: datetime
) -> dict[str, int]:
    """The tenant's peak use of each resource in the pool over [start, end), in one statement.

    `resources` comes first so that the quota charge's `window_peaks` (called
    with the resources alone) can be this function with the window bound.

    Includes what the calling transaction has booked and claimed itself, so a
    charge compares the peak with its new reservation in it. A resource held
    nowhere in the window is absent (its peak is 0).
    """
    with connection.cursor() as cursor:
        cursor.execute(
            _PEAKS_SQL,
            {"tenant": tenant_id, "pool": pool_id, "start": start, "end": end, "resources": list(resources)},
        )
        return {resource: int(peak) for resource, peak in cursor.fetchall()}
