"""The rollup rebuild: recount every pool from nodes, devices, bookings and node resources.

Reading capacity never aggregates devices; it reads the ledger's rollup rows.
The booking transaction keeps them current with deltas (`ledger.rollups`);
this rebuild, run by the reconciler, is the safety net that recounts the truth
and stores it through the ledger, in one transaction per batch of pools.

What the rebuild counts, per pool and resource (the seeds' capacity math):

* atoms (`gpu`, `gpu.mig`, `gpu.slot`, `nic.vf`, `disk`, `node`) are bookable
  devices. Nodes in the `excluded` bucket are not counted at all. A node's
  bucket comes from `inventory.schedulability.bucket_sql()`; unhealthy atoms on
  schedulable nodes land in `unhealthy`.
* `allocatable` = healthy atoms on schedulable nodes. `allocated` and
  `reserved` count only those same atoms (a booking whose `during` contains
  `compute_now()`, and one that starts after it). Bookings on atoms that sit in
  a bucket (a cordoned node still running its workload, an atom that went
  unhealthy) are left out, so `allocated + reserved` never exceeds
  `allocatable` by more than the conservative double count of an atom booked
  now and later, and `available` stays the number of atoms a new request could
  get. Layout-change bookings (guard 2) are bookings like any other.
* scalars (`vcpu`, `memoryGiB`, `diskGiB`, `hugepages1Gi`) come from
  `node_resources`: `allocatable` = sum of `floor(allocatable * ratio)` on
  schedulable nodes, `allocated` = sum of `allocated` on those nodes, never
  `reserved` (a scalar claim is taken when the reservation is placed); the
  buckets hold `floor(allocatable * ratio)` of the nodes in them.
* a pool gets a row for each resource some counted node of it has, and always
  a `gpu` row, so the summary's per-model sums see every pool.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from django.db import OperationalError, connection, transaction

from core.constants import DEADLOCK_DETECTED
from inventory.models import Pool
from inventory.schedulability import EXCLUDED, SCHEDULABLE, bucket_sql
from ledger.models import PoolCapacityRollup
from ledger.rollups import ROLLUP_STORED_COUNTS, rollup_rows_lock, rollup_rows_store

logger = logging.getLogger(__name__)

# Pools rebuilt per transaction by `rollup_rebuild_all`: one counting
# statement each. Large enough that a typical fleet is one statement, small
# enough that a huge one does not hold every rollup row locked at once.
REBUILD_BATCH_POOLS = 500
# A rebuild that loses a deadlock to a booking transaction retries; the
# booking transaction, not the dashboard number, should win.
DEADLOCK_RETRIES = 3


def _count_sql(*, probe_atoms: bool) -> str:
    """Step 3: one statement that counts the pools.

    It is a new statement after the lock, so under READ COMMITTED it reads a
    snapshot taken after the lock was granted. Nodes come through `node_pool`
    and devices through `device_atoms`. Bookings not yet over are read in one
    of two ways: for a whole fleet, one bitmap scan of the GiST index on
    `(device_id, during)` for `during && [now, )`, hashed by device (cheap:
    only live bookings); for one pool (`probe_atoms`), one probe of that index
    per counted atom, so a small pool does not read the fleet's bookings.
    """
    bucket = bucket_sql("n", "p.owner_id")
    atom_probe = (
        f"AND b.device_id IN (SELECT a.id FROM atoms a WHERE a.bucket = '{SCHEDULABLE}' AND a.healthy)"
        if probe_atoms
        else ""
    )
    return f"""
WITH nodes AS MATERIALIZED (
    SELECT n.id, n.pool_id, {bucket} AS bucket
      FROM inventory_node n
      JOIN inventory_pool p ON p.id = n.pool_id
     WHERE n.pool_id = ANY(%(pools)s::varchar[])
),
atoms AS MATERIALIZED (
    SELECT d.id, d.device_class AS resource, d.healthy, nd.pool_id, nd.bucket
      FROM inventory_device d
      JOIN nodes nd ON nd.id = d.node_id
     WHERE d.bookable AND nd.bucket <> '{EXCLUDED}'
),
live_bookings AS (
    SELECT b.device_id,
           bool_or(b.during @> compute_now()) AS booked_now,
           -- The seeds' reserved counts bookings that start later, not atoms: an atom booked
           -- twice in the future counts twice, exactly as the booking transactions' deltas add it.
           count(*) FILTER (WHERE lower(b.during) > compute_now()) AS booked_later
      FROM device_bookings b
     WHERE b.during && tstzrange(compute_now(), NULL)
       {atom_probe}
     GROUP BY b.device_id
),
atom_counts AS (
    SELECT a.pool_id, a.resource,
           count(*) FILTER (WHERE a.bucket = '{SCHEDULABLE}' AND a.healthy) AS allocatable,
           count(*) FILTER (WHERE a.bucket = '{SCHEDULABLE}' AND a.healthy AND lb.booked_now) AS allocated,
           COALESCE(sum(lb.booked_later) FILTER (WHERE a.bucket = '{SCHEDULABLE}' AND a.healthy), 0)::bigint
               AS reserved,
           count(*) FILTER (WHERE a.bucket = 'provisioning') AS provisioning,
           count(*) FILTER (WHERE a.bucket = 'unhealthy'
                              OR (a.bucket = '{SCHEDULABLE}' AND NOT a.healthy)) AS unhealthy,
           count(*) FILTER (WHERE a.bucket = 'maintenance') AS maintenance,
           count(*) FILTER (WHERE a.bucket = 'unreachable') AS unreachable
      FROM atoms a
      LEFT JOIN live_bookings lb ON lb.device_id = a.id
     GROUP BY a.pool_id, a.resource
),
scalar_counts AS (
    SELECT nd.pool_id, r.resource,
           COALESCE(sum(floor(r.allocatable * r.ratio)) FILTER (WHERE nd.bucket = '{SCHEDULABLE}'), 0)
               AS allocatable,
           COALESCE(sum(r.allocated) FILTER (WHERE nd.bucket = '{SCHEDULABLE}'), 0) AS allocated,
           0 AS reserved,
           COALESCE(sum(floor(r.allocatable * r.ratio)) FILTER (WHERE nd.bucket = 'provisioning'), 0)
               AS provisioning,
           COALESCE(sum(floor(r.allocatable * r.ratio)) FILTER (WHERE nd.bucket = 'unhealthy'), 0)
               AS unhealthy,
           COALESCE(sum(floor(r.allocatable * r.ratio)) FILTER (WHERE nd.bucket = 'maintenance'), 0)
               AS maintenance,
           COALESCE(sum(floor(r.allocatable * r.ratio)) FILTER (WHERE nd.bucket = 'unreachable'), 0)
               AS unreachable
      FROM inventory_noderesource r
      JOIN nodes nd ON nd.id = r.node_id
     WHERE nd.bucket <> '{EXCLUDED}'
     GROUP BY nd.pool_id, r.resource
),
counts AS (
    SELECT * FROM atom_counts
    UNION ALL
    SELECT * FROM scalar_counts
    UNION ALL
    -- Every pool has a gpu row, even with no GPU counted, so summaries add up.
    SELECT p.pool_id, 'gpu', 0, 0, 0, 0, 0, 0, 0
      FROM unnest(%(pools)s::varchar[]) AS p(pool_id)
     WHERE EXISTS (SELECT 1 FROM inventory_pool ip WHERE ip.id = p.pool_id)
       AND NOT EXISTS (SELECT 1 FROM atom_counts ac WHERE ac.pool_id = p.pool_id AND ac.resource = 'gpu')
)
SELECT c.pool_id, c.resource, c.allocatable::bigint, c.allocated::bigint, c.reserved::bigint,
       c.provisioning::bigint, c.unhealthy::bigint, c.maintenance::bigint, c.unreachable::bigint
  FROM counts c
"""


_COUNT_ONE_POOL_SQL = _count_sql(probe_atoms=True)
_COUNT_MANY_POOLS_SQL = _count_sql(probe_atoms=False)


def _after_lock() -> None:
    """Nothing; tests patch in a pause here to fix one interleaving of a rebuild and a booking."""


def _is_deadlock(error: OperationalError) -> bool:
    return getattr(error.__cause__, "sqlstate", None) == DEADLOCK_DETECTED


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
            if not _is_deadlock(error) or attempt == DEADLOCK_RETRIES:
                raise
            logger.warning("rollup rebuild lost a deadlock on %d pool(s); retrying", len(pool_ids))


def rollup_rebuild(*, pool_id: str) -> list[PoolCapacityRollup]:
    """Recount one pool from nodes, devices, bookings and node resources; return its rows."""
    _rebuild_pools([pool_id])
    return list(PoolCapacityRollup.objects.filter(pool_id=pool_id).order_by("resource"))


def rollup_rebuild_all(*, progress: Callable[[int, int], None] | None = None) -> int:
    """Recount every pool, a batch of pools per transaction; return how many pools were rebuilt.

    `progress(done, total)` is called before the first batch and after each one.
    """
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
