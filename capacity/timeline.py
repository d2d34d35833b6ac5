"""`capacity.timeline`: whole GPUs booked per time bucket of one pool, for calendar views.

One statement answers the whole timeline. It first takes the pool's `gpu`
bookings that overlap the window (the `&&` probe is served by the GiST index
on `device_bookings.during`, then joined to the pool's whole-GPU devices),
then spreads each booking over the buckets it touches with `generate_series`
(bucket numbers computed from its bounds, so the cost grows with the bookings
in the window, not with bookings times buckets), and counts distinct devices per
bucket. A device booked twice in one bucket (released, then booked again)
counts once. MIG and slot atoms are a different class and never counted.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.db import connection

from capacity.models import PoolCapacityRollup
from core.api import MAX_TIME_MS
from core.clock import compute_now, to_millis
from core.errors import InvalidInput
from inventory.models import Device, Node, Pool
from reservations.models import DeviceBooking

DEFAULT_SPAN_MS = 24 * 3600 * 1000
MAX_SPAN_MS = 7 * 24 * 3600 * 1000
MAX_BUCKETS = 336
DEFAULT_STEP_MINUTES = 60
MIN_STEP_MINUTES = 5
MAX_STEP_MINUTES = 1440

_TIMELINE_SQL = """
WITH params AS (
    SELECT %(from_ms)s::bigint AS from_ms, %(to_ms)s::bigint AS to_ms, %(step_ms)s::bigint AS step_ms,
           %(last)s::int AS last
),
pool_gpus AS (
    SELECT d.id
    FROM {device} d
    JOIN {node} n ON n.id = d.node_id
    WHERE n.pool_id = %(pool)s AND d.device_class = 'gpu'
),
window_bookings AS (
    SELECT b.device_id, b.during,
           extract(epoch FROM GREATEST(lower(b.during), %(from_ts)s)) * 1000 AS lo_ms,
           extract(epoch FROM LEAST(upper(b.during), %(to_ts)s)) * 1000 AS hi_ms
    FROM {booking} b
    WHERE b.during && tstzrange(%(from_ts)s, %(to_ts)s, '[)')
      AND b.device_id IN (SELECT id FROM pool_gpus)
),
hits AS (
    SELECT DISTINCT k AS bucket, wb.device_id
    FROM params p
    CROSS JOIN window_bookings wb
    CROSS JOIN LATERAL generate_series(
        GREATEST(0, floor((wb.lo_ms - p.from_ms) / p.step_ms))::int,
        LEAST(p.last, floor((wb.hi_ms - p.from_ms) / p.step_ms))::int
    ) AS k
    -- The bucket numbers are a superset (an upper bound that falls exactly on
    -- a bucket's start, inclusive or not); the range test keeps the exact ones.
    WHERE wb.during && tstzrange(
        'epoch'::timestamptz + (p.from_ms + k * p.step_ms) * interval '1 millisecond',
        'epoch'::timestamptz + LEAST(p.from_ms + (k + 1) * p.step_ms, p.to_ms) * interval '1 millisecond',
        '[)')
)
SELECT s.k, count(h.device_id)
FROM params p
CROSS JOIN LATERAL generate_series(0, p.last) AS s(k)
LEFT JOIN hits h ON h.bucket = s.k
GROUP BY s.k
ORDER BY s.k
"""


def _ms_to_datetime(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def timeline_window(
    *, from_ms: int | None, to_ms: int | None, step_minutes: int | None
) -> tuple[int, int, int]:
    """The window and step after defaults and limits; InvalidInput names the field at fault."""
    if step_minutes is None:
        step_minutes = DEFAULT_STEP_MINUTES
    if isinstance(step_minutes, bool) or not MIN_STEP_MINUTES <= step_minutes <= MAX_STEP_MINUTES:
        raise InvalidInput.field("stepMinutes", f"must be between {MIN_STEP_MINUTES} and {MAX_STEP_MINUTES}")
    for name, value in (("from", from_ms), ("to", to_ms)):
        if value is not None and not 0 <= value <= MAX_TIME_MS:
            raise InvalidInput.field(name, f"must be between 0 and {MAX_TIME_MS}")
    if from_ms is None:
        # The start of the current hour, by the database's clock.
        now = compute_now().astimezone(UTC)
        from_ms = to_millis(now.replace(minute=0, second=0, microsecond=0))
        assert from_ms is not None
    if to_ms is None:
        to_ms = from_ms + DEFAULT_SPAN_MS
    if to_ms <= from_ms:
        raise InvalidInput.field("to", "must be after from")
    if to_ms - from_ms > MAX_SPAN_MS:
        raise InvalidInput.field("to", "a timeline spans at most 7 days")
    step_ms = step_minutes * 60_000
    buckets = -(-(to_ms - from_ms) // step_ms)
    if buckets > MAX_BUCKETS:
        raise InvalidInput.field(
            "stepMinutes",
            f"a timeline has at most {MAX_BUCKETS} buckets; this window and step make {buckets}",
        )
    return from_ms, to_ms, step_minutes


def timeline_compute(
    *, pool: Pool, from_ms: int | None, to_ms: int | None, step_minutes: int | None
) -> dict[str, Any]:
    """Whole GPUs booked per bucket, and how many of the pool's allocatable GPUs stay free.

    `allocatable` is the pool's current `gpu` rollup row (0 when there is
    none): like every capacity read, a dashboard number that the reconciler
    keeps current, not a recount.
    """
    from_ms, to_ms, step_minutes = timeline_window(from_ms=from_ms, to_ms=to_ms, step_minutes=step_minutes)
    step_ms = step_minutes * 60_000
    last = -(-(to_ms - from_ms) // step_ms) - 1
    allocatable = (
        PoolCapacityRollup.objects.filter(pool=pool, resource="gpu")
        .values_list("allocatable", flat=True)
        .first()
        or 0
    )
    sql = _TIMELINE_SQL.format(
        device=Device._meta.db_table, node=Node._meta.db_table, booking=DeviceBooking._meta.db_table
    )
    params = {
        "pool": pool.pk,
        "from_ts": _ms_to_datetime(from_ms),
        "to_ts": _ms_to_datetime(to_ms),
        "from_ms": from_ms,
        "to_ms": to_ms,
        "step_ms": step_ms,
        "last": last,
    }
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        booked_by_bucket = dict(cursor.fetchall())
    buckets = []
    for k in range(last + 1):
        start = from_ms + k * step_ms
        booked = int(booked_by_bucket.get(k, 0))
        buckets.append(
            {
                "start": start,
                "end": min(start + step_ms, to_ms),
                "booked": booked,
                "free": max(0, allocatable - booked),
            }
        )
    return {
        "poolId": pool.pk,
        "from": from_ms,
        "to": to_ms,
        "stepMinutes": step_minutes,
        "allocatable": allocatable,
        "buckets": buckets,
    }
