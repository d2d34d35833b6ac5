"""What a node contributes to its pool's rollup rows: the one definition the rebuild and node events share.

Per pool and resource, over a selection of nodes (whole pools for the
rebuild, a few nodes for a node event):

* atoms (`gpu`, `gpu.mig`, `gpu.slot`, `nic.vf`, `disk`, `node`) are bookable
  devices. Nodes in the `excluded` bucket are not counted at all. A node's
  bucket comes from `inventory.schedulability.bucket_sql()`; unhealthy atoms on
  schedulable nodes land in `unhealthy`. An atom is *counted* when it is healthy
  and bookable on a node in the `schedulable` bucket.
* `allocatable` = counted atoms. `allocated` and `reserved` count the bookings
  on counted atoms by their phase (`reservations.models.BookingPhase`): RUNNING
  ones in `allocated`, FUTURE ones in `reserved`, each booking once, but never a
  maintenance window's (a future window counts in no bucket; once it starts,
  its nodes are in `maintenance`, whose atoms are not counted). Phases, not
  the clock: the worker moves a booking's phase with the matching delta, so a
  count and the deltas agree by construction whenever they are read. Bookings
  on atoms outside the counted set (a cordoned node's, an unhealthy atom's) are
  left out, so `available` stays the number of atoms a new request could get.
* scalars (`vcpu`, `memoryGiB`, `diskGiB`, `hugepages1Gi`) come from
  `node_resources`: `allocatable` = sum of `floor(allocatable * ratio)` on
  schedulable nodes, `allocated` = sum of `allocated` on those nodes, never
  `reserved` (a scalar claim is taken when the reservation is placed); the
  buckets hold `floor(allocatable * ratio)` of the nodes in them.
* `present` is how many atoms and scalar rows of non-excluded nodes stand
  behind the row: the rebuild keeps a pool's row for a resource exactly when
  something is present (and always a `gpu` row).

Every writer that changes one of these inputs applies the difference in its
own transaction, holding the nodes it touches (`FOR SHARE` for bookings and
claims, `FOR UPDATE` for node and device changes), so the rows always equal a
recount.
"""

from __future__ import annotations

from inventory.schedulability import (
    EXCLUDED,
    MAINTENANCE,
    PROVISIONING,
    SCHEDULABLE,
    UNHEALTHY,
    UNREACHABLE,
    bucket_sql,
    schedulable_sql,
)
from reservations.rollups.deltas import ROLLUP_STORED_COUNTS

# The columns of a count row after `pool_id, resource`, in this order: the
# counts a rollup row stores, then whether the resource is present at all.
COUNT_COLUMNS = (*ROLLUP_STORED_COUNTS, "present")

# The smallest end any FUTURE or RUNNING booking can have: a FUTURE booking
# ends after the earliest FUTURE start, a RUNNING one no earlier than the
# earliest RUNNING end. Both are one probe of a partial index, and they let a
# per-atom probe of `booking_device_ends` skip every atom's history.
_LIVE_END_FLOOR = """COALESCE(LEAST(
        (SELECT min(lower(f.during)) FROM device_bookings f WHERE f.phase = 0),
        (SELECT min(upper(r.during)) FROM device_bookings r WHERE r.phase = 1)
    ), 'infinity'::timestamptz)"""


def counts_sql(*, selection: str, probe_atoms: bool) -> str:
    """One statement counting the selected nodes, one row per (pool, resource) with `COUNT_COLUMNS`.

    `selection` is a predicate over the node alias `n` (with the statement's
    named parameters, e.g. `n.pool_id = ANY(%(pools)s::varchar[])`). Bookings
    are read in one of two ways: for a whole fleet, every FUTURE and RUNNING
    booking through the two partial phase indexes, hashed by atom; for a pool or
    a few nodes (`probe_atoms`), one probe of `booking_device_ends` per counted
    atom, so a small count does not read the fleet's bookings.
    """
    bucket = bucket_sql("n", "p.owner_id")
    if probe_atoms:
        live = f"""
    SELECT b.device_id,
           count(*) FILTER (WHERE b.phase = 1) AS running,
           count(*) FILTER (WHERE b.phase = 0) AS future
      FROM device_bookings b
     WHERE b.device_id IN (SELECT a.id FROM atoms a WHERE a.counted)
       AND COALESCE(upper(b.during), 'infinity'::timestamptz) >= {_LIVE_END_FLOOR}
       AND b.phase IN (0, 1) AND b.purpose <> 'maintenance'
     GROUP BY b.device_id"""
    else:
        live = """
    SELECT x.device_id, sum(x.running) AS running, sum(x.future) AS future
      FROM (SELECT b.device_id, 1 AS running, 0 AS future FROM device_bookings b
             WHERE b.phase = 1 AND b.purpose <> 'maintenance'
            UNION ALL
            SELECT b.device_id, 0, 1 FROM device_bookings b
             WHERE b.phase = 0 AND b.purpose <> 'maintenance') x
     GROUP BY x.device_id"""
    return f"""
WITH nodes AS MATERIALIZED (
    SELECT n.id, n.pool_id, {bucket} AS bucket
      FROM inventory_node n
      JOIN inventory_pool p ON p.id = n.pool_id
     WHERE {selection}
),
atoms AS MATERIALIZED (
    SELECT d.id, d.device_class AS resource, nd.pool_id, nd.bucket, d.healthy,
           (nd.bucket = '{SCHEDULABLE}' AND d.healthy) AS counted
      FROM inventory_device d
      JOIN nodes nd ON nd.id = d.node_id
     WHERE d.bookable AND nd.bucket <> '{EXCLUDED}'
),
live AS ({live}
),
atom_counts AS (
    SELECT a.pool_id, a.resource,
           count(*) FILTER (WHERE a.counted) AS allocatable,
           COALESCE(sum(l.running) FILTER (WHERE a.counted), 0) AS allocated,
           COALESCE(sum(l.future) FILTER (WHERE a.counted), 0) AS reserved,
           count(*) FILTER (WHERE a.bucket = '{PROVISIONING}') AS provisioning,
           count(*) FILTER (WHERE a.bucket = '{UNHEALTHY}'
                              OR (a.bucket = '{SCHEDULABLE}' AND NOT a.healthy)) AS unhealthy,
           count(*) FILTER (WHERE a.bucket = '{MAINTENANCE}') AS maintenance,
           count(*) FILTER (WHERE a.bucket = '{UNREACHABLE}') AS unreachable,
           count(*) AS present
      FROM atoms a
      LEFT JOIN live l ON l.device_id = a.id
     GROUP BY a.pool_id, a.resource
),
scalar_counts AS (
    SELECT nd.pool_id, r.resource,
           COALESCE(sum(floor(r.allocatable * r.ratio)) FILTER (WHERE nd.bucket = '{SCHEDULABLE}'), 0)
               AS allocatable,
           COALESCE(sum(r.allocated) FILTER (WHERE nd.bucket = '{SCHEDULABLE}'), 0) AS allocated,
           0 AS reserved,
           COALESCE(sum(floor(r.allocatable * r.ratio)) FILTER (WHERE nd.bucket = '{PROVISIONING}'), 0)
               AS provisioning,
           COALESCE(sum(floor(r.allocatable * r.ratio)) FILTER (WHERE nd.bucket = '{UNHEALTHY}'), 0)
               AS unhealthy,
           COALESCE(sum(floor(r.allocatable * r.ratio)) FILTER (WHERE nd.bucket = '{MAINTENANCE}'), 0)
               AS maintenance,
           COALESCE(sum(floor(r.allocatable * r.ratio)) FILTER (WHERE nd.bucket = '{UNREACHABLE}'), 0)
               AS unreachable,
           count(*) AS present
      FROM inventory_noderesource r
      JOIN nodes nd ON nd.id = r.node_id
     WHERE nd.bucket <> '{EXCLUDED}'
     GROUP BY nd.pool_id, r.resource
)
SELECT c.pool_id, c.resource, c.allocatable::bigint, c.allocated::bigint, c.reserved::bigint,
       c.provisioning::bigint, c.unhealthy::bigint, c.maintenance::bigint, c.unreachable::bigint,
       c.present::bigint
  FROM (SELECT * FROM atom_counts UNION ALL SELECT * FROM scalar_counts) c
"""


# Counting the nodes of a node event: they are few, so their atoms are probed.
NODES_COUNT_SQL = counts_sql(selection="n.id = ANY(%(nodes)s::varchar[])", probe_atoms=True)

# The SQL of "this atom is counted", over a device `d`, its node `n` and the node's pool `p`.
COUNTED_ATOM_SQL = f"(d.bookable AND d.healthy AND {bucket_sql('n', 'p.owner_id')} = '{SCHEDULABLE}')"
# The same of a node (its scalars are counted): `n` and its pool `p`.
COUNTED_NODE_SQL = f"({bucket_sql('n', 'p.owner_id')} = '{SCHEDULABLE}')"

# The node label `capacity/byPool`'s fragmentation groups by (the gang topology
# key's default), and the whole node it counts: eight GPUs, all free. Migration
# 0017 writes both into the triggers that keep `pool_fabric_counts`.
FRAGMENTATION_KEY = "fabric"
WHOLE_NODE_GPUS = 8

# The recount of `node_atom_counts` (kept by the triggers of migrations 0007
# and 0017): per node and atom class, its healthy bookable atoms, the RUNNING
# bookings on them, and what the node contributes to its pool's fabric counts
# with (its schedulability and its `fabric` label). Rows the table keeps at
# zero (every atom of a class gone) have no recounted row; the comparison in
# the torture checks leaves them out.
NODE_ATOM_COUNTS_SQL = f"""
SELECT d.node_id, n.pool_id, d.device_class, count(*)::int AS atoms,
       COALESCE(sum(r.running), 0)::int AS running,
       {schedulable_sql("n", "p.owner_id")} AS schedulable,
       COALESCE(n.labels ->> '{FRAGMENTATION_KEY}', '') AS fabric
  FROM inventory_device d
  JOIN inventory_node n ON n.id = d.node_id
  JOIN inventory_pool p ON p.id = n.pool_id
  LEFT JOIN (SELECT b.device_id, count(*) AS running FROM device_bookings b
              WHERE b.phase = 1 GROUP BY b.device_id) r ON r.device_id = d.id
 WHERE d.bookable AND d.healthy
 GROUP BY d.node_id, n.id, p.id, d.device_class
"""

# The recount of `pool_fabric_counts` from node rows shaped like
# `node_atom_counts` (`{rows}`: the table, or the recount above in brackets):
# per pool, class and fabric, over the schedulable nodes with atoms.
POOL_FABRIC_COUNTS_SQL = f"""
SELECT c.pool_id, c.device_class, c.fabric,
       count(*)::int AS nodes,
       count(*) FILTER (WHERE c.running = 0)::int AS nodes_free,
       count(*) FILTER (WHERE c.running = 0
                          AND (c.device_class <> 'gpu' OR c.atoms >= {WHOLE_NODE_GPUS}))::int AS whole_free,
       COALESCE(sum(GREATEST(c.atoms - c.running, 0)) FILTER (WHERE c.running > 0), 0)::int AS stranded
  FROM {{rows}} c
 WHERE c.schedulable AND c.atoms > 0
 GROUP BY 1, 2, 3
"""
