"""When the worker's jobs next fall due: every kind of deadline in ONE query (`next_deadline`).

The loop (`worker.loop`) runs it on every wake and sleeps until the earliest
answer. The deadlines in the rows: the earliest live lease expiry
(`lease-expire`), the earliest end of a live reservation (`reservation-settle`),
the earliest start of a future booking or end of a running one
(`bookings-advance`), the oldest watched heartbeat plus
`CAPACITY_NODE_STALE_SECONDS` (`nodes-stale`), the earliest outbox retry
(`outbox-deliver`), the end of the grace after the hour that follows the last
closed hour of usage (`usage-close`), the next start of a scheduled maintenance
window or end of an active one (`maintenance-windows`); and for each periodic job, its last
success in its `WorkerJob` row plus its period. The times are on the database
clock (`compute_now()`), which the loop converts into sleeps of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db import connection

from capacity.services import usage_next_close_sql
from reservations.maintenance.toggle import NEXT_SWITCH_SQL
from worker.jobs import worker_jobs, worker_periods

_DEADLINES_SQL = f"""
SELECT compute_now(),
       (SELECT min(lease_expires_at) FROM reservations_reservation
         WHERE state IN ('scheduled', 'active') AND lease_expires_at IS NOT NULL),
       (SELECT min(ends_at) FROM reservations_reservation WHERE state IN ('scheduled', 'active')),
       (SELECT min(lower(during)) FROM device_bookings WHERE phase = 0),
       (SELECT min(upper(during)) FROM device_bookings WHERE phase = 1),
       (SELECT min(last_heartbeat_at) FROM inventory_node
         WHERE connectivity = 'connected' AND last_heartbeat_at IS NOT NULL)
           + make_interval(secs => %(stale)s),
       (SELECT min(next_attempt_at) FROM reservations_delivery),
       {usage_next_close_sql()},
       {NEXT_SWITCH_SQL},
       ARRAY(SELECT COALESCE(w.last_ok_at + make_interval(secs => p.every), compute_now())
                FROM unnest(%(periodic_names)s::varchar[], %(periodic_every)s::float8[])
                         WITH ORDINALITY AS p(name, every, i)
                LEFT JOIN core_workerjob w ON w.name = p.name
               ORDER BY p.i)
"""

# The deadlines a job can serve (the fields of `Deadlines`), in the order `_DEADLINES_SQL` selects them.
DEADLINE_KINDS = (
    "lease_expiry",
    "reservation_end",
    "booking_start",
    "booking_end",
    "node_stale",
    "delivery",
    "usage_close",
    "maintenance_switch",
)


@dataclass(frozen=True)
class Deadlines:
    """When each kind of time-driven work next falls due (None: nothing of that kind is pending)."""

    now: datetime
    lease_expiry: datetime | None
    reservation_end: datetime | None
    booking_start: datetime | None
    booking_end: datetime | None
    node_stale: datetime | None
    delivery: datetime | None
    # A periodic job's next run, by job name: its last success plus its period (now if it never succeeded).
    periodic: dict[str, datetime] = field(default_factory=dict)
    # When the hour after the last closed one may close (None before the first close).
    usage_close: datetime | None = None
    # The next start of a scheduled maintenance window or end of an active one.
    maintenance_switch: datetime | None = None

    def of(self, kind: str) -> datetime | None:
        value: datetime | None = getattr(self, kind)
        return value

    @property
    def earliest(self) -> datetime | None:
        """The first deadline of any kind (what the loop sleeps until, before caps and backoffs)."""
        times = [t for t in (self.of(kind) for kind in DEADLINE_KINDS) if t is not None]
        times.extend(self.periodic.values())
        return min(times, default=None)


def next_deadline(*, periodic: dict[str, float] | None = None) -> Deadlines:
    """Every kind of deadline in one query, each read from its partial index; `periodic`: job name → period.

    The indexes: `reservation_lease_live`, `reservation_live_ends`,
    `booking_phase_future`, `booking_phase_running`, `node_heartbeat_watch`,
    `delivery_due`, `capacity_usagehour`'s primary key, `maintenance_window_live`, and `core_workerjob`'s
    primary key for the periodic jobs.
    """
    periodic = periodic if periodic is not None else worker_periods(worker_jobs())
    names = sorted(periodic)
    with connection.cursor() as cursor:
        cursor.execute(
            _DEADLINES_SQL,
            {
                "stale": float(settings.CAPACITY_NODE_STALE_SECONDS),
                "periodic_names": names,
                "periodic_every": [float(periodic[name]) for name in names],
                "usage_grace": float(settings.CAPACITY_USAGE_CLOSE_GRACE_SECONDS),
            },
        )
        row = cursor.fetchone()
    assert row is not None
    # Between `now` and the periodic jobs' times: one column per kind, in `DEADLINE_KINDS` order.
    now, *times, due = row
    kinds = dict(zip(DEADLINE_KINDS, times, strict=True))
    return Deadlines(now=now, periodic=dict(zip(names, due, strict=True)), **kinds)
