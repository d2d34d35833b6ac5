"""Pool capacity rollups: the rows capacity reads, their deltas and their rebuild's writes.

Only this module writes `pool_capacity_rollup`. The booking transactions apply
deltas of `allocated` and `reserved` (`rollup_apply_deltas`); node and device
changes, and bookings changing phase, apply deltas of any count
(`rollup_apply_count_deltas`); the rebuild (`reservations.rollups.recount`) recounts from
nodes, devices and bookings and stores the counts here with `rollup_rows_lock`
and `rollup_rows_store`, in one transaction. Every writer takes a pool's rows
in the rebuild's order (pool, then resource, by code point), so any two of
them queue behind each other instead of deadlocking.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from django.db import connection

from inventory.choices import ALL_RESOURCES
from inventory.schedulability import EXCLUDED, bucket_sql


def rollup_apply_delta(*, pool_id: str, resource: str, allocated: int = 0, reserved: int = 0) -> None:
    """Add a placement's (or subtract a release's) atoms, inside the caller's transaction.

    `allocated` counts RUNNING bookings, `reserved` FUTURE ones (their phase).
    Counts never go below zero (a floor, not a rule the callers lean on: their
    deltas follow the phases the rebuild counts).

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
                   freed = pool_capacity_rollup.freed
                           + CASE WHEN %(allocated)s < 0 OR %(reserved)s < 0 THEN 1 ELSE 0 END,
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
       freed = r.freed + (SELECT CASE WHEN d.allocated < 0 OR d.reserved < 0 THEN 1 ELSE 0 END
                            FROM d WHERE d.resource = r.resource),
       updated_at = compute_now()
"""


# The same write as CTEs of another statement (`rollup_deltas_piggyback`).
_DELTAS_CTES_SQL = """
rollup_d AS (
    SELECT resource, allocated, reserved
      FROM unnest(%(rollup_resources)s::varchar[], %(rollup_allocated)s::bigint[],
                  %(rollup_reserved)s::bigint[]) AS d(resource, allocated, reserved)
), rollup_applied AS (
    INSERT INTO pool_capacity_rollup AS r (pool_id, resource, total, allocatable, allocated,
        reserved, provisioning, unhealthy, maintenance, unreachable, updated_at)
    SELECT %(rollup_pool)s, d.resource, 0, 0, GREATEST(0, d.allocated), GREATEST(0, d.reserved),
           0, 0, 0, 0, compute_now()
      FROM rollup_d d
     ORDER BY d.resource COLLATE "C"
    ON CONFLICT (pool_id, resource) DO UPDATE
       SET allocated = GREATEST(0, r.allocated
                                   + (SELECT d.allocated FROM rollup_d d WHERE d.resource = r.resource)),
           reserved = GREATEST(0, r.reserved
                                  + (SELECT d.reserved FROM rollup_d d WHERE d.resource = r.resource)),
           freed = r.freed + (SELECT CASE WHEN d.allocated < 0 OR d.reserved < 0 THEN 1 ELSE 0 END
                                FROM rollup_d d WHERE d.resource = r.resource),
           updated_at = compute_now()
)"""


def rollup_deltas_piggyback(
    *, pool_id: str, deltas: Mapping[str, tuple[int, int]]
) -> tuple[str, dict[str, Any]] | None:
    """`rollup_apply_deltas` as CTEs for the quota's statement (`ledger.services.quota.Piggyback`).

    None when there is nothing to apply. The booking transaction then charges
    the quota and moves the rollups in one round trip, the quota rows locked
    first and the pool's rollup rows after, as before (and last: it is the row
    every booking of the pool queues on).
    """
    resources = sorted(name for name, (allocated, reserved) in deltas.items() if allocated or reserved)
    if not resources:
        return None
    return _DELTAS_CTES_SQL, {
        "rollup_pool": pool_id,
        "rollup_resources": resources,
        "rollup_allocated": [deltas[name][0] for name in resources],
        "rollup_reserved": [deltas[name][1] for name in resources],
    }


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


def rollup_capacity_freed(*, node_ids: list[str]) -> None:
    """Count a giving-back that moved no count (a maintenance window's bookings ended early).

    BookingRepair then tries the at-risk reservations of these nodes' pools again.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE pool_capacity_rollup SET freed = freed + 1"
            " WHERE pool_id IN (SELECT pool_id FROM inventory_node WHERE id = ANY(%s))",
            [node_ids],
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


def rollup_rows_lock(*, pool_ids: list[str]) -> None:
    """Steps 1 and 2 of a rebuild: make every row the count may write exist, then lock them all."""
    params = {"pools": pool_ids, "resources": list(ALL_RESOURCES)}
    with connection.cursor() as cursor:
        cursor.execute(_ENSURE_ROWS_SQL, params)
        cursor.execute(_LOCK_ROWS_SQL, params)
        cursor.fetchall()


# The counts a rebuild stores, in this order.
ROLLUP_STORED_COUNTS = (
    "allocatable",
    "allocated",
    "reserved",
    "provisioning",
    "unhealthy",
    "maintenance",
    "unreachable",
)


def _rows_recordset(alias: str) -> str:
    """The JSON parameter `rows` as the recordset `alias`: `{pool_id, resource, <ROLLUP_STORED_COUNTS>}`."""
    counts = ", ".join(f"{name} bigint" for name in ROLLUP_STORED_COUNTS)
    return (
        f"SELECT * FROM json_to_recordset(%(rows)s::json) AS {alias}(pool_id text, resource text, {counts})"
    )


# Step 4: write the counted rows (`total` is their sum, as the CHECK requires)
# and drop the rows of resources the pools no longer have (and those step 1
# made just to lock them). They are locked by us, so no delta is lost: a
# waiting delta's upsert retries and inserts afresh after our commit.
_STORE_ROWS_SQL = f"""
WITH c AS ({_rows_recordset("c")}),
written AS (
    INSERT INTO pool_capacity_rollup AS r (pool_id, resource, total, allocatable, allocated, reserved,
        provisioning, unhealthy, maintenance, unreachable, updated_at, rebuilt_at)
    SELECT c.pool_id, c.resource,
           c.allocatable + c.provisioning + c.unhealthy + c.maintenance + c.unreachable,
           c.allocatable, c.allocated, c.reserved,
           c.provisioning, c.unhealthy, c.maintenance, c.unreachable, compute_now(), compute_now()
      FROM c
     ORDER BY c.pool_id COLLATE "C", c.resource COLLATE "C"
    ON CONFLICT (pool_id, resource) DO UPDATE
       SET total = EXCLUDED.total, allocatable = EXCLUDED.allocatable, allocated = EXCLUDED.allocated,
           reserved = EXCLUDED.reserved, provisioning = EXCLUDED.provisioning,
           unhealthy = EXCLUDED.unhealthy, maintenance = EXCLUDED.maintenance,
           unreachable = EXCLUDED.unreachable, updated_at = EXCLUDED.updated_at,
           rebuilt_at = EXCLUDED.rebuilt_at, freed = r.freed + 1
    RETURNING r.pool_id, r.resource
)
DELETE FROM pool_capacity_rollup old
 WHERE old.pool_id = ANY(%(pools)s::varchar[])
   AND NOT EXISTS (SELECT 1 FROM written w WHERE w.pool_id = old.pool_id AND w.resource = old.resource)
"""


def rollup_rows_store(*, pool_ids: list[str], rows: list[dict[str, Any]]) -> None:
    """Replace the locked pools' rows with recounted ones: `{pool_id, resource, <ROLLUP_STORED_COUNTS>}`."""
    with connection.cursor() as cursor:
        cursor.execute(_STORE_ROWS_SQL, {"pools": pool_ids, "rows": json.dumps(rows)})


# All pools' count deltas in one upsert. The rows are taken in the rebuild's
# (pool, resource) order, as `_APPLY_DELTAS_SQL` does. A new row gets the
# deltas as its counts; an existing row adds them (each count floored at 0),
# and `total` is the sum of allocatable and the four buckets either way.
_APPLY_COUNT_DELTAS_SQL = f"""
WITH d AS ({_rows_recordset("d")}),
fresh AS (
    SELECT d.pool_id, d.resource, GREATEST(0, d.allocatable) AS allocatable,
           GREATEST(0, d.allocated) AS allocated, GREATEST(0, d.reserved) AS reserved,
           GREATEST(0, d.provisioning) AS provisioning, GREATEST(0, d.unhealthy) AS unhealthy,
           GREATEST(0, d.maintenance) AS maintenance, GREATEST(0, d.unreachable) AS unreachable
      FROM d
)
INSERT INTO pool_capacity_rollup AS r (pool_id, resource, total, allocatable, allocated, reserved,
    provisioning, unhealthy, maintenance, unreachable, updated_at)
SELECT f.pool_id, f.resource,
       f.allocatable + f.provisioning + f.unhealthy + f.maintenance + f.unreachable,
       f.allocatable, f.allocated, f.reserved, f.provisioning, f.unhealthy, f.maintenance, f.unreachable,
       compute_now()
  FROM fresh f
 ORDER BY f.pool_id COLLATE "C", f.resource COLLATE "C"
ON CONFLICT (pool_id, resource) DO UPDATE
   SET (total, allocatable, allocated, reserved, provisioning, unhealthy, maintenance, unreachable,
        updated_at, freed) = (
       SELECT m.allocatable + m.provisioning + m.unhealthy + m.maintenance + m.unreachable,
              m.allocatable, m.allocated, m.reserved, m.provisioning, m.unhealthy, m.maintenance,
              m.unreachable, compute_now(), m.freed
         FROM (SELECT GREATEST(0, r.allocatable + d.allocatable) AS allocatable,
                      r.freed + CASE WHEN d.allocatable > 0 THEN 1 ELSE 0 END AS freed,
                      GREATEST(0, r.allocated + d.allocated) AS allocated,
                      GREATEST(0, r.reserved + d.reserved) AS reserved,
                      GREATEST(0, r.provisioning + d.provisioning) AS provisioning,
                      GREATEST(0, r.unhealthy + d.unhealthy) AS unhealthy,
                      GREATEST(0, r.maintenance + d.maintenance) AS maintenance,
                      GREATEST(0, r.unreachable + d.unreachable) AS unreachable
                 FROM d WHERE d.pool_id = r.pool_id AND d.resource = r.resource) m
   )
"""


def rollup_apply_count_deltas(*, deltas: Mapping[tuple[str, str], Mapping[str, int]]) -> None:
    """Add `{(pool_id, resource): {count: delta}}` to the rows, creating rows as needed; one statement.

    For changes that move atoms or scalars between the counts (a cordon, a
    health flip, a report, a booking starting or ending): any of
    `ROLLUP_STORED_COUNTS` may move, and `total` stays the sum of
    `allocatable` and the four buckets, as the rebuild writes it. A key with
    no non-zero delta still makes sure its row exists (the rebuild keeps a row
    for every resource a pool has, even when all its counts are zero).
    Counts never go below zero. Runs in the caller's transaction.
    """
    if not deltas:
        return
    rows = [
        {"pool_id": pool_id, "resource": resource, **{c: int(moved.get(c, 0)) for c in ROLLUP_STORED_COUNTS}}
        for (pool_id, resource), moved in sorted(deltas.items())
    ]
    with connection.cursor() as cursor:
        cursor.execute(_APPLY_COUNT_DELTAS_SQL, {"rows": json.dumps(rows)})


_DROP_UNUSED_SQL = f"""
DELETE FROM pool_capacity_rollup r
 WHERE r.pool_id = %(pool)s AND r.resource = ANY(%(resources)s::varchar[]) AND r.resource <> 'gpu'
   AND r.total = 0 AND r.allocated = 0 AND r.reserved = 0
   AND NOT EXISTS (
       SELECT 1 FROM inventory_device d
         JOIN inventory_node n ON n.id = d.node_id
         JOIN inventory_pool p ON p.id = n.pool_id
        WHERE n.pool_id = r.pool_id AND d.device_class = r.resource AND d.bookable
          AND {bucket_sql("n", "p.owner_id")} <> '{EXCLUDED}')
   AND NOT EXISTS (
       SELECT 1 FROM inventory_noderesource nr
         JOIN inventory_node n ON n.id = nr.node_id
         JOIN inventory_pool p ON p.id = n.pool_id
        WHERE n.pool_id = r.pool_id AND nr.resource = r.resource
          AND {bucket_sql("n", "p.owner_id")} <> '{EXCLUDED}')
"""


def rollup_rows_drop_unused(*, pool_id: str, resources: list[str]) -> None:
    """Drop the pool's rows of these resources when nothing of them is left in it, as a rebuild would.

    For a change that removed the last devices (or scalar rows) of a resource
    from a pool, or made their node excluded; the `gpu` row always stays.
    """
    if not resources:
        return
    with connection.cursor() as cursor:
        cursor.execute(_DROP_UNUSED_SQL, {"pool": pool_id, "resources": sorted(resources)})
