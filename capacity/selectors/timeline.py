"""`capacity.selectors.timeline`: whole GPUs booked per time bucket of one pool, for calendar views.

One statement answers the whole timeline, whatever its number of buckets:

1. the pool's `gpu` bookings that overlap the window (the `&&` probe is served
   by a GiST index on `device_bookings.during`);
2. for each, the first and last bucket it touches, computed from its bounds;
3. per device, those spans made disjoint (a GPU booked twice in one bucket,
   say released and booked again, counts once);
4. +1/-1 at each span's edges, and a running sum over `generate_series` of
   the bucket numbers.

So the cost grows with the bookings in the window, never with bookings times
buckets. MIG and slot atoms are other classes and are not counted.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection

from core.clock import compute_now, to_millis
from core.constants import MAX_TIME_MS
from core.errors import InvalidInput
from inventory.models import Device, Node, Pool
from reservations.models import DeviceBooking, PoolCapacityRollup

DEFAULT_SPAN_MS = 24 * 3600 * 1000
MAX_SPAN_MS = 7 * 24 * 3600 * 1000
MAX_BUCKETS = 336
DEFAULT_STEP_MINUTES = 60
MIN_STEP_MINUTES = 5
MAX_STEP_MINUTES = 1440

_TIMELINE_SQL = """
WITH bucket_starts AS (
    SELECT ARRAY(
        SELECT %(from_ts)s + (k * %(step_min)s) * interval '1 minute'
        FROM generate_series(0, %(last)s) AS k
        ORDER BY k
    ) AS starts
),
pool_gpus AS (
    SELECT d.id
    FROM {device} d
    JOIN {node} n ON n.id = d.node_id
    WHERE n.pool_id = %(pool)s AND d.device_class = 'gpu'
),
spans AS (
    -- The first and last bucket a booking touches: a binary search of its
    -- first and last instant (timestamps are whole microseconds, so an open
    -- bound is the neighbouring microsecond) among the bucket starts. Exact,
    -- and integer work only.
    SELECT b.device_id,
           width_bucket(
               GREATEST(
                   CASE WHEN lower_inc(b.during) THEN lower(b.during)
                        ELSE lower(b.during) + interval '1 microsecond' END,
                   %(from_ts)s),
               bs.starts) - 1 AS first_k,
           width_bucket(
               LEAST(
                   CASE WHEN upper_inc(b.during) THEN upper(b.during)
                        ELSE upper(b.during) - interval '1 microsecond' END,
                   %(to_ts)s - interval '1 microsecond'),
               bs.starts) - 1 AS last_k
    FROM {booking} b
    CROSS JOIN bucket_starts bs
    -- `during && [from, to)` as its two bound comparisons (bookings are always
    -- `[start, end)`, or `[start, )` while a layout change is open), probed per GPU of
    -- the pool through the btree `booking_device_ends` (device, end): only the
    -- pool's bookings that end after `from` are read, never the whole fleet's
    -- window (a GiST scan of `during` reads every pool's bookings in it).
    WHERE b.device_id IN (SELECT id FROM pool_gpus)
      AND COALESCE(upper(b.during), ('infinity')::timestamp with time zone) > %(from_ts)s
      AND lower(b.during) < %(to_ts)s
),
distinct_spans AS (
    -- A GPU booked twice in one bucket counts once: walking a device's spans
    -- in order, each starts after the furthest bucket an earlier one reached.
    SELECT GREATEST(first_k, COALESCE(1 + max(last_k) OVER (
               PARTITION BY device_id ORDER BY first_k, last_k
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)) AS first_k,
           last_k
    FROM spans
),
deltas AS (
    -- +1 where a device's span opens, -1 after it closes: a running sum over
    -- the buckets is then the number of GPUs booked in each, without ever
    -- producing one row per booking and bucket.
    SELECT k, sum(delta) AS delta
    FROM (
        SELECT first_k AS k, 1 AS delta FROM distinct_spans WHERE first_k <= last_k
        UNION ALL
        SELECT last_k + 1, -1 FROM distinct_spans WHERE first_k <= last_k
    ) AS edges
    GROUP BY k
)
SELECT s.k, sum(COALESCE(deltas.delta, 0)) OVER (ORDER BY s.k) AS booked
FROM generate_series(0, %(last)s) AS s(k)
LEFT JOIN deltas ON deltas.k = s.k
ORDER BY s.k
"""


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _ms_to_datetime(ms: int) -> datetime:
    # Integer arithmetic: exact at any date the API accepts.
    return _EPOCH + timedelta(milliseconds=ms)


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
    params: dict[str, Any] = {
        "pool": pool.pk,
        "from_ts": _ms_to_datetime(from_ms),
        "to_ts": _ms_to_datetime(to_ms),
        "step_min": step_minutes,
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
