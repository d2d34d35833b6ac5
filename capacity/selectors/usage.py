"""Reading hourly usage: a tenant's rows of a window, a page at a time, and their CSV.

Closed hours come from the table the worker writes (`capacity.services`); the
hours not closed yet (the open hour, and any the worker has not reached) are
computed from the bookings up to now, with the one definition of what counts
(`capacity.usage`), so a read never rescans a month of bookings.
"""

from __future__ import annotations

import csv
import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, Any

from django.db import connection, transaction

from capacity.usage import BOOKINGS_ALL, BOOKINGS_OF_TENANT, COMPUTE_SQL, HOUR, US_PER_HOUR, no_jit, unit_of
from core.clock import to_millis
from core.constants import POOL_ID_REGEX, PROJECT_ID_REGEX
from core.cursors import cursor_decode, cursor_encode, cursor_invalid, cursor_time
from core.errors import InvalidInput

HOUR_MS = 3_600_000
# One call reads at most this many hours (31 days).
MAX_HOURS = 31 * 24
DEFAULT_LIMIT = 500
MAX_LIMIT = 1000


def _from_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


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
    """One hour of one key. Ordered as pages are: hour, pool, project, resource, spot.

    `closed`: read from the table (else computed from the bookings, the hour not
    closed yet); `corrected`: a recheck wrote a correction row for it.
    """

    hour: datetime
    pool_id: str
    project_id: str
    resource: str
    spot: bool
    tenant_id: str
    usage_us: int
    closed: bool = False
    corrected: bool = False

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
    return cursor_encode(hour.isoformat(), pool_id, project_id, resource, "1" if spot else "0")


def decode_cursor(cursor: str) -> Key:
    """The key an `encode_cursor` wrote; anything else is INVALID_INPUT naming `cursor`."""
    hour_text, pool_id, project_id, resource, spot = cursor_decode(cursor, count=5)
    hour = cursor_time(hour_text)
    if (
        re.fullmatch(POOL_ID_REGEX, pool_id) is None
        or (project_id and re.fullmatch(PROJECT_ID_REGEX, project_id) is None)
        or re.fullmatch(r"[A-Za-z0-9.]{1,16}", resource) is None
        or spot not in ("0", "1")
    ):
        raise cursor_invalid()
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
    bookings = BOOKINGS_ALL
    if scope.tenant_id is not None:
        bookings = BOOKINGS_OF_TENANT
        filters += " AND r.ends_at > %(lo)s AND r.starts_at < %(hi)s"
    sql = COMPUTE_SQL.format(bookings=bookings, filters=filters)
    with transaction.atomic(), connection.cursor() as cursor:
        no_jit(cursor)
        cursor.execute(sql, {"lo": lo, "hi": hi, **params})
        rows = cursor.fetchall()
    return [
        UsageRow(hour.astimezone(UTC), pool_id, project_id, resource, spot, tenant_id, int(usage_us))
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
            _hour(int(epoch)),
            pool,
            project,
            resource,
            spot,
            tenant,
            int(usage_us),
            closed=True,
            corrected=bool(fixed),
        )
        for epoch, pool, project, resource, spot, tenant, usage_us, fixed in rows
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
