"""Hourly usage: what each tenant actually held, per hour, pool, project, resource and spot flag.

What counts (the one definition, in `_COMPUTE_SQL`):

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

Closing an hour (`usage_close_due`, the worker's `usage-close` job): an hour
closes `CAPACITY_USAGE_CLOSE_GRACE_SECONDS` after its end, in hour order, its
rows and its `UsageHour` marker written in one transaction, once. A report
reads closed hours from the table and computes the others (the open hour, and
any the worker has not reached) from the bookings, so it never rescans a month
of bookings. The grace covers transactions that read the clock before the hour
ended and commit after it (a booking can only be changed from its own
transaction's `compute_now()` on). Each time hours close, the hours closed in
the `CAPACITY_USAGE_RECHECK_HOURS` before them are counted again, and a
difference (a late commit, or an operator's repair of the bookings) is written
as a correction row, the delta with the next `revision`; a written row never
changes (a trigger refuses it).
"""

from __future__ import annotations

import base64
import binascii
import csv
import functools
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import IO, Any

from django.conf import settings
from django.db import connection, transaction

from core.clock import to_millis
from core.constants import POOL_ID_REGEX, PROJECT_ID_REGEX
from core.errors import InvalidInput
from inventory.choices import ATOM_CLASSES

HOUR = timedelta(hours=1)
HOUR_MS = 3_600_000
# One call reads at most this many hours (31 days).
MAX_HOURS = 31 * 24
DEFAULT_LIMIT = 500
MAX_LIMIT = 1000
# The worker closes at most this many hours per transaction (one statement over their bookings).
CLOSE_BATCH_HOURS = 24
# Microseconds per hour: `amount` = usage_us / this.
US_PER_HOUR = 3_600_000_000

ProgressFn = Callable[[int, int], None]

# The clipped usage per hour and key over `[lo, hi)`, optionally for one tenant,
# pool or project (`{filters}` is built from fixed fragments only). The window
# is `lo` to `hi`, both on the hour but for `hi` clipped to now on a read.
_BOOKINGS_ALL = """
      FROM device_bookings b
      JOIN reservations_allocation a ON a.id = b.allocation_id
      JOIN reservations_reservation r ON r.id = a.reservation_id"""

# One tenant's bookings, found from its reservations that overlap the window
# (index `reservation_tenant_ends`; a reservation's bookings lie within its
# `[starts_at, ends_at)`), not from every tenant's bookings in the window: a
# read of the open hour then costs what the tenant holds, not what the fleet does.
_BOOKINGS_OF_TENANT = """
      FROM reservations_reservation r
      JOIN reservations_allocation a ON a.reservation_id = r.id
      JOIN device_bookings b ON b.allocation_id = a.id"""

_COMPUTE_SQL = """
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

_KEY = "hour, tenant_id, pool_id, project_id, resource, spot"

# Close `[lo, hi)`: its rows (revision 0) and one marker per hour, in one statement.
# A second close of an hour breaks the markers' primary key (and the rows' unique key).
_CLOSE_SQL = f"""
WITH written AS (
    INSERT INTO capacity_hourlyusage ({_KEY}, usage_us, revision)
    SELECT {_KEY}, usage_us, 0 FROM ({_COMPUTE_SQL.format(bookings=_BOOKINGS_ALL, filters="")}) c
    RETURNING hour
)
INSERT INTO capacity_usagehour (hour, rows)
SELECT h.hour, (SELECT count(*) FROM written w WHERE w.hour = h.hour)
  FROM generate_series(%(lo)s, %(hi)s - interval '1 hour', interval '1 hour') AS h(hour)
"""

# Count closed hours `[lo, hi)` again; where the count differs from what is stored (rows plus
# corrections), write the difference as the key's next revision. Nothing is updated.
_RECHECK_SQL = f"""
WITH fresh AS ({_COMPUTE_SQL.format(bookings=_BOOKINGS_ALL, filters="")}),
stored AS (
    SELECT {_KEY}, sum(usage_us)::bigint AS usage_us, max(revision) AS revision
      FROM capacity_hourlyusage
     WHERE hour >= %(lo)s AND hour < %(hi)s
     GROUP BY 1, 2, 3, 4, 5, 6
)
INSERT INTO capacity_hourlyusage ({_KEY}, usage_us, revision)
SELECT {_KEY}, COALESCE(f.usage_us, 0) - COALESCE(s.usage_us, 0), COALESCE(s.revision, 0) + 1
  FROM fresh f FULL JOIN stored s USING (hour, tenant_id, pool_id, project_id, resource, spot)
 WHERE COALESCE(f.usage_us, 0) <> COALESCE(s.usage_us, 0)
   -- Only closed hours: an hour without its marker is still computed on each read.
   AND hour IN (SELECT m.hour FROM capacity_usagehour m WHERE m.hour >= %(lo)s AND m.hour < %(hi)s)
"""


def unit_of(resource: str) -> str:
    """`atom-hours` for an atom class, `unit-hours` for a host scalar."""
    return "atom-hours" if resource in ATOM_CLASSES else "unit-hours"


def hour_floor(value: datetime) -> datetime:
    return value.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def _from_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


# --- closing hours (the worker) ------------------------------------------------------------


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


def _no_jit(cursor: Any) -> None:
    """Plan this transaction's statements without JIT.

    `generate_series` is estimated at 1,000 rows a call, so the planner prices
    these statements far above `jit_above_cost` and compiles them: about a
    second of compilation for a statement that runs in a tenth of that.
    """
    cursor.execute("SET LOCAL jit = off")


def usage_close(*, lo: datetime, hi: datetime) -> int:
    """Close the hours `[lo, hi)` in one transaction; answer how many usage rows were written."""
    with transaction.atomic(), connection.cursor() as cursor:
        _no_jit(cursor)
        cursor.execute(_CLOSE_SQL, {"lo": lo, "hi": hi})
        cursor.execute(
            "SELECT COALESCE(sum(rows), 0) FROM capacity_usagehour WHERE hour >= %s AND hour < %s", [lo, hi]
        )
        row = cursor.fetchone()
    return int(row[0]) if row else 0


def usage_recheck(*, lo: datetime, hi: datetime) -> int:
    """Count the closed hours `[lo, hi)` again and write a correction row per difference; how many."""
    with transaction.atomic(), connection.cursor() as cursor:
        _no_jit(cursor)
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


# --- reading ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class UsageWindow:
    """The hours a read covers: `from` floored and `to` rounded up to the hour."""

    start: datetime
    end: datetime


def usage_window(*, from_ms: int, to_ms: int) -> UsageWindow:
    """Check `from` and `to` and widen them to whole hours; INVALID_INPUT names `to` when they are wrong."""
    if to_ms <= from_ms:
        raise InvalidInput.field("to", "must be after from")
    start_ms = from_ms - from_ms % HOUR_MS
    end_ms = -(-to_ms // HOUR_MS) * HOUR_MS
    if end_ms - start_ms > MAX_HOURS * HOUR_MS:
        raise InvalidInput.field(
            "to", f"must be at most 31 days ({MAX_HOURS} hours) after from, in whole hours"
        )
    return UsageWindow(start=_from_ms(start_ms), end=_from_ms(end_ms))


@dataclass(frozen=True, order=True)
class UsageRow:
    """One hour of one key. Ordered as pages are: hour, pool, project, resource, spot."""

    hour: datetime
    pool_id: str
    project_id: str
    resource: str
    spot: bool
    tenant_id: str
    usage_us: int
    closed: bool
    corrected: bool

    def key(self) -> tuple[datetime, str, str, str, bool]:
        return (self.hour, self.pool_id, self.project_id, self.resource, self.spot)

    def payload(self) -> dict[str, Any]:
        """The API's row."""
        return {
            "hour": to_millis(self.hour),
            "poolId": self.pool_id,
            "projectId": self.project_id or None,
            "resource": self.resource,
            "spot": self.spot,
            "unit": unit_of(self.resource),
            "amount": round(self.usage_us / US_PER_HOUR, 6),
            "microseconds": self.usage_us,
            "closed": self.closed,
            "corrected": self.corrected,
        }


Key = tuple[datetime, str, str, str, bool]


def encode_cursor(key: Key) -> str:
    hour, pool_id, project_id, resource, spot = key
    text = "|".join([hour.isoformat(), pool_id, project_id, resource, "1" if spot else "0"])
    return base64.urlsafe_b64encode(text.encode()).decode()


def decode_cursor(cursor: str) -> Key:
    """The key an `encode_cursor` wrote; anything else is INVALID_INPUT naming `cursor`."""
    bad = InvalidInput.field("cursor", "is not a cursor this API returned")
    try:
        hour_text, pool_id, project_id, resource, spot = (
            base64.urlsafe_b64decode(cursor.encode()).decode().split("|")
        )
        hour = datetime.fromisoformat(hour_text)
    except (ValueError, binascii.Error, UnicodeError) as exc:
        raise bad from exc
    if (
        hour.tzinfo is None
        or re.fullmatch(POOL_ID_REGEX, pool_id) is None
        or (project_id and re.fullmatch(PROJECT_ID_REGEX, project_id) is None)
        or re.fullmatch(r"[A-Za-z0-9.]{1,16}", resource) is None
        or spot not in ("0", "1")
    ):
        raise bad
    return hour, pool_id, project_id, resource, spot == "1"


@dataclass(frozen=True)
class UsageScope:
    """Whose usage: a tenant (None: every tenant, for operators' exports), optionally one pool or project."""

    tenant_id: str | None
    pool_id: str | None = None
    project_id: str | None = None

    def filters(self, alias: str) -> tuple[str, dict[str, Any]]:
        """SQL conditions (each a fixed fragment) on the table `alias`, and their parameters."""
        clauses: list[str] = []
        params: dict[str, Any] = {}
        for column, value in (
            ("tenant_id", self.tenant_id),
            ("pool_id", self.pool_id),
            ("project_id", self.project_id),
        ):
            if value is not None:
                clauses.append(f" AND {alias}.{column} = %({column})s")
                params[column] = value
        return "".join(clauses), params


# The stored rows of closed hours after a key, in the order pages use (byte order of the ids,
# the same as Python's `str` order), rows and corrections summed per key.
_STORED_SQL = """
SELECT extract(epoch FROM hour)::bigint, pool_id, project_id, resource, spot, tenant_id,
       sum(usage_us)::bigint, max(revision) > 0
  FROM capacity_hourlyusage u
 WHERE u.hour >= %(lo)s AND u.hour < %(hi)s{filters}{after}
 GROUP BY hour, pool_id, project_id, resource, spot, tenant_id
HAVING sum(usage_us) <> 0
 ORDER BY hour, pool_id COLLATE "C", project_id COLLATE "C", resource COLLATE "C", spot, tenant_id COLLATE "C"
 LIMIT %(limit)s
"""

_AFTER_SQL = (
    ' AND (u.hour, u.pool_id COLLATE "C", u.project_id COLLATE "C", u.resource COLLATE "C", u.spot)'
    " > (%(c_hour)s, %(c_pool)s, %(c_project)s, %(c_resource)s, %(c_spot)s)"
)


# The window's hours that have started and are not closed (usually the open hour alone),
# as epoch seconds: one probe of the markers' primary key per hour.
_OPEN_HOURS_SQL = """
SELECT extract(epoch FROM h.hour)::bigint
  FROM generate_series(%(lo)s::timestamptz, %(hi)s::timestamptz - interval '1 hour', interval '1 hour')
       AS h(hour)
 WHERE h.hour < %(now)s AND NOT EXISTS (SELECT 1 FROM capacity_usagehour m WHERE m.hour = h.hour)
 ORDER BY 1
"""


@functools.lru_cache(maxsize=65_536)
def _hour(epoch: int) -> datetime:
    """The hour starting at `epoch` seconds, built once (a month's page repeats 744 hours)."""
    return datetime.fromtimestamp(epoch, tz=UTC)


def _open_ranges(window: UsageWindow, now: datetime) -> list[tuple[datetime, datetime]]:
    """The hours of the window that are not closed, up to now, as `[lo, hi)` ranges (hi clipped to now)."""
    with connection.cursor() as cursor:
        cursor.execute(_OPEN_HOURS_SQL, {"lo": window.start, "hi": window.end, "now": now})
        hours = [_hour(int(row[0])) for row in cursor.fetchall()]
    ranges: list[tuple[datetime, datetime]] = []
    for hour in hours:
        if ranges and ranges[-1][1] == hour:
            ranges[-1] = (ranges[-1][0], hour + HOUR)
        else:
            ranges.append((hour, hour + HOUR))
    return [(lo, min(hi, now)) for lo, hi in ranges]


def _computed(scope: UsageScope, lo: datetime, hi: datetime) -> list[UsageRow]:
    filters, params = scope.filters("r")
    bookings = _BOOKINGS_ALL
    if scope.tenant_id is not None:
        bookings = _BOOKINGS_OF_TENANT
        filters += " AND r.ends_at > %(lo)s AND r.starts_at < %(hi)s"
    sql = _COMPUTE_SQL.format(bookings=bookings, filters=filters)
    with transaction.atomic(), connection.cursor() as cursor:
        _no_jit(cursor)
        cursor.execute(sql, {"lo": lo, "hi": hi, **params})
        rows = cursor.fetchall()
    return [
        UsageRow(
            hour=hour.astimezone(UTC),
            pool_id=pool_id,
            project_id=project_id,
            resource=resource,
            spot=spot,
            tenant_id=tenant_id,
            usage_us=int(usage_us),
            closed=False,
            corrected=False,
        )
        for hour, tenant_id, pool_id, project_id, resource, spot, usage_us in rows
        if usage_us
    ]


def _stored(scope: UsageScope, window: UsageWindow, after: Key | None, limit: int | None) -> list[UsageRow]:
    filters, params = scope.filters("u")
    params |= {"lo": window.start, "hi": window.end, "limit": limit}
    if after is not None:
        params |= dict(zip(("c_hour", "c_pool", "c_project", "c_resource", "c_spot"), after, strict=True))
    sql = _STORED_SQL.format(filters=filters, after=_AFTER_SQL if after is not None else "")
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return [
        UsageRow(
            hour=_hour(int(hour)),
            pool_id=pool_id,
            project_id=project_id,
            resource=resource,
            spot=spot,
            tenant_id=tenant_id,
            usage_us=int(usage_us),
            closed=True,
            corrected=bool(corrected),
        )
        for hour, pool_id, project_id, resource, spot, tenant_id, usage_us, corrected in rows
    ]


def usage_page(
    *, scope: UsageScope, window: UsageWindow, limit: int | None = DEFAULT_LIMIT, cursor: str | None = None
) -> tuple[list[UsageRow], str | None]:
    """One page of hourly rows in key order, and the next page's cursor (None on the last page).

    Closed hours come from the table (the unique index serves the tenant's
    range); hours not closed yet are computed from the bookings up to now.
    `limit` None reads the whole window at once (the CLI and the admin's CSV,
    which may also read every tenant: `scope.tenant_id` None).
    """
    if limit is not None and not 1 <= limit <= MAX_LIMIT:
        raise InvalidInput.field("limit", f"must be between 1 and {MAX_LIMIT}")
    after = decode_cursor(cursor) if cursor else None
    with connection.cursor() as cur:
        cur.execute("SELECT compute_now()")
        now_row = cur.fetchone()
    assert now_row is not None
    now: datetime = now_row[0]
    rows = _stored(scope, window, after, None if limit is None else limit + 1)
    for lo, hi in _open_ranges(window, now):
        rows.extend(row for row in _computed(scope, lo, hi) if after is None or row.key() > after)
    rows.sort()
    next_cursor = None
    if limit is not None and len(rows) > limit:
        rows = rows[:limit]
        next_cursor = encode_cursor(rows[-1].key())
    return rows, next_cursor


def usage_hourly(
    *,
    tenant_id: str,
    from_ms: int,
    to_ms: int,
    pool_id: str | None = None,
    project_id: str | None = None,
    limit: int = DEFAULT_LIMIT,
    cursor: str | None = None,
) -> dict[str, Any]:
    """`usage/hourly`'s answer: the tenant's rows of the window's hours, a page at a time."""
    window = usage_window(from_ms=from_ms, to_ms=to_ms)
    scope = UsageScope(tenant_id=tenant_id, pool_id=pool_id, project_id=project_id)
    rows, next_cursor = usage_page(scope=scope, window=window, limit=limit, cursor=cursor)
    return {
        "tenantId": tenant_id,
        "from": to_millis(window.start),
        "to": to_millis(window.end),
        "rows": [row.payload() for row in rows],
        "nextCursor": next_cursor,
    }


def usage_rows(*, scope: UsageScope, window: UsageWindow) -> list[UsageRow]:
    """Every row of the window in key order (the CLI and the admin's CSV), in one read."""
    rows, _ = usage_page(scope=scope, window=window, limit=None)
    return rows


CSV_COLUMNS = (
    "hour",
    "tenantId",
    "poolId",
    "projectId",
    "resource",
    "spot",
    "unit",
    "amount",
    "microseconds",
    "closed",
    "corrected",
)


def usage_csv_write(rows: Iterable[UsageRow], out: IO[str]) -> int:
    """Write rows as CSV (hours in ISO 8601 UTC, `amount` with six decimals); answer how many."""
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    count = 0
    for row in rows:
        writer.writerow(
            [
                row.hour.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                row.tenant_id,
                row.pool_id,
                row.project_id,
                row.resource,
                "true" if row.spot else "false",
                unit_of(row.resource),
                f"{row.usage_us / US_PER_HOUR:.6f}",
                row.usage_us,
                "true" if row.closed else "false",
                "true" if row.corrected else "false",
            ]
        )
        count += 1
    return count
