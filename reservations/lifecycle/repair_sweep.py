"""BookingRepair's sweep: which reservations a run looks at, and how long it retries moves.

A run repairs every reservation with a new problem on the nodes a change
named (and, now and then, on the whole fleet) and clears every mark that no
longer holds (`reservations.lifecycle.repair` does one reservation
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
from reservations.lifecycle.repair import (
    COUNTED_SQL,
    LIVE_BOOKING_SQL,
    reservation_repair_or_later,
    rows,
    uncounted_bookings_sql,
)
from reservations.maintenance.windows import IN_WINDOW_RESERVATIONS_SQL

logger = logging.getLogger(__name__)

# How many times capacity was given back in the reservation `r`'s pool (`PoolCapacityRollup.freed`).
POOL_FREED_SQL = "SELECT COALESCE(sum(q.freed), 0) FROM pool_capacity_rollup q WHERE q.pool_id = r.pool_id"

# The atoms that are not counted: the fleet's (a whole-fleet scan) or the named nodes' (by index).
_BAD_ATOMS_SQL = f"""
    SELECT d.id FROM inventory_device d
      JOIN inventory_node n ON n.id = d.node_id
      JOIN inventory_pool p ON p.id = n.pool_id
     WHERE NOT {COUNTED_SQL}"""
_NAMED = " AND n.id = ANY(%(nodes)s::varchar[])"

# Whether the marked reservation `r` still has a live booking on an atom that is not counted, read
# through its own allocations (by index), or one inside a live maintenance window.
_STILL_AT_RISK_SQL = f"""(
    EXISTS (SELECT 1 {uncounted_bookings_sql("r.id")})
    OR EXISTS (SELECT 1 FROM in_window w WHERE w.id = r.id))"""


# The reservations to look at, by id after a cursor:
#
# * live unmarked ones with a booking that is still counted somewhere (phase 0 or 1) on an atom
#   that is not counted, or inside a maintenance window of its node
#   (`reservations.maintenance.windows`): a new problem. A whole-fleet scan looks at every
#   atom; a run between those scans only at the atoms of the nodes named by `RepairRequest`
#   rows (what a node change writes), then at their bookings through `booking_device_ends`;
# * the marked ones that something could change: no longer live, no longer on a bad atom (clear
#   the mark), or still movable (not started, `hold`: retry the move). They are found by the
#   partial index on `at_risk_since` and each is checked through its own bookings, so this
#   costs what the marked reservations hold, not what the fleet holds. A marked reservation that
#   cannot move and still sits on a bad atom is not looked at again until one of those holds:
#   re-reading thousands of running at-risk reservations on every release could change nothing
#   but the wording of a reason. A movable one is tried again only once capacity was given back
#   in its pool since its last failed attempt (its `at_risk_freed` is not the pool's count any
#   more): a pass after which nothing was freed moves nothing, so it tries nothing.
def _candidates_sql(*, named: bool) -> str:
    bad = _BAD_ATOMS_SQL + (_NAMED if named else "")
    return f"""
WITH bad AS MATERIALIZED ({bad}
),
in_window AS MATERIALIZED ({IN_WINDOW_RESERVATIONS_SQL}),
fresh AS MATERIALIZED (
    SELECT DISTINCT x.id
      FROM (SELECT a.reservation_id AS id
              FROM device_bookings b
              JOIN reservations_allocation a ON a.id = b.allocation_id
             WHERE b.device_id IN (SELECT id FROM bad) AND {LIVE_BOOKING_SQL} AND NOT a.released
            UNION ALL
            SELECT id FROM in_window) x
      JOIN reservations_reservation r ON r.id = x.id
     WHERE r.state IN ('scheduled', 'active') AND r.at_risk_since IS NULL AND r.id > %(after)s
),
marked AS MATERIALIZED (
    SELECT r.id, r.pool_id, r.starts_at, r.binding, r.at_risk_freed,
           r.state IN ('scheduled', 'active') AS live, {_STILL_AT_RISK_SQL} AS still
      FROM reservations_reservation r
     WHERE r.at_risk_since IS NOT NULL AND r.id > %(after)s
)
SELECT id, false AS retry FROM fresh
UNION ALL
SELECT r.id, r.live AND r.still
  FROM marked r
 WHERE NOT r.live OR NOT r.still
    OR (r.starts_at > compute_now() AND r.binding = 'hold'
        AND r.at_risk_freed IS DISTINCT FROM ({POOL_FREED_SQL}))
ORDER BY 1
LIMIT %(limit)s
"""


_FLEET_CANDIDATES_SQL = _candidates_sql(named=False)
_NAMED_CANDIDATES_SQL = _candidates_sql(named=True)


def _candidates(*, after: str, limit: int, nodes: list[str] | None) -> list[tuple[str, bool]]:
    """(id, whether it is a retried move) of the reservations a sweep looks at: see `_candidates_sql`.

    `nodes` None scans the whole fleet for new problems; a list looks only at those nodes' atoms.
    """
    if nodes is None:
        found = rows(_FLEET_CANDIDATES_SQL, {"after": after, "limit": limit})
    else:
        found = rows(_NAMED_CANDIDATES_SQL, {"after": after, "limit": limit, "nodes": nodes})
    return [(row[0], bool(row[1])) for row in found]


def repair_candidates(*, after: str, limit: int, nodes: list[str] | None = None) -> list[str]:
    """The reservations a sweep looks at, by id after `after`: see `_candidates_sql`."""
    return [reservation_id for reservation_id, _ in _candidates(after=after, limit=limit, nodes=nodes)]


@dataclass
class _FleetScan:
    """When this process last scanned the whole fleet for new problems (`time.monotonic`)."""

    at: float | None = None


_FLEET_SCAN = _FleetScan()


def _requests_read() -> tuple[list[int], list[str]]:
    """The `RepairRequest` rows committed so far: (their ids, the nodes they name)."""
    found = rows("SELECT id, node_id FROM repair_requests ORDER BY id", {})
    return [row[0] for row in found], sorted({row[1] for row in found})


def _requests_done(request_ids: list[int]) -> None:
    """Delete the requests a run read and looked at; any written since stay for the next run."""
    if request_ids:
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM repair_requests WHERE id = ANY(%s::bigint[])", [request_ids])


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


def bookings_repair(
    *, limit: int = CANDIDATES_PAGE, retry_seconds: float | None = None, fleet: bool | None = None
) -> int:
    """Re-place or mark at risk the reservations whose bookings sit on unschedulable atoms.

    Returns how many reservations changed (moved, newly marked or with a new
    reason, cleared). New problems are looked for on the nodes that node
    changes named since the last run (`RepairRequest`), and on the whole fleet
    when `fleet` says so or, by default, on a process's first run and then at
    most every `CAPACITY_REPAIR_FLEET_SCAN_SECONDS`: the scan that catches what
    no request named, at a cost that grows with the fleet's bookings. Every
    mark that could change is looked at, `limit` per page. Moves retried for
    reservations already marked (their pool gave capacity back since their last
    attempt) take at most `retry_seconds` (`CAPACITY_REPAIR_RETRY_SECONDS`)
    per call, starting after where the last call stopped; when some are left,
    the worker is asked to run again after the releases' cooldown
    (`'repair-later'`), so a busy fleet's thousands of at-risk reservations are
    retried in slices, one per cooldown, not in one pass that never rests. A
    reservation whose transaction loses a deadlock is left for the next run.
    """
    from django.conf import settings

    budget = retry_seconds if retry_seconds is not None else settings.CAPACITY_REPAIR_RETRY_SECONDS
    started = time.monotonic()
    if fleet is None:
        last = _FLEET_SCAN.at
        fleet = last is None or started - last >= settings.CAPACITY_REPAIR_FLEET_SCAN_SECONDS
    # Read before the scan: a request committed after this is left for the next run.
    request_ids, named = _requests_read()
    nodes = None if fleet else named
    changed = 0
    retries: list[str] = []
    after = ""
    while True:
        page = _candidates(after=after, limit=limit, nodes=nodes)
        for reservation_id, retry in page:
            if retry:
                retries.append(reservation_id)
            elif _repair_one(reservation_id):
                changed += 1
        if len(page) < limit:
            break
        after = page[-1][0]
    _requests_done(request_ids)
    if fleet:
        _FLEET_SCAN.at = started
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
