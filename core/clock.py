"""The one clock: PostgreSQL's `compute_now()`.

Every process asks the database what time it is, so API replicas, the
reconciler and the tests agree. Tests move the clock by setting
`compute.clock_offset` (an interval) on a session or on the database.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import connection
from django.db.models import DateTimeField, Func

CLOCK_OFFSET_SETTING = "compute.clock_offset"
# What the tests' moved clock adds to PostgreSQL's own (nothing unless the setting is set).
_OFFSET_SQL = f"COALESCE(NULLIF(current_setting('{CLOCK_OFFSET_SETTING}', true), ''), '0')::interval"

COMPUTE_NOW_SQL = f"""
CREATE OR REPLACE FUNCTION compute_now() RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT now() + {_OFFSET_SQL}
$$;
"""


class StatementNow(Func):
    """`compute_now()` at the statement rather than at the transaction's start.

    `now()` is when the transaction began, before any lock wait in it: what the
    transaction waited for committed after that instant, so a value that must
    read as later than what was waited for is set with this one.
    """

    arity = 0
    template = f"statement_timestamp() + {_OFFSET_SQL}"
    output_field = DateTimeField()


def compute_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT compute_now()")
        row = cursor.fetchone()
    assert row is not None
    value: datetime = row[0]
    return value


def set_clock_offset(offset: timedelta, *, local: bool = False) -> None:
    """Shift `compute_now()` for this connection (or, with local, this transaction)."""
    from core.auth_cache import auth_cache_forget

    # A remembered token was judged by the old clock (its expiry): judge it again.
    auth_cache_forget()
    seconds = offset.total_seconds()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT set_config(%s, %s, %s)",
            [CLOCK_OFFSET_SETTING, f"{seconds} seconds", local],
        )


def to_millis(value: datetime | None) -> int | None:
    if value is None:
        return None
    return int(value.timestamp() * 1000)
