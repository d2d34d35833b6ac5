"""The reservations' time-driven work: leases that ran out, reservations that reached their end.

`lease_expire_due` releases live reservations whose lease passed unrenewed
(through the API's own release, so waiting creates wake and the nodes are
told); `reservation_settle_ended` gives back what reservations that ran to
their end held for their duration. The worker sleeps until
`reservations_next_deadline()` and runs them (`worker.jobs`); one
reconciler pass runs everything due (`reservations_reconcile`).

Both take one reservation per transaction, `FOR UPDATE SKIP LOCKED`, so
several workers share the work and none waits on a row another holds.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db import OperationalError, connection, transaction

from core.retry import lost_deadlock
from reservations.delivery.outbox import outbox_deliver_due
from reservations.models import Reservation
from reservations.placer.cut import reservation_cut
from reservations.services import RELEASE_ATTEMPTS, reservation_release
from reservations.waits import RELEASE_CHANNEL

logger = logging.getLogger(__name__)


def _one_at_a_time(*, pick_sql: str, act: Any, limit: int) -> int:
    """Run `act(row)` on each row `pick_sql` picks, one per transaction; return how many were done.

    `pick_sql` locks one row `FOR UPDATE SKIP LOCKED` (a row another worker, a
    release or a renew holds is left alone) and excludes the ids in its one
    parameter, those already tried by this call, so a call always ends. A
    transaction PostgreSQL chose as a deadlock victim (a release locks nodes and
    scalar rows that a gang placement may hold) is tried again, a few times.
    """
    done = 0
    tried: list[str] = []
    failures: dict[str, int] = {}
    while len(tried) < limit:
        row = None
        try:
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute(pick_sql, [tried])
                    row = cursor.fetchone()
                if row is None:
                    return done
                if act(row):
                    done += 1
                tried.append(row[0])
        except OperationalError as exc:
            if not lost_deadlock(exc) or row is None:
                raise
            failures[row[0]] = failures.get(row[0], 0) + 1
            if failures[row[0]] >= RELEASE_ATTEMPTS:
                logger.warning(
                    "reservation %s lost %d deadlocks; left for the next run", row[0], RELEASE_ATTEMPTS
                )
                tried.append(row[0])
    return done


# A live lease whose deadline passed, before the reservation's end (a reservation that
# reached its end is settled instead), earliest first through `reservation_lease_live`.
_LEASE_DUE_SQL = """
SELECT id FROM reservations_reservation
 WHERE state IN ('scheduled', 'active') AND lease_expires_at IS NOT NULL
   AND lease_expires_at <= compute_now() AND ends_at > compute_now() AND id <> ALL(%s)
 ORDER BY lease_expires_at
 LIMIT 1
   FOR UPDATE SKIP LOCKED
"""


def lease_expire_due(*, limit: int = 500) -> int:
    """Release live reservations whose lease passed unrenewed; return how many (a worker job).

    Each in its own transaction (a release locks the reservation's nodes and
    scalar rows; several in one transaction could deadlock with node changes),
    through the same release as the API's, so waiting creates of the pool wake
    and the nodes are told.
    """

    def expire(row: tuple[Any, ...]) -> bool:
        # Inside this row's transaction the release makes one attempt; a deadlock is retried here.
        released = reservation_release(
            reservation=Reservation(pk=row[0]), actor="lease-reconciler", reason="lease expired"
        )
        return released.state == "released"

    return _one_at_a_time(pick_sql=_LEASE_DUE_SQL, act=expire, limit=limit)


# A live reservation that reached its end, earliest first through `reservation_live_ends`.
_ENDED_DUE_SQL = """
SELECT id, pool_id, tenant_id, ends_at, compute_now() FROM reservations_reservation
 WHERE state IN ('scheduled', 'active') AND ends_at <= compute_now() AND id <> ALL(%s)
 ORDER BY ends_at
 LIMIT 1
   FOR UPDATE SKIP LOCKED
"""

# The settled reservation's state, and the waiting creates of its pool woken at commit.
_SETTLED_SQL = """
WITH ended AS (UPDATE reservations_reservation SET state = 'ended' WHERE id = %s RETURNING pool_id)
SELECT pg_notify(%s, pool_id) FROM ended
"""


def reservation_settle_ended(*, limit: int = 500) -> int:
    """Give back the scalars and quota of reservations that ran to their end; return how many.

    One reservation per transaction. Their bookings stay as they are
    (history); only the claims held for the duration are returned, once (the
    allocations' `released` flag), and the creates waiting on the pool wake:
    the quota and the scalars given back may be what they wait for.
    """

    def settle(row: tuple[Any, ...]) -> bool:
        reservation_id, pool_id, tenant_id, ends_at, now = row
        reservation_cut(
            reservation_id=reservation_id, at=ends_at, now=now, pool_id=pool_id, tenant_id=tenant_id
        )
        with connection.cursor() as cursor:
            cursor.execute(_SETTLED_SQL, [reservation_id, RELEASE_CHANNEL])
        return True

    return _one_at_a_time(pick_sql=_ENDED_DUE_SQL, act=settle, limit=limit)


def reservations_next_deadline() -> datetime | None:
    """The earliest live lease expiry or live reservation end (the worker's schedule); None when none.

    Two index probes (`reservation_lease_live`, `reservation_live_ends`) in one statement.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT LEAST("
            " (SELECT min(lease_expires_at) FROM reservations_reservation"
            "   WHERE state IN ('scheduled', 'active') AND lease_expires_at IS NOT NULL),"
            " (SELECT min(ends_at) FROM reservations_reservation WHERE state IN ('scheduled', 'active')))"
        )
        row = cursor.fetchone()
    return None if row is None else row[0]


def reservations_reconcile() -> None:
    """The reservations' time-driven work in one pass: due leases, ended reservations, due deliveries."""
    lease_expire_due()
    reservation_settle_ended()
    outbox_deliver_due()
