"""BookingRepair's sweep: which reservations a run looks at, and how long it retries moves.

A run repairs every reservation with a new problem and clears every mark
that no longer holds (`reservations.lifecycle.repair` does one reservation
in its own transaction); moves retried for reservations already marked take
at most a time budget per run, in rotation, so none starves and the lane
rests between runs.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from django.db import connection

from core.constants import WORKER_CHANNEL
from reservations.lifecycle.repair import COUNTED_SQL, reservation_repair_or_later, rows
from reservations.maintenance.windows import IN_WINDOW_RESERVATIONS_SQL

logger = logging.getLogger(__name__)

# How many times capacity was given back in the reservation `r`'s pool (`PoolCapacityRollup.freed`).
POOL_FREED_SQL = "SELECT COALESCE(sum(q.freed), 0) FROM pool_capacity_rollup q WHERE q.pool_id = r.pool_id"

# The reservations to look at, by id after a cursor: live unmarked ones with a booking that
# is still counted somewhere (phase 0 or 1) on an atom that is not counted or inside a
# maintenance window of its node (`reservations.maintenance.windows`), and the marked
# ones that something could change: no longer live, no longer on a bad atom (clear the
# mark), or still movable (not started, `hold`: retry the move). A marked reservation that
# cannot move and still sits on a bad atom is not looked at again until one of those holds:
# at fleet scale, re-reading thousands of running at-risk reservations on every release
# cost most of a sweep and could change nothing but the wording of a reason.
# The uncounted atoms are found first (few), then their bookings through `booking_device_ends`.
# A movable one is tried again only once capacity was given back in its pool since its last
# failed attempt (its `at_risk_freed` is not the pool's count any more): a pass after which
# nothing was freed moves nothing, so it tries nothing.
_CANDIDATES_SQL = f"""
WITH bad AS MATERIALIZED (
    SELECT d.id FROM inventory_device d
      JOIN inventory_node n ON n.id = d.node_id
      JOIN inventory_pool p ON p.id = n.pool_id
     WHERE NOT {COUNTED_SQL}
),
on_bad AS MATERIALIZED (
    SELECT DISTINCT x.id, r.at_risk_since IS NOT NULL AS marked
      FROM (SELECT a.reservation_id AS id
              FROM device_bookings b
              JOIN reservations_allocation a ON a.id = b.allocation_id
             WHERE b.device_id IN (SELECT id FROM bad) AND b.phase IN (0, 1)
               AND COALESCE(upper(b.during), 'infinity') > compute_now()
               AND NOT a.released
            UNION ALL
            {IN_WINDOW_RESERVATIONS_SQL}) x
      JOIN reservations_reservation r ON r.id = x.id
     WHERE r.state IN ('scheduled', 'active')
)
SELECT id, false AS retry FROM on_bad WHERE NOT marked AND id > %(after)s
UNION ALL
SELECT r.id, r.state IN ('scheduled', 'active') AND EXISTS (SELECT 1 FROM on_bad o WHERE o.id = r.id)
  FROM reservations_reservation r
 WHERE r.at_risk_since IS NOT NULL AND r.id > %(after)s
   AND (r.state NOT IN ('scheduled', 'active')
        OR (r.starts_at > compute_now() AND r.binding = 'hold'
            AND r.at_risk_freed IS DISTINCT FROM ({POOL_FREED_SQL}))
        OR NOT EXISTS (SELECT 1 FROM on_bad o WHERE o.id = r.id))
ORDER BY 1
LIMIT %(limit)s
"""


def _candidates(*, after: str, limit: int) -> list[tuple[str, bool]]:
    """(id, whether it is a retried move) of the reservations a sweep looks at: see `_CANDIDATES_SQL`."""
    return [(row[0], bool(row[1])) for row in rows(_CANDIDATES_SQL, {"after": after, "limit": limit})]


def repair_candidates(*, after: str, limit: int) -> list[str]:
    """The reservations a sweep looks at, by id after `after`: see `_CANDIDATES_SQL`."""
    return [reservation_id for reservation_id, _ in _candidates(after=after, limit=limit)]


@dataclass
class _Rotation:
    """Where the last sweep's retried moves stopped: the next one starts after it, so none starves."""

    last: str = ""


_ROTATION = _Rotation()
# Asks the worker for the next run once the releases' cooldown has passed (`worker.loop`).
REPAIR_LATER = "repair-later"


def _repair_one(reservation_id: str) -> bool:
    """One reservation's repair; whether it changed. A lost deadlock is left for the next run."""
    outcome = reservation_repair_or_later(reservation_id=reservation_id)
    if outcome.action is not None:
        logger.info("reservation %s %s: %s", reservation_id, outcome.action, outcome.reason)
        return True
    return False


# Candidates per page. The page's query finds the uncounted atoms and their bookings afresh,
# so it is large: at 10,000 nodes with 6,000 marked reservations, pages of 200 cost 30 queries
# (about 9 s) for one run.
CANDIDATES_PAGE = 10_000


def bookings_repair(*, limit: int = CANDIDATES_PAGE, retry_seconds: float | None = None) -> int:
    """Re-place or mark at risk the reservations whose bookings sit on unschedulable atoms.

    Returns how many reservations changed (moved, newly marked or with a new
    reason, cleared). Every new problem and every mark to clear is looked at
    once per call, `limit` per page. Moves retried for reservations already
    marked (their pool gave capacity back since their last attempt) take at
    most `retry_seconds` (`CAPACITY_REPAIR_RETRY_SECONDS`) per call, starting
    after where the last call stopped; when some are left, the worker is asked
    to run again after the releases' cooldown (`'repair-later'`), so a busy
    fleet's thousands of at-risk reservations are retried in slices, one per
    cooldown, not in one pass that never rests. A reservation whose transaction loses a deadlock is
    left for the next run.
    """
    from django.conf import settings

    budget = retry_seconds if retry_seconds is not None else settings.CAPACITY_REPAIR_RETRY_SECONDS
    started = time.monotonic()
    changed = 0
    retries: list[str] = []
    after = ""
    while True:
        page = _candidates(after=after, limit=limit)
        for reservation_id, retry in page:
            if retry:
                retries.append(reservation_id)
            elif _repair_one(reservation_id):
                changed += 1
        if len(page) < limit:
            break
        after = page[-1][0]
    retries.sort(key=lambda reservation_id: (reservation_id <= _ROTATION.last, reservation_id))
    for index, reservation_id in enumerate(retries):
        if time.monotonic() - started > budget:
            logger.info("repair retried %d moves, %d left for the next run", index, len(retries) - index)
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_notify(%s, %s)", [WORKER_CHANNEL, REPAIR_LATER])
            break
        if _repair_one(reservation_id):
            changed += 1
        _ROTATION.last = reservation_id
    return changed
