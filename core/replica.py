"""Reads that may lag go to a streaming replica, when one is configured and keeping up.

With no `replica` database alias (the default, and every test but the
cluster's), nothing here does anything: every query goes to `default`.

With one (`DATABASE_REPLICA_URL`), the API methods in `REPLICA_METHODS` (the
rollup reads, the timeline and the hourly usage, whose answers are already
allowed to trail reality by the worker's few seconds) run their handler with
the thread's `default` connection swapped for the replica's. The swap, not
only the router, because the selectors behind them read through raw cursors
as well as the ORM; and it fails safe: a write attempted there is refused by
the read-only standby instead of landing on a stale copy. Authentication
(token, principal, role bindings) has already run on the primary by then, so
a token revoked on the primary stops working at once.

A read stays on the primary when:

* the replica is down, or lags more than `DATABASE_REPLICA_MAX_LAG_SECONDS`
  (checked at most every `DATABASE_REPLICA_CHECK_SECONDS` per process, and
  reported by `/healthz`);
* the tenant wrote recently (read-your-writes): the marker is the tenant's
  shared write counter of the rate limit (`core_ratewindow`, one row per tenant
  and minute, written by every create, release and renew on any API replica),
  so a tenant that wrote within `DATABASE_REPLICA_AFTER_WRITE_SECONDS` (and up
  to one counting window more) reads its own numbers from the primary;
* the replica fails during the handler: the read is answered again on the
  primary and the replica is marked down until the next check.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, InterfaceError, OperationalError, connections

from core.ratelimit import WINDOW_SECONDS

logger = logging.getLogger(__name__)

REPLICA_ALIAS = "replica"
REPLAY_RETRY_SECONDS = 0.05

# The API methods that may read a lagging copy. Everything else, `capacity/preview` and
# `reservations/get`/`list` included, reads the primary (docs/scaling.md, section 4).
REPLICA_METHODS = frozenset(
    {"capacity/summary", "capacity/byPool", "pools/capacity", "capacity/timeline", "usage/hourly"}
)

API_PREFIX = "/api/compute/"

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class ReplicaState:
    """What the last check found: whether reads may go to the replica, and why not."""

    available: bool
    lag_seconds: float | None
    reason: str
    checked_at: float

    @property
    def usable(self) -> bool:
        return self.available and self.lag_seconds is not None and self.lag_seconds <= max_lag_seconds()


def replica_configured() -> bool:
    return REPLICA_ALIAS in settings.DATABASES


def max_lag_seconds() -> float:
    return float(getattr(settings, "DATABASE_REPLICA_MAX_LAG_SECONDS", 5.0))


_state_lock = threading.Lock()
_state: ReplicaState | None = None
# Set while a handler runs on the replica (the router reads it for ORM queries).
_local = threading.local()


def reading_replica() -> bool:
    return bool(getattr(_local, "on_replica", False))


# How far the replica has replayed, as text ('16/B374D848'), and whether it is a standby.
_REPLICA_SQL = "SELECT pg_is_in_recovery(), pg_last_wal_replay_lsn()::text"

# The primary's positions at the last checks: (monotonic time, LSN). A replica that has
# replayed up to the position the primary had at time t is at most `now - t` behind. This
# bounds the lag by what was measured, where the age of the last replayed commit would call
# an idle replica late as soon as the primary writes WAL that is no commit (a checkpoint).
_positions: deque[tuple[float, int]] = deque(maxlen=256)


def lsn_int(text: str) -> int:
    """`'16/B374D848'` -> its position as an integer."""
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)


def _check() -> ReplicaState:
    try:
        with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
            cursor.execute("SELECT pg_current_wal_lsn()::text")
            (primary_lsn,) = cursor.fetchone()
        asked = time.monotonic()
        with connections[REPLICA_ALIAS].cursor() as cursor:
            cursor.execute(_REPLICA_SQL)
            in_recovery, replayed = cursor.fetchone()
            if in_recovery and replayed is not None and lsn_int(replayed) < lsn_int(primary_lsn):
                # Streaming is milliseconds behind when healthy: look once more before judging.
                time.sleep(REPLAY_RETRY_SECONDS)
                cursor.execute(_REPLICA_SQL)
                in_recovery, replayed = cursor.fetchone()
    except DatabaseError as error:
        _close_replica()
        return ReplicaState(False, None, f"replica: {error.__class__.__name__}", time.monotonic())
    now = time.monotonic()
    if not in_recovery or replayed is None:
        return ReplicaState(False, None, "replica: not a standby", now)
    with _state_lock:
        _positions.append((asked, lsn_int(primary_lsn)))
        reached = [at for at, position in _positions if position <= lsn_int(replayed)]
    if reached and max(reached) == asked:
        return ReplicaState(True, 0.0, "", now)
    lag = now - max(reached) if reached else None
    if lag is None or lag > max_lag_seconds():
        return ReplicaState(True, lag, f"replica: lags more than {max_lag_seconds():g}s", now)
    return ReplicaState(True, lag, "", now)


def _close_replica() -> None:
    try:
        connections[REPLICA_ALIAS].close()
    except DatabaseError:
        logger.debug("closing the replica connection failed", exc_info=True)


def replica_state(*, fresh: bool = False) -> ReplicaState | None:
    """The replica's state, checked at most every `DATABASE_REPLICA_CHECK_SECONDS`; None without one."""
    global _state
    if not replica_configured():
        return None
    every = float(getattr(settings, "DATABASE_REPLICA_CHECK_SECONDS", 1.0))
    with _state_lock:
        state = _state
    if state is not None and not fresh and time.monotonic() - state.checked_at < every:
        return state
    state = _check()
    with _state_lock:
        _state = state
    return state


def replica_mark_down(reason: str) -> None:
    """Send reads to the primary until the next check (the replica just failed a read)."""
    global _state
    with _state_lock:
        _state = ReplicaState(False, None, reason, time.monotonic())


_RECENT_WRITE_SQL = """
SELECT EXISTS (
  SELECT 1 FROM core_ratewindow
   WHERE key = %s AND window_start > now() - (%s + %s) * interval '1 second')
"""


def tenant_wrote_recently(tenant_id: str) -> bool:
    """Whether the tenant wrote within the read-your-writes window, on any API replica (one index probe)."""
    seconds = int(getattr(settings, "DATABASE_REPLICA_AFTER_WRITE_SECONDS", 5))
    with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
        cursor.execute(_RECENT_WRITE_SQL, [f"tenant:{tenant_id}", seconds, WINDOW_SECONDS])
        (recent,) = cursor.fetchone()
    return bool(recent)


@contextmanager
def _on_replica() -> Iterator[None]:
    """The thread's `default` connection is the replica's for the block (raw SQL and the ORM alike)."""
    primary = connections[DEFAULT_DB_ALIAS]
    connections[DEFAULT_DB_ALIAS] = connections[REPLICA_ALIAS]
    _local.on_replica = True
    try:
        yield
    finally:
        connections[DEFAULT_DB_ALIAS] = primary
        _local.on_replica = False


def replica_read_allowed(*, method: str, tenant_id: object) -> bool:
    """Whether this call of `method` for `tenant_id` may read the replica now."""
    if method not in REPLICA_METHODS or not replica_configured() or not isinstance(tenant_id, str):
        return False
    state = replica_state()
    if state is None or not state.usable:
        return False
    return not tenant_wrote_recently(tenant_id)


def api_method_of(path: str) -> str:
    """`/api/compute/capacity/summary` -> `capacity/summary`."""
    return path.split(API_PREFIX, 1)[-1].strip("/")


def replica_aware(handler: F) -> F:
    """Run an API handler on the replica when its method and the replica's state allow it.

    Wraps every `rpc_action`; for a method not in `REPLICA_METHODS`, or with no
    replica configured, it only calls the handler.
    """

    @functools.wraps(handler)
    def wrapped(view: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        if not replica_configured():
            return handler(view, request, *args, **kwargs)
        data = request.data if isinstance(request.data, dict) else {}
        if not replica_read_allowed(method=api_method_of(request.path), tenant_id=data.get("tenantId")):
            return handler(view, request, *args, **kwargs)
        try:
            with _on_replica():
                return handler(view, request, *args, **kwargs)
        except (OperationalError, InterfaceError) as error:
            # The replica went away or cancelled the query (a conflict with recovery): a read is
            # safe to answer again, and the primary has everything the replica had. A write tried
            # there is an InternalError (read-only), which is not caught: that is a bug to see.
            logger.warning("a read failed on the replica (%s); answered from the primary", error)
            replica_mark_down(f"replica: {error.__class__.__name__}")
            _close_replica()
            return handler(view, request, *args, **kwargs)

    return wrapped  # type: ignore[return-value]


def replica_health() -> dict[str, Any] | None:
    """The replica's part of `/healthz`: where the lag-tolerant reads go now, and why."""
    state = replica_state(fresh=True)
    if state is None:
        return None
    return {
        "status": "ok" if state.usable else "fallback",
        "readsFrom": "replica" if state.usable else "primary",
        "available": state.available,
        "lagSeconds": round(state.lag_seconds, 3) if state.lag_seconds is not None else None,
        "maxLagSeconds": max_lag_seconds(),
        "reason": state.reason or None,
    }


_WRITES_SQL = """
SELECT host(inet_server_addr()), inet_server_port(), pg_is_in_recovery(),
       (SELECT timeline_id FROM pg_control_checkpoint())
"""


def writes_health() -> dict[str, Any]:
    """Where writes go now: the server the `default` connection reaches, and whether it takes writes.

    Behind a pooler and a balancer that follows the leader (`make cluster`)
    this is the member that leads, by its address; its timeline moves on at
    each failover or switchover. A socket connection has no address (`to`: the
    socket). `accepting` is False when that server is a standby (a leader being
    demoted): the writes sent there are refused until the balancer moves.
    Raises DatabaseError when the database does not reply.
    """
    with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
        cursor.execute(_WRITES_SQL)
        host, port, in_recovery, timeline = cursor.fetchone()
    return {
        "to": f"{host}:{port}" if host else "socket",
        "accepting": not in_recovery,
        "timeline": timeline,
    }
