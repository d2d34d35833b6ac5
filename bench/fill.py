"""Fill a loaded fleet with bookings: past, current and future, set-based.

Every GPU-class atom (`gpu`, `gpu.mig`, `gpu.slot`) belongs to a group of up to
four atoms of one node; each group gets `layers` reservations spread evenly
over a span from 30 days ago to 7 days ahead, each booking half of its
period, with a per-group phase so the fleet is never booked in lockstep. So
about half of the atoms are booked now, a few have a booking that starts
later, and most rows are history, as in a fleet that has run for a month.

Rows are written with `INSERT ... SELECT` over `generate_series`, one
statement per table, never row by row. Ids are hexadecimal, which the
Crockford alphabet of the API's id patterns contains, so every id the bench
writes is one the API accepts.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import psycopg

from inventory.choices import GPU_ATOM_CLASSES
from reservations.rollups.counts import NODE_ATOM_COUNTS_SQL, POOL_FABRIC_COUNTS_SQL

PAST_DAYS = 30
FUTURE_DAYS = 7
GROUP_SIZE = 4
GPU_CLASSES = GPU_ATOM_CLASSES

_GROUPS_SQL = """
CREATE TEMP TABLE bench_groups AS
WITH ranked AS (
    SELECT d.id, d.node_id,
           (row_number() OVER (PARTITION BY d.node_id ORDER BY d.id) - 1) / %(size)s AS grp
      FROM inventory_device d
     WHERE d.bookable AND d.device_class = ANY(%(classes)s)
)
SELECT row_number() OVER (ORDER BY r.node_id, r.grp) AS gid, r.node_id, n.pool_id, p.owner_id AS tenant_id,
       array_agg(r.id ORDER BY r.id) AS device_ids
  FROM ranked r
  JOIN inventory_node n ON n.id = r.node_id
  JOIN inventory_pool p ON p.id = n.pool_id
 GROUP BY r.node_id, r.grp, n.pool_id, p.owner_id
"""

_SLOTS_SQL = """
CREATE TEMP TABLE bench_slots AS
WITH clock AS (SELECT compute_now() AS now)
SELECT g.gid * %(layers)s + k AS num, g.gid, g.node_id, g.pool_id, g.tenant_id, g.device_ids, c.now,
       c.now - make_interval(days => %(past)s) + make_interval(secs => (k + ph.phase) * %(period)s)
           AS starts_at,
       c.now - make_interval(days => %(past)s) + make_interval(secs => (k + ph.phase + 0.5) * %(period)s)
           AS ends_at
  FROM bench_groups g
 CROSS JOIN LATERAL (SELECT ((g.gid * 2654435761) %% 1000) / 1000.0 AS phase) ph
 CROSS JOIN generate_series(0, %(layers)s - 1) AS k
 CROSS JOIN clock c
"""

_RESERVATIONS_SQL = """
INSERT INTO reservations_reservation (id, request, request_digest, idempotency_key, spot, binding,
    starts_at, ends_at, state, release_reason, at_risk_reason, pool_id, tenant_id, created_at)
SELECT 'rsv_' || lpad(to_hex(s.num), 26, '0'),
       jsonb_build_object('tenantId', s.tenant_id, 'poolId', s.pool_id, 'duration',
           extract(epoch FROM s.ends_at - s.starts_at)::bigint, 'idempotencyKey', 'bench-' || s.num,
           'devices', jsonb_build_array(jsonb_build_object('class', 'gpu', 'count',
               cardinality(s.device_ids)))),
       md5(s.num::text) || md5('bench' || s.num),
       'bench-' || s.num, false, 'hold', s.starts_at, s.ends_at,
       CASE WHEN s.ends_at <= s.now THEN 'ended' WHEN s.starts_at > s.now THEN 'scheduled' ELSE 'active' END,
       '', '', s.pool_id, s.tenant_id, LEAST(s.starts_at, s.now)
  FROM bench_slots s
"""

_ALLOCATIONS_SQL = """
INSERT INTO reservations_allocation (id, resources, released, created_at, node_id, reservation_id)
SELECT 'alloc_' || lpad(to_hex(s.num), 26, '0'), '{}'::jsonb, false, LEAST(s.starts_at, s.now), s.node_id,
       'rsv_' || lpad(to_hex(s.num), 26, '0')
  FROM bench_slots s
"""

# Ordered by device and time, so the exclusion constraint's GiST index is
# filled in a locality-friendly order. The phase is written here, from the same
# clock as the reservations' states, and so is the pool: with the triggers
# skipped (below), the insert triggers that set them do not run.
_BOOKINGS_SQL = """
INSERT INTO device_bookings (device_id, allocation_id, purpose, during, phase, pool_id)
SELECT d.id, 'alloc_' || lpad(to_hex(s.num), 26, '0'), 'allocation', tstzrange(s.starts_at, s.ends_at, '[)'),
       CASE WHEN s.ends_at <= s.now THEN 2 WHEN s.starts_at <= s.now THEN 1 ELSE 0 END, s.pool_id
  FROM bench_slots s
 CROSS JOIN LATERAL unnest(s.device_ids) AS d(id)
 ORDER BY d.id, s.starts_at
"""


def _skip_fk_triggers(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    """Skip the deferred foreign-key checks of a million rows that are consistent by construction.

    (This skips every ordinary trigger, the bookings' phase trigger too: the
    fill writes the phase itself.)

    Needs a superuser (the embedded server's `postgres`); elsewhere the checks
    simply run at commit.
    """
    try:
        with conn.transaction():
            conn.execute("SET session_replication_role = replica")
    except psycopg.errors.InsufficientPrivilege:
        pass


def _drop_gist(conn: psycopg.Connection[tuple[object, ...]]) -> list[str]:
    """Drop the bookings' GiST index and exclusion constraint; return the statements that rebuild them.

    Inserting a million rows one GiST insertion at a time costs about five
    times a bulk build. The statements come from the catalog
    (`pg_get_constraintdef`, `pg_get_indexdef`), so the rebuilt schema is the
    migrated one, and re-adding the exclusion constraint checks every row.
    """
    rebuild: list[str] = []
    constraints = conn.execute(
        "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE conrelid = 'device_bookings'::regclass AND contype = 'x'"
    ).fetchall()
    for name, definition in constraints:
        conn.execute(f'ALTER TABLE device_bookings DROP CONSTRAINT "{name}"')  # type: ignore[arg-type]
        rebuild.append(f'ALTER TABLE device_bookings ADD CONSTRAINT "{name}" {definition!s}')
    indexes = conn.execute(
        "SELECT i.relname, pg_get_indexdef(i.oid) FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid"
        " JOIN pg_am am ON am.oid = i.relam"
        " WHERE x.indrelid = 'device_bookings'::regclass AND am.amname = 'gist'"
        " AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.oid)"
    ).fetchall()
    for name, definition in indexes:
        conn.execute(f'DROP INDEX "{name}"')  # type: ignore[arg-type]
        rebuild.append(str(definition))
    return rebuild


@dataclass(frozen=True)
class FillResult:
    atoms: int
    layers: int
    reservations: int
    bookings: int
    booked_now: int
    booked_later: int


def bookings_fill(*, conninfo: str, target_bookings: int) -> FillResult:
    """Write about `target_bookings` bookings (never more) over the fleet's GPU-class atoms."""
    with psycopg.connect(conninfo) as conn:
        atoms = conn.execute(
            "SELECT count(*) FROM inventory_device WHERE bookable AND device_class = ANY(%s)",
            [list(GPU_CLASSES)],
        ).fetchone()[0]  # type: ignore[index]
        layers = max(1, target_bookings // max(1, atoms))
        period = (PAST_DAYS + FUTURE_DAYS) * 86400 / layers
        params = {
            "size": GROUP_SIZE,
            "classes": list(GPU_CLASSES),
            "layers": layers,
            "past": PAST_DAYS,
            "period": period,
        }
        conn.execute("SET LOCAL work_mem = '256MB'")
        conn.execute("SET LOCAL maintenance_work_mem = '1GB'")
        _skip_fk_triggers(conn)
        conn.execute(_GROUPS_SQL, params)
        conn.execute(_SLOTS_SQL, params)
        reservations = conn.execute(_RESERVATIONS_SQL).rowcount
        conn.execute(_ALLOCATIONS_SQL)
        gist = _drop_gist(conn)
        bookings = conn.execute(_BOOKINGS_SQL).rowcount
        for statement in gist:
            conn.execute(statement)  # type: ignore[arg-type]
        # The triggers that keep the placer's per-node counts were skipped too:
        # recount them from what was written, as the migration that made them did.
        conn.execute("DELETE FROM node_atom_counts")
        conn.execute(
            "INSERT INTO node_atom_counts"
            " (node_id, pool_id, device_class, atoms, running, schedulable, fabric)"
            f" SELECT * FROM ({NODE_ATOM_COUNTS_SQL}) c"
        )
        conn.execute("DELETE FROM pool_fabric_counts")
        conn.execute(
            "INSERT INTO pool_fabric_counts"
            " (pool_id, device_class, fabric, nodes, nodes_free, whole_free, stranded)"
            + POOL_FABRIC_COUNTS_SQL.format(rows="node_atom_counts")
        )
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE during @> compute_now()),"
            " count(*) FILTER (WHERE lower(during) > compute_now()) FROM device_bookings"
        ).fetchone()
        assert row is not None
        conn.commit()
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
        # Flush the fill's WAL now: otherwise the checkpoint it triggers runs
        # during the first measurements (the rebuild) and they pay for it.
        with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
            conn.execute("CHECKPOINT")
    return FillResult(
        atoms=atoms,
        layers=layers,
        reservations=reservations,
        bookings=bookings,
        booked_now=row[0],
        booked_later=row[1],
    )
