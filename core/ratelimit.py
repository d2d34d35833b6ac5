"""Rate limits on writes, per token and per tenant, shared by every server process and replica.

A fixed window per minute, counted in PostgreSQL (`core_ratewindow`): one
upsert increments the token's and the tenant's counters together and returns
both, so a check costs one statement and no lock is held past it. Beyond a
limit the write answers `429 RATE_LIMITED` with `Retry-After` (the seconds left
in the window) and changes nothing; the refused call is counted too, so a client
hammering past its limit does not earn its way back by failing.

A release folds the count into the last statement of its own transaction
(`WriteCount`, `write_counted`): one round trip fewer. Last, because the
counters' rows stay locked from that statement to the commit, and a tenant's
writes all meet on its row: folded into the first statement, its concurrent
writes would queue behind each other for their whole transactions. A refusal
then rolls the release back (a release is a few short statements). Whatever
rolls that transaction back rolls the count back too, so the count is then
made again on its own: every call is counted once, whatever it answered.

A create counts in the statement that reads its pool, which runs on its own
(autocommit) before the create's transaction, so the counters' rows are held
for that statement alone (`WriteCount.take`). Its refusal waits until the
create's own checks (project, sharing mode) have had their say
(`WriteCount.check_taken`), keeping the contract's order of errors.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

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
          ceil(extract(epoch FROM w.window_start + %(window)s * interval '1 second' - now()))::int AS seconds
"""
# A count committed on its own does not wait for its commit to reach the disk (or a synchronous
# standby): a crash may forget the last moment's counts, which a rate limit can afford, and the
# next synchronous commit (the create's own) flushes it anyway. `set_config(..., true)` lasts
# for the statement's own transaction only; the CTE is MATERIALIZED and joined so it runs once.
_UNSYNCED = "unsynced AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true))"
_COUNT_SQL_UNSYNCED = _COUNT_SQL.replace(
    "FROM unnest(%(keys)s::varchar[]) AS k", "FROM unnest(%(keys)s::varchar[]) AS k, unsynced"
)


def _limits(*, token_id: str, tenant_id: str) -> dict[str, int]:
    return {
        f"token:{token_id}": int(settings.API_WRITES_PER_MINUTE_PER_TOKEN),
        f"tenant:{tenant_id}": int(settings.API_WRITES_PER_MINUTE_PER_TENANT),
    }


def writes_count(*, token_id: str, tenant_id: str) -> None:
    """Count one write for the token and the tenant; `TooManyRequests` if either is past its limit."""
    limits = _limits(token_id=token_id, tenant_id=tenant_id)
    sql = _COUNT_SQL if _in_transaction() else f"WITH {_UNSYNCED} {_COUNT_SQL_UNSYNCED}"
    with connection.cursor() as cursor:
        cursor.execute(sql, {"keys": sorted(limits), "window": WINDOW_SECONDS})
        counts = cursor.fetchall()
    _refuse_past(limits, counts)


def _in_transaction() -> bool:
    return connection.in_atomic_block or not connection.get_autocommit()


def _refuse_past(limits: dict[str, int], counts: list[Any]) -> None:
    for key, count, seconds_left in counts:
        if count > limits[key]:
            who = "this token" if key.startswith("token:") else "this tenant"
            raise TooManyRequests(
                f"{who} made more than {limits[key]} writes this minute; retry after {seconds_left}s",
                [{"field": "rate", "message": f"{limits[key]} writes per minute for {who}"}],
                retry_after=max(1, int(seconds_left)),
            )


# The count as a CTE named `rate` for another statement's WITH, and its answer as an expression
# for that statement's select list (JSON: [[key, count, seconds left], ...]).
_COUNT_CTE = (
    "rate AS ("
    + _COUNT_SQL.replace("%(keys)s", "%(rate_keys)s").replace("%(window)s", "%(rate_window)s").strip()
    + ")"
)
# The same, for a statement that runs on its own (autocommit): `unsynced, rate` in its WITH.
_COUNT_CTE_ALONE = (
    f"{_UNSYNCED}, rate AS ("
    + _COUNT_SQL_UNSYNCED.replace("%(keys)s", "%(rate_keys)s")
    .replace("%(window)s", "%(rate_window)s")
    .strip()
    + ")"
)
_COUNTED_COLUMN = "(SELECT json_agg(json_build_array(key, count, seconds)) FROM rate)"
# What `WriteCount.check_taken` finds before `take`: a bug in the write, not a count of zero.
_NOT_TAKEN = object()


class WriteCount:
    """One write's count, folded into the last statement of the write's own transaction.

    The write puts `cte` in that statement's WITH, `column` in its select
    list and `params` among its parameters, then hands the column's value to
    `check` (which refuses past a limit: the transaction then rolls back).
    Each attempt of a retried write starts with `begin`: an attempt rolled
    back took its count with it.
    """

    cte = _COUNT_CTE
    column = _COUNTED_COLUMN

    @staticmethod
    def cte_for_connection() -> str:
        """The count's CTE: in a transaction, `cte`; for a statement on its own, one whose commit need
        not wait for the disk (`_UNSYNCED`), never in a write's transaction, whose commit must.
        """
        return _COUNT_CTE if _in_transaction() else _COUNT_CTE_ALONE

    def __init__(self, *, token_id: str, tenant_id: str) -> None:
        self.limits = _limits(token_id=token_id, tenant_id=tenant_id)
        self.checked = False
        self._taken: list[tuple[Any, ...]] | object = _NOT_TAKEN

    def begin(self) -> None:
        self.checked = False

    def params(self) -> dict[str, Any]:
        return {"rate_keys": sorted(self.limits), "rate_window": WINDOW_SECONDS}

    def check(self, counts: Any) -> None:
        """Refuse (`TooManyRequests`) past a limit; the statement's own count stands otherwise."""
        _refuse_past(self.limits, [tuple(entry) for entry in counts or []])
        self.checked = True

    def take(self, counts: Any) -> None:
        """Keep the statement's count, committed already, for `check_taken` once the write's checks pass."""
        self._taken = [tuple(entry) for entry in counts or []]

    def check_taken(self) -> None:
        """Refuse (`TooManyRequests`) past a limit, by the count `take` kept."""
        if self._taken is _NOT_TAKEN:
            raise RuntimeError("the write's count was never taken")
        assert isinstance(self._taken, list)
        _refuse_past(self.limits, self._taken)
        self.checked = True


@contextmanager
def write_counted(*, token_id: str, tenant_id: str) -> Iterator[WriteCount]:
    """A `WriteCount` for the write run inside; counted on its own when the write did not count it.

    The write raised (its transaction, and the count with it, rolled back) or
    returned along a path that counted nothing (a release of a reservation
    already ended): `writes_count` then, which refuses past a limit like the
    folded count would have.
    """
    rate = WriteCount(token_id=token_id, tenant_id=tenant_id)
    try:
        yield rate
    except Exception as failed:
        try:
            writes_count(token_id=token_id, tenant_id=tenant_id)
        except TooManyRequests:
            raise
        except Exception:
            # The database that failed the write fails the count too: the write's own error stands.
            raise failed from None
        raise
    if not rate.checked:
        writes_count(token_id=token_id, tenant_id=tenant_id)


def rate_windows_prune() -> int:
    """Drop the windows that ended more than an hour ago; return how many (a reconciler chore)."""
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM core_ratewindow WHERE window_start < now() - interval '1 hour'")
        return cursor.rowcount
