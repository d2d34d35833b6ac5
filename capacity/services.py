"""Capacity's writes: closing usage hours (the worker's `usage-close` job).

An hour closes `CAPACITY_USAGE_CLOSE_GRACE_SECONDS` after its end, in hour
order, its rows and its `UsageHour` marker written in one transaction, once
(what counts: `capacity.usage`). A report reads closed hours from the table and
computes the others (the open hour, and any the worker has not reached) from
the bookings, so it never rescans a month of bookings. The grace covers
transactions that read the clock before the hour ended and commit after it (a
booking can only be changed from its own transaction's `compute_now()` on).
Each time hours close, the hours closed in the `CAPACITY_USAGE_RECHECK_HOURS`
before them are counted again, and a difference (a late commit, or an
operator's repair of the bookings) is written as a correction row, the delta
with the next `revision`; a written row never changes (a trigger refuses it).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction

from capacity.usage import BOOKINGS_ALL, COMPUTE_SQL, HOUR, KEY_COLUMNS, no_jit

# The worker closes at most this many hours per transaction (one statement over their bookings).
CLOSE_BATCH_HOURS = 24

ProgressFn = Callable[[int, int], None]

# Close `[lo, hi)`: its rows (revision 0) and one marker per hour, in one statement.
# A second close of an hour breaks the markers' primary key (and the rows' unique key).
_CLOSE_SQL = f"""
WITH written AS (
    INSERT INTO capacity_hourlyusage ({KEY_COLUMNS}, usage_us, revision)
    SELECT {KEY_COLUMNS}, usage_us, 0 FROM ({COMPUTE_SQL.format(bookings=BOOKINGS_ALL, filters="")}) c
    RETURNING hour
)
INSERT INTO capacity_usagehour (hour, rows)
SELECT h.hour, (SELECT count(*) FROM written w WHERE w.hour = h.hour)
  FROM generate_series(%(lo)s, %(hi)s - interval '1 hour', interval '1 hour') AS h(hour)
"""

# Count closed hours `[lo, hi)` again; where the count differs from what is stored (rows plus
# corrections), write the difference as the key's next revision. Nothing is updated.
_RECHECK_SQL = f"""
WITH fresh AS ({COMPUTE_SQL.format(bookings=BOOKINGS_ALL, filters="")}),
stored AS (
    SELECT {KEY_COLUMNS}, sum(usage_us)::bigint AS usage_us, max(revision) AS revision
      FROM capacity_hourlyusage
     WHERE hour >= %(lo)s AND hour < %(hi)s
     GROUP BY 1, 2, 3, 4, 5, 6
)
INSERT INTO capacity_hourlyusage ({KEY_COLUMNS}, usage_us, revision)
SELECT {KEY_COLUMNS}, COALESCE(f.usage_us, 0) - COALESCE(s.usage_us, 0), COALESCE(s.revision, 0) + 1
  FROM fresh f FULL JOIN stored s USING (hour, tenant_id, pool_id, project_id, resource, spot)
 WHERE COALESCE(f.usage_us, 0) <> COALESCE(s.usage_us, 0)
   -- Only closed hours: an hour without its marker is still computed on each read.
   AND hour IN (SELECT m.hour FROM capacity_usagehour m WHERE m.hour >= %(lo)s AND m.hour < %(hi)s)
"""


def _grace() -> timedelta:
    return timedelta(seconds=float(settings.CAPACITY_USAGE_CLOSE_GRACE_SECONDS))


def usage_next_close_sql() -> str:
    """The worker's deadline for `usage-close`: when the hour after the last closed one may close.

    NULL before the first close; the job's period starts it then. Read through
    the markers' primary key (one index entry).
    """
    return (
        "(SELECT max(hour) FROM capacity_usagehour)"
        " + make_interval(secs => 7200 + %(usage_grace)s)"  # the next hour's end, plus the grace
    )


def _close_bounds() -> tuple[datetime | None, datetime]:
    """The end of the last closed hour (None: none yet), and the end of the last closable one."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT max(hour) FROM capacity_usagehour) + interval '1 hour',"
            " date_trunc('hour', compute_now() - make_interval(secs => %s), 'UTC')",
            [_grace().total_seconds()],
        )
        row = cursor.fetchone()
    assert row is not None
    return row[0], row[1]


def _first_hour(closable_end: datetime) -> datetime:
    """Where closing starts on a database that never closed an hour: the first booking's hour.

    At the latest the last closable hour, so the first run always closes one
    and the worker's deadline is defined from then on.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT date_trunc('hour', min(lower(during)), 'UTC') FROM device_bookings"
            " WHERE purpose = 'allocation'"
        )
        row = cursor.fetchone()
    first = row[0] if row else None
    last = closable_end - HOUR
    return last if first is None else min(first, last)


def usage_close(*, lo: datetime, hi: datetime) -> int:
    """Close the hours `[lo, hi)` in one transaction; answer how many usage rows were written."""
    with transaction.atomic(), connection.cursor() as cursor:
        no_jit(cursor)
        cursor.execute(_CLOSE_SQL, {"lo": lo, "hi": hi})
        cursor.execute(
            "SELECT COALESCE(sum(rows), 0) FROM capacity_usagehour WHERE hour >= %s AND hour < %s", [lo, hi]
        )
        row = cursor.fetchone()
    return int(row[0]) if row else 0


def usage_recheck(*, lo: datetime, hi: datetime) -> int:
    """Count the closed hours `[lo, hi)` again and write a correction row per difference; how many."""
    with transaction.atomic(), connection.cursor() as cursor:
        no_jit(cursor)
        cursor.execute(_RECHECK_SQL, {"lo": lo, "hi": hi})
        return int(cursor.rowcount or 0)


def usage_close_due(*, max_hours: int | None = None, progress: ProgressFn | None = None) -> int:
    """Close every due hour, oldest first, a batch per transaction; answer hours closed plus corrections.

    After closing, the hours closed in the `CAPACITY_USAGE_RECHECK_HOURS` before
    this run's first one are counted again (`usage_recheck`), so a late change
    shows as a correction row. `max_hours` bounds one run (the worker's next
    run carries on: its deadline is then already due).
    """
    closed_end, closable_end = _close_bounds()
    start = closed_end if closed_end is not None else _first_hour(closable_end)
    if start >= closable_end:
        return 0
    end = closable_end if max_hours is None else min(closable_end, start + max_hours * HOUR)
    total = int((end - start) / HOUR)
    done = 0
    lo = start
    while lo < end:
        hi = min(end, lo + CLOSE_BATCH_HOURS * HOUR)
        usage_close(lo=lo, hi=hi)
        done += int((hi - lo) / HOUR)
        if progress is not None:
            progress(done, total)
        lo = hi
    corrections = 0
    recheck_hours = int(settings.CAPACITY_USAGE_RECHECK_HOURS)
    if closed_end is not None and recheck_hours > 0:
        corrections = usage_recheck(lo=closed_end - recheck_hours * HOUR, hi=closed_end)
    return done + corrections
