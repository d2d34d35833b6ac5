"""The rollup rebuild: recount every pool from nodes, devices, bookings and node resources.

Reading capacity never aggregates devices; it reads the pools' rollup rows.
The booking transaction keeps them current with deltas (`reservations.rollups.deltas`);
this rebuild, run by the worker, is the safety net that recounts the truth and
stores it through the rows' one writer (`deltas`), in one transaction per batch of pools.

What the rebuild counts is `reservations.rollups.counts` (the same definition node
events use to move a node's atoms between buckets): per pool and resource,
counted atoms in `allocatable`, their RUNNING bookings in `allocated` and
FUTURE ones in `reserved` (phases, not the clock), the others in their
buckets, the scalars of `node_resources`, and always a `gpu` row. Because it
counts phases, the public entry points first move every booking whose start
or end has passed (`reservations.lifecycle.phases.bookings_advance`), so a rebuild
always reflects the clock and agrees with the deltas.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from django.db import OperationalError, connection, transaction

from core.retry import lost_deadlock
from inventory.models import Pool
from reservations.lifecycle.phases import bookings_advance
from reservations.models import PoolCapacityRollup
from reservations.rollups.counts import counts_sql
from reservations.rollups.deltas import ROLLUP_STORED_COUNTS, rollup_rows_lock, rollup_rows_store

logger = logging.getLogger(__name__)

# Pools rebuilt per transaction by `rollup_rebuild_all`: one counting
# statement each. Large enough that a typical fleet is one statement, small
# enough that a huge one does not hold every rollup row locked at once.
REBUILD_BATCH_POOLS = 500
# A rebuild that loses a deadlock to a booking transaction retries; the
# booking transaction, not the dashboard number, should win.
DEADLOCK_RETRIES = 3


def _count_sql(*, probe_atoms: bool) -> str:
    """Step 3: one statement that counts the pools (`reservations.rollups.counts`), plus their `gpu` rows.

    It is a new statement after the lock, so under READ COMMITTED it reads a
    snapshot taken after the lock was granted. For a whole fleet the FUTURE and
    RUNNING bookings are read once through the partial phase indexes and hashed
    by atom; for one pool (`probe_atoms`), one index probe per counted atom, so
    a small pool does not read the fleet's bookings.
    """
    counted = counts_sql(selection="n.pool_id = ANY(%(pools)s::varchar[])", probe_atoms=probe_atoms)
    return f"""
WITH counts AS ({counted})
SELECT c.pool_id, c.resource, c.allocatable, c.allocated, c.reserved,
       c.provisioning, c.unhealthy, c.maintenance, c.unreachable
  FROM counts c
UNION ALL
-- Every pool has a gpu row, even with no GPU counted, so summaries add up.
SELECT p.pool_id, 'gpu', 0, 0, 0, 0, 0, 0, 0
  FROM unnest(%(pools)s::varchar[]) AS p(pool_id)
 WHERE EXISTS (SELECT 1 FROM inventory_pool ip WHERE ip.id = p.pool_id)
   AND NOT EXISTS (SELECT 1 FROM counts c WHERE c.pool_id = p.pool_id AND c.resource = 'gpu')
"""


_COUNT_ONE_POOL_SQL = _count_sql(probe_atoms=True)
_COUNT_MANY_POOLS_SQL = _count_sql(probe_atoms=False)


def _after_lock() -> None:
    """Nothing; tests patch in a pause here to fix one interleaving of a rebuild and a booking."""


def _rebuild_pools(pool_ids: list[str]) -> None:
    """Lock, count and write the rows of these pools in one transaction (retried on deadlock)."""
    for attempt in range(DEADLOCK_RETRIES + 1):
        try:
            with transaction.atomic():
                rollup_rows_lock(pool_ids=pool_ids)
                _after_lock()
                with connection.cursor() as cursor:
                    cursor.execute(
                        _COUNT_ONE_POOL_SQL if len(pool_ids) == 1 else _COUNT_MANY_POOLS_SQL,
                        {"pools": pool_ids},
                    )
                    columns = ["pool_id", "resource", *ROLLUP_STORED_COUNTS]
                    rows = [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
                rollup_rows_store(pool_ids=pool_ids, rows=rows)
            return
        except OperationalError as error:
            if not lost_deadlock(error) or attempt == DEADLOCK_RETRIES:
                raise
            logger.warning("rollup rebuild lost a deadlock on %d pool(s); retrying", len(pool_ids))


def rollup_recount(*, pool_ids: list[str]) -> dict[tuple[str, str], dict[str, int]]:
    """What a rebuild of these pools would store, `{(pool, resource): {count: n}}`, writing nothing.

    Read-only, and it moves no phase: at any committed instant the rows must
    already equal it (every writer applies its delta in its own transaction),
    which is what the invariant checks compare.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            _COUNT_ONE_POOL_SQL if len(pool_ids) == 1 else _COUNT_MANY_POOLS_SQL, {"pools": pool_ids}
        )
        return {
            (pool_id, resource): dict(zip(ROLLUP_STORED_COUNTS, counts, strict=True))
            for pool_id, resource, *counts in cursor.fetchall()
        }


def rollup_rebuild(*, pool_id: str) -> list[PoolCapacityRollup]:
    """Recount one pool from nodes, devices, bookings and node resources; return its rows.

    Bookings whose start or end has passed are moved first (their own
    transactions), so the count reflects the clock.
    """
    bookings_advance()
    _rebuild_pools([pool_id])
    return list(PoolCapacityRollup.objects.filter(pool_id=pool_id).order_by("resource"))


def rollup_rebuild_all(*, progress: Callable[[int, int], None] | None = None) -> int:
    """Recount every pool, a batch of pools per transaction; return how many pools were rebuilt.

    `progress(done, total)` is called before the first batch and after each one.
    Bookings whose start or end has passed are moved first, as in `rollup_rebuild`.
    """
    bookings_advance()
    pool_ids = list(Pool.objects.order_by("id").values_list("id", flat=True))
    total = len(pool_ids)
    if progress is not None:
        progress(0, total)
    done = 0
    for batch in _batches(pool_ids, REBUILD_BATCH_POOLS):
        _rebuild_pools(batch)
        done += len(batch)
        if progress is not None:
            progress(done, total)
    return total


def _batches(items: list[str], size: int) -> Iterable[list[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
