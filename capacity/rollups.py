"""Pool capacity rollups: deltas in the booking transaction, and the rebuild.

Reading capacity never aggregates devices; it reads these rows. The booking
transaction applies deltas (`rollup_apply_delta`), and the reconciler's
rebuild recounts from nodes, devices, bookings and node resources.

What the rebuild counts, per pool and resource (the seeds' capacity math):

* atoms (`gpu`, `gpu.mig`, `gpu.slot`, `nic.vf`, `disk`, `node`) are bookable
  devices. Nodes in the `excluded` bucket are not counted at all. A node's
  bucket comes from `capacity.schedulability.bucket_sql()`; unhealthy atoms on
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
from collections.abc import Callable, Iterable, Mapping

from django.db import OperationalError, connection, transaction

from capacity.models import PoolCapacityRollup
from capacity.schedulability import EXCLUDED, SCHEDULABLE, bucket_sql

logger = logging.getLogger(__name__)

ATOM_RESOURCES = ("gpu", "gpu.mig", "gpu.slot", "nic.vf", "disk", "node")
SCALAR_RESOURCES = ("vcpu", "memoryGiB", "diskGiB", "hugepages1Gi")
ALL_RESOURCES = tuple(sorted(ATOM_RESOURCES + SCALAR_RESOURCES))

# Pools rebuilt per transaction by `rollup_rebuild_all`: one counting
# statement each. Large enough that a typical fleet is one statement, small
# enough that a huge one does not hold every rollup row locked at once.
REBUILD_BATCH_POOLS = 500
# A rebuild that loses a deadlock to a booking transaction retries; the
# booking transaction, not the dashboard number, should win.
DEADLOCK_RETRIES = 3


def rollup_apply_delta(*, pool_id: str, resource: str, allocated: int = 0, reserved: int = 0) -> None:
    """Add a placement's (or subtract a release's) atoms, inside the caller's transaction.

    `allocated` counts bookings that have started, `reserved` those that start
    later. Counts never go below zero: a booking that started after the last
    rebuild sits in `reserved` until the next one, and its release may subtract
    from `allocated`; the rebuild corrects that drift.

    Scalars (`vcpu`, ...) go to `allocated` only, as the rebuild counts them.
    A caller touching several resources of one pool should use
    `rollup_apply_deltas`, which locks the rows in the rebuild's order.
    """
    if not allocated and not reserved:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO pool_capacity_rollup (pool_id, resource, total, allocatable, allocated,
                reserved, provisioning, unhealthy, maintenance, unreachable, updated_at)
            VALUES (%(pool)s, %(resource)s, 0, 0, GREATEST(0, %(allocated)s), GREATEST(0, %(reserved)s),
                0, 0, 0, 0, compute_now())
            ON CONFLICT (pool_id, resource) DO UPDATE
               SET allocated = GREATEST(0, pool_capacity_rollup.allocated + %(allocated)s),
                   reserved = GREATEST(0, pool_capacity_rollup.reserved + %(reserved)s),
                   updated_at = compute_now()
            """,
            {"pool": pool_id, "resource": resource, "allocated": allocated, "reserved": reserved},
        )


# All of one pool's deltas in one statement. The rows are inserted (or
# updated) in the order the SELECT produces them, resource by code point, the
# order in which the rebuild locks them (`_LOCK_ROWS_SQL`), so a booking
# transaction and a rebuild queue behind each other instead of deadlocking.
_APPLY_DELTAS_SQL = """
WITH d AS (
    SELECT resource, allocated, reserved
      FROM unnest(%(resources)s::varchar[], %(allocated)s::bigint[], %(reserved)s::bigint[])
           AS d(resource, allocated, reserved)
)
INSERT INTO pool_capacity_rollup AS r (pool_id, resource, total, allocatable, allocated,
    reserved, provisioning, unhealthy, maintenance, unreachable, updated_at)
SELECT %(pool)s, d.resource, 0, 0, GREATEST(0, d.allocated), GREATEST(0, d.reserved),
       0, 0, 0, 0, compute_now()
  FROM d
 ORDER BY d.resource COLLATE "C"
ON CONFLICT (pool_id, resource) DO UPDATE
   SET allocated = GREATEST(0, r.allocated + (SELECT d.allocated FROM d WHERE d.resource = r.resource)),
       reserved = GREATEST(0, r.reserved + (SELECT d.reserved FROM d WHERE d.resource = r.resource)),
       updated_at = compute_now()
"""


def rollup_apply_deltas(*, pool_id: str, deltas: Mapping[str, tuple[int, int]]) -> None:
    """Apply `{resource: (allocated, reserved)}` for one pool, in resource-name order.

    The rebuild locks a pool's rows ordered by resource; taking them in the
    same order here means a booking transaction and a rebuild queue behind each
    other instead of deadlocking. One statement whatever the number of resources.
    """
    resources = sorted(name for name, (allocated, reserved) in deltas.items() if allocated or reserved)
    if not resources:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            _APPLY_DELTAS_SQL,
            {
                "pool": pool_id,
                "resources": resources,
                "allocated": [deltas[name][0] for name in resources],
                "reserved": [deltas[name][1] for name in resources],
            },
        )


# Step 1 of a rebuild: make sure every row the count may write exists, so that
# step 2 can lock all of them. A booking transaction that would create a row
# the rebuild then overwrites is the race this closes: with the row already
# there (and locked), the booking's delta waits for the rebuild instead.
_ENSURE_ROWS_SQL = """
INSERT INTO pool_capacity_rollup (pool_id, resource, total, allocatable, allocated, reserved,
    provisioning, unhealthy, maintenance, unreachable, updated_at)
SELECT p.pool_id, r.resource, 0, 0, 0, 0, 0, 0, 0, 0, compute_now()
  FROM unnest(%(pools)s::varchar[]) AS p(pool_id)
 CROSS JOIN unnest(%(resources)s::varchar[]) AS r(resource)
 ORDER BY 1, 2
ON CONFLICT (pool_id, resource) DO NOTHING
"""

# Step 2: lock the rows. `rollup_apply_delta` updates these same rows, so a
# booking transaction that has not committed yet makes us wait here (and is
# then visible to the count), and one that starts later waits for our commit
# (and adds its delta to our count). Ordered by code point, as Python's
# `sorted()` orders a booking's resources, so two rebuilds, or a rebuild and a
# booking transaction applying its deltas in sorted order, take the rows in
# one order instead of deadlocking.
_LOCK_ROWS_SQL = """
SELECT id FROM pool_capacity_rollup
 WHERE pool_id = ANY(%(pools)s::varchar[])
 ORDER BY pool_id COLLATE "C", resource COLLATE "C"
   FOR UPDATE
"""


def _count_and_write_sql(*, probe_atoms: bool) -> str:
    """Step 3: one statement that counts the pools and writes their rows.

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
),
written AS (
    INSERT INTO pool_capacity_rollup AS r (pool_id, resource, total, allocatable, allocated, reserved,
        provisioning, unhealthy, maintenance, unreachable, updated_at, rebuilt_at)
    SELECT c.pool_id, c.resource,
           c.allocatable + c.provisioning + c.unhealthy + c.maintenance + c.unreachable,
           c.allocatable, c.allocated, c.reserved,
           c.provisioning, c.unhealthy, c.maintenance, c.unreachable, compute_now(), compute_now()
      FROM counts c
    ON CONFLICT (pool_id, resource) DO UPDATE
       SET total = EXCLUDED.total, allocatable = EXCLUDED.allocatable, allocated = EXCLUDED.allocated,
           reserved = EXCLUDED.reserved, provisioning = EXCLUDED.provisioning,
           unhealthy = EXCLUDED.unhealthy, maintenance = EXCLUDED.maintenance,
           unreachable = EXCLUDED.unreachable, updated_at = EXCLUDED.updated_at,
           rebuilt_at = EXCLUDED.rebuilt_at
    RETURNING r.pool_id, r.resource
)
-- Rows of resources the pool no longer has (and those step 1 made just to
-- lock them) go; they are locked by us, so no delta is lost: a waiting
-- delta's upsert retries and inserts afresh after our commit.
DELETE FROM pool_capacity_rollup old
 WHERE old.pool_id = ANY(%(pools)s::varchar[])
   AND NOT EXISTS (SELECT 1 FROM written w WHERE w.pool_id = old.pool_id AND w.resource = old.resource)
"""


_COUNT_ONE_POOL_SQL = _count_and_write_sql(probe_atoms=True)
_COUNT_MANY_POOLS_SQL = _count_and_write_sql(probe_atoms=False)


def _after_lock() -> None:
    """Nothing; tests patch in a pause here to fix one interleaving of a rebuild and a booking."""


def _is_deadlock(error: OperationalError) -> bool:
    return getattr(error.__cause__, "sqlstate", None) == "40P01"


def _rebuild_pools(pool_ids: list[str]) -> None:
    """Lock, count and write the rows of these pools in one transaction (retried on deadlock)."""
    params = {"pools": pool_ids, "resources": list(ALL_RESOURCES)}
    for attempt in range(DEADLOCK_RETRIES + 1):
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(_ENSURE_ROWS_SQL, params)
                cursor.execute(_LOCK_ROWS_SQL, params)
                cursor.fetchall()
                _after_lock()
                cursor.execute(_COUNT_ONE_POOL_SQL if len(pool_ids) == 1 else _COUNT_MANY_POOLS_SQL, params)
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
    from inventory.models import Pool

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
