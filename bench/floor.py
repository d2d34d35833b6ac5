"""The floor: one placement's guarded statements as plain SQL transactions, no Django, no HTTP.

Each client runs, per operation, the write path of `reservations/create`
followed by `reservations/release` with the same statements the placer and
`reservation_cut` send (reservation insert, node lock `FOR SHARE` under the
schedulability predicate, atoms `FOR SHARE`, allocation insert, bookings
(the exclusion constraint's refusal a lost race), quota guard, rollup delta, and
the outbox row; then the release's lock, cut and give-backs, the outbox row taken
out as a delivery would), each in its own transaction.
Planning is left out: the floor is what the database alone costs for the
writes, so the API's ratio to it is the price of Python, HTTP and planning.

Atoms are handed out to clients disjointly (a client never races another for
an atom), so the only contention left is the shared rows: the pool's rollup
row and the tenant's quota row, which is exactly what the hot-row question
is about.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass
from typing import Any

import psycopg

from bench.load import CreateRate, clients_run
from inventory.schedulability import schedulable_sql

_ids = itertools.count(1)

_LOCK_NODE = (
    "SELECT n.id FROM inventory_node n JOIN inventory_pool p ON p.id = n.pool_id"
    " WHERE n.id = %s AND n.pool_id = %s AND p.archived_at IS NULL"
    f" AND {schedulable_sql('n', 'p.owner_id')} FOR SHARE OF n"
)
_ROLLUP_DELTA = """
INSERT INTO pool_capacity_rollup (pool_id, resource, total, allocatable, allocated,
    reserved, provisioning, unhealthy, maintenance, unreachable, updated_at)
VALUES (%(pool)s, %(resource)s, 0, 0, GREATEST(0, %(allocated)s), 0, 0, 0, 0, 0, compute_now())
ON CONFLICT (pool_id, resource) DO UPDATE
   SET allocated = GREATEST(0, pool_capacity_rollup.allocated + %(allocated)s),
       updated_at = compute_now()
"""


@dataclass(frozen=True)
class Atom:
    pool_id: str
    tenant_id: str
    node_id: str
    device_id: int


def free_atoms(*, conninfo: str, pool_ids: list[str], per_pool: int) -> dict[str, list[Atom]]:
    """Up to `per_pool` whole GPUs per pool, free for the next two hours on schedulable nodes."""
    sql = f"""
    SELECT p.id, p.owner_id, n.id, d.id
      FROM inventory_pool p
      JOIN inventory_node n ON n.pool_id = p.id
      JOIN inventory_device d ON d.node_id = n.id
     WHERE p.id = ANY(%s) AND {schedulable_sql("n", "p.owner_id")}
       AND d.device_class = 'gpu' AND d.bookable AND d.healthy
       AND NOT EXISTS (SELECT 1 FROM device_bookings b WHERE b.device_id = d.id
                        AND b.during && tstzrange(compute_now(), compute_now() + interval '2 hours'))
     ORDER BY p.id, d.id
    """
    out: dict[str, list[Atom]] = {pool_id: [] for pool_id in pool_ids}
    with psycopg.connect(conninfo) as conn:
        for pool_id, tenant_id, node_id, device_id in conn.execute(sql, [pool_ids]).fetchall():  # type: ignore[arg-type]
            if len(out[pool_id]) < per_pool:
                out[pool_id].append(Atom(pool_id, tenant_id, node_id, device_id))
    return out


class _Lost(Exception):
    """A guarded statement returned fewer rows: the transaction rolls back."""


# The alternative to the hot row, measured at the same level: each delta is
# appended to a log (no row is updated, so no two bookings wait for each
# other), and a folder moves the log into the rollup rows now and then.
DELTA_LOG_DDL = """
CREATE TABLE IF NOT EXISTS bench_rollup_delta_log (
    id bigserial PRIMARY KEY, pool_id varchar(57) NOT NULL, resource varchar(16) NOT NULL,
    allocated bigint NOT NULL, reserved bigint NOT NULL)
"""
_DELTA_LOG_INSERT = (
    "INSERT INTO bench_rollup_delta_log (pool_id, resource, allocated, reserved)"
    " VALUES (%(pool)s, %(resource)s, %(allocated)s, 0)"
)
ROLLUP_MODES = ("row", "none", "log")


def _rollup(cur: psycopg.Cursor[Any], mode: str, params: dict[str, Any]) -> None:
    if mode == "row":
        cur.execute(_ROLLUP_DELTA, params)
    elif mode == "log":
        cur.execute(_DELTA_LOG_INSERT, params)


def _create(cur: psycopg.Cursor[Any], atom: Atom, run_id: str, rollup: str = "row") -> str:
    number = next(_ids)
    rsv = f"rsv_{run_id}{number:024x}"
    alloc = f"alloc_{run_id}{number:024x}"
    now = cur.execute("SELECT compute_now()").fetchone()[0]  # type: ignore[index]
    # The reservation and its outbox row in one statement, as the create writes them.
    cur.execute(
        "WITH r AS (INSERT INTO reservations_reservation (id, request, request_digest, idempotency_key, spot,"
        " binding, starts_at, ends_at, state, release_reason, at_risk_reason, pool_id, tenant_id, created_at)"
        " VALUES (%s, '{}'::jsonb, %s, %s, false, 'hold', %s, %s + interval '1 hour', 'active', '', '',"
        " %s, %s, compute_now()) RETURNING id)"
        " INSERT INTO reservations_delivery (reservation_id, kind, attempts, next_attempt_at, last_error,"
        " created_at) SELECT id, 'assign', 0, compute_now() + interval '2 seconds', '', compute_now() FROM r",
        [rsv, "0" * 64, f"floor-{run_id}-{number}", now, now, atom.pool_id, atom.tenant_id],
    )
    if cur.execute(_LOCK_NODE, [atom.node_id, atom.pool_id]).fetchone() is None:
        raise _Lost
    cur.execute(
        "SELECT id FROM inventory_device WHERE id = ANY(%s) AND node_id = %s AND healthy AND bookable"
        " ORDER BY id FOR SHARE",
        [[atom.device_id], atom.node_id],
    ).fetchall()
    cur.execute(
        "INSERT INTO reservations_allocation (id, reservation_id, node_id, resources, released, created_at)"
        " VALUES (%s, %s, %s, '{}'::jsonb, false, compute_now())",
        [alloc, rsv, atom.node_id],
    )
    cur.execute(
        "INSERT INTO device_bookings (device_id, allocation_id, purpose, during)"
        " SELECT d.id, %s, 'allocation', tstzrange(%s, %s + interval '1 hour', '[)')"
        " FROM unnest(%s::bigint[]) AS d(id) ORDER BY d.id",
        [alloc, now, now, [atom.device_id]],
    )  # guard 1 as the placer meets it: a conflict raises (the atoms are disjoint, so none does)
    if cur.rowcount != 1:
        raise _Lost
    cur.execute(
        "UPDATE quota_usage SET used = used + 1 WHERE pool_id = %s AND tenant_id = %s AND resource = 'gpu'"
        " AND used + 1 <= max",
        [atom.pool_id, atom.tenant_id],
    )
    if cur.rowcount == 0:
        cur.execute(
            "SELECT used, max FROM quota_usage WHERE pool_id = %s AND tenant_id = %s AND resource = 'gpu'",
            [atom.pool_id, atom.tenant_id],
        ).fetchone()
    _rollup(cur, rollup, {"pool": atom.pool_id, "resource": "gpu", "allocated": 1})
    return rsv


def _release(cur: psycopg.Cursor[Any], rsv: str, atom: Atom, rollup: str = "row") -> None:
    cur.execute("SELECT id, state FROM reservations_reservation WHERE id = %s FOR UPDATE", [rsv]).fetchone()
    now = cur.execute("SELECT compute_now()").fetchone()[0]  # type: ignore[index]
    allocations = cur.execute(
        "UPDATE reservations_allocation SET released = true WHERE reservation_id = %s AND NOT released"
        " RETURNING id, node_id, resources",
        [rsv],
    ).fetchall()
    ids = [row[0] for row in allocations]
    cur.execute(
        "SELECT d.device_class, lower(b.during) <= %s, lower(b.during) >= %s, upper(b.during) > %s, count(*)"
        " FROM device_bookings b JOIN inventory_device d ON d.id = b.device_id"
        " WHERE b.allocation_id = ANY(%s) GROUP BY 1, 2, 3, 4",
        [now, now, now, ids],
    ).fetchall()
    cur.execute(
        "DELETE FROM device_bookings WHERE allocation_id = ANY(%s) AND lower(during) >= %s", [ids, now]
    )
    cur.execute(
        "UPDATE device_bookings SET during = tstzrange(lower(during), %s, '[)')"
        " WHERE allocation_id = ANY(%s) AND upper(during) > %s",
        [now, ids, now],
    )
    cur.execute("SELECT pool_id, tenant_id FROM reservations_reservation WHERE id = %s", [rsv]).fetchone()
    cur.execute(
        "UPDATE quota_usage SET used = GREATEST(0, used - 1)"
        " WHERE pool_id = %s AND tenant_id = %s AND resource = 'gpu'",
        [atom.pool_id, atom.tenant_id],
    )
    _rollup(cur, rollup, {"pool": atom.pool_id, "resource": "gpu", "allocated": -1})
    # The row, and the outbox row its delivery would have taken out (the floor tells no node).
    cur.execute(
        "WITH delivered AS (DELETE FROM reservations_delivery WHERE reservation_id = %s)"
        " UPDATE reservations_reservation SET state = 'released', released_at = %s, release_reason = 'floor'"
        " WHERE id = %s",
        [rsv, now, rsv],
    )
    cur.execute("SELECT pg_notify('capacity_released', %s)", [atom.pool_id])


@dataclass
class FloorResult(CreateRate):
    lost: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {**super().as_dict(), "lost": self.lost}


def floor_run(
    *, conninfo: str, atoms: list[list[Atom]], seconds: float, run_id: str, rollup: str = "row"
) -> FloorResult:
    """`len(atoms)` clients, each cycling through its own atoms: create, commit, release, commit.

    `rollup`: `row` updates the pool's rollup row as `rollup_apply_delta` does,
    `none` leaves it out, `log` appends to a delta log instead.
    """
    if rollup == "log":
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(DELTA_LOG_DDL)
    creates = 0
    lost = 0
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def work(index: int, mine: list[Atom]) -> None:
        nonlocal creates, lost
        done = missed = 0
        with psycopg.connect(conninfo) as conn:
            cycle = itertools.cycle(mine)
            while time.monotonic() < deadline:
                atom = next(cycle)
                try:
                    with conn.transaction(), conn.cursor() as cur:
                        rsv = _create(cur, atom, f"{run_id}{index:02x}", rollup)
                except _Lost:
                    missed += 1
                    continue
                with conn.transaction(), conn.cursor() as cur:
                    _release(cur, rsv, atom, rollup)
                done += 1
        with lock:
            creates += done
            lost += missed

    seconds = clients_run(work, atoms)
    return FloorResult(clients=len(atoms), seconds=seconds, creates=creates, lost=lost)
