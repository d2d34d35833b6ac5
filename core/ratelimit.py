"""Rate limits on writes, per token and per tenant, shared by every server process and replica.

A fixed window per minute, counted in PostgreSQL (`core_ratewindow`): one
upsert increments the token's and the tenant's counters together and returns
both, so a check costs one statement and no lock is held past it. Beyond a
limit the write answers `429 RATE_LIMITED` with `Retry-After` (the seconds left
in the window) and changes nothing; the refused call is counted too, so a client
hammering past its limit does not earn its way back by failing.
"""

from __future__ import annotations

from django.conf import settings
from django.db import connection

from core.errors import TooManyRequests

WINDOW_SECONDS = 60

_COUNT_SQL = """
INSERT INTO core_ratewindow AS w (key, window_start, count)
SELECT k, date_bin(%(window)s * interval '1 second', now(), timestamptz '2000-01-01'), 1
  FROM unnest(%(keys)s::varchar[]) AS k
 ORDER BY k
ON CONFLICT (key, window_start) DO UPDATE SET count = w.count + 1
RETURNING w.key, w.count,
          ceil(extract(epoch FROM w.window_start + %(window)s * interval '1 second' - now()))::int
"""


def writes_count(*, token_id: str, tenant_id: str) -> None:
    """Count one write for the token and the tenant; `TooManyRequests` if either is past its limit."""
    limits = {
        f"token:{token_id}": int(settings.API_WRITES_PER_MINUTE_PER_TOKEN),
        f"tenant:{tenant_id}": int(settings.API_WRITES_PER_MINUTE_PER_TENANT),
    }
    with connection.cursor() as cursor:
        cursor.execute(_COUNT_SQL, {"keys": sorted(limits), "window": WINDOW_SECONDS})
        counts = cursor.fetchall()
    for key, count, seconds_left in counts:
        if count > limits[key]:
            who = "this token" if key.startswith("token:") else "this tenant"
            raise TooManyRequests(
                f"{who} made more than {limits[key]} writes this minute; retry after {seconds_left}s",
                [{"field": "rate", "message": f"{limits[key]} writes per minute for {who}"}],
                retry_after=max(1, int(seconds_left)),
            )


def rate_windows_prune() -> int:
    """Drop the windows that ended more than an hour ago; return how many (a reconciler chore)."""
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM core_ratewindow WHERE window_start < now() - interval '1 hour'")
        return cursor.rowcount
