"""The ledger's invariants, as an operator checks them: `manage.py check_invariants`.

Each check recounts from the rows (bookings, allocations, requests) what the
counters, quota rows and rollups claim, and returns what it found wrong, as
sentences. All of them hold at every committed instant, so `invariant_problems`
reads them in ONE repeatable-read, read-only snapshot: it can run against a
live primary, a standby or a restored backup, and never writes. The torture
tests check the same functions (`tests/support/torture/checks.py`), with the
checks that move the clock or rebuild the rollups on top.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.db import connection, transaction

from reservations.rollups.counts import NODE_ATOM_COUNTS_SQL, POOL_FABRIC_COUNTS_SQL
from reservations.rollups.deltas import ROLLUP_STORED_COUNTS
from reservations.rollups.recount import rollup_recount


def sql_rows(sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def check_no_double_booking() -> list[str]:
    """Guard 1: no atom in two overlapping bookings, and the exclusion constraint is still there."""
    problems = [
        f"device {device} booked twice: bookings {a} and {b} overlap"
        for device, a, b in sql_rows(
            "SELECT a.device_id, a.id, b.id FROM device_bookings a JOIN device_bookings b"
            " ON a.device_id = b.device_id AND a.id < b.id AND a.during && b.during"
        )
    ]
    if not sql_rows(
        "SELECT 1 FROM pg_constraint WHERE conname = 'device_bookings_no_overlap' AND contype = 'x'"
    ):
        problems.append("the exclusion constraint device_bookings_no_overlap is missing")
    return problems


def check_booking_pools() -> list[str]:
    """Guard 1's shard key: every booking carries its device's node's pool, or the constraint splits."""
    return [
        f"booking {booking} of device {device} says pool {said}, its node is in {actual}"
        for booking, device, said, actual in sql_rows(
            "SELECT b.id, b.device_id, b.pool_id, n.pool_id FROM device_bookings b"
            " JOIN inventory_device d ON d.id = b.device_id JOIN inventory_node n ON n.id = d.node_id"
            " WHERE b.pool_id IS DISTINCT FROM n.pool_id"
        )
    ]


def check_scalars() -> list[str]:
    """Guard 3: every node_resources.allocated equals the sum of the live claims on it, within its limit."""
    rows = sql_rows(
        """
        SELECT nr.node_id, nr.resource, nr.allocated, COALESCE(c.claimed, 0),
               floor(nr.allocatable * nr.ratio)
          FROM inventory_noderesource nr
          LEFT JOIN (SELECT a.node_id, r.key AS resource, sum((r.value #>> '{}')::bigint) AS claimed
                       FROM reservations_allocation a, jsonb_each(a.resources) r
                      WHERE NOT a.released GROUP BY 1, 2) c
            ON c.node_id = nr.node_id AND c.resource = nr.resource
         WHERE nr.allocated <> COALESCE(c.claimed, 0) OR nr.allocated > floor(nr.allocatable * nr.ratio)
        """
    )
    return [
        f"node {node} {resource}: allocated {allocated}, live claims {claimed}, limit {limit}"
        for node, resource, allocated, claimed, limit in rows
    ]


def check_quota() -> list[str]:
    """Guard 5: every quota_usage.used equals the live charges (atoms booked plus scalars claimed).

    A counter row's `used` is within its `max`; a concurrent row's may pass it
    (its limit is on each instant: `check_concurrent_quota`).
    """
    rows = sql_rows(
        """
        WITH live AS (
            SELECT r.pool_id, r.tenant_id, a.id AS allocation_id, a.resources
              FROM reservations_allocation a JOIN reservations_reservation r ON r.id = a.reservation_id
             WHERE NOT a.released
        ), charges AS (
            SELECT l.pool_id, l.tenant_id, d.device_class AS resource, count(*) AS amount
              FROM live l JOIN device_bookings b ON b.allocation_id = l.allocation_id
              JOIN inventory_device d ON d.id = b.device_id GROUP BY 1, 2, 3
            UNION ALL
            SELECT l.pool_id, l.tenant_id, r.key, sum((r.value #>> '{}')::bigint)
              FROM live l, jsonb_each(l.resources) r GROUP BY 1, 2, 3
        )
        SELECT q.pool_id, q.tenant_id, q.resource, q.used, q.max, COALESCE(sum(c.amount), 0)
          FROM quota_usage q LEFT JOIN charges c
            ON c.pool_id = q.pool_id AND c.tenant_id = q.tenant_id AND c.resource = q.resource
         GROUP BY 1, 2, 3, 4, 5, q.mode
        HAVING q.used <> COALESCE(sum(c.amount), 0) OR (q.mode = 'counter' AND q.used > q.max)
        """
    )
    return [
        f"quota {tenant}@{pool} {resource}: used {used} of {limit}, live charges {charged}"
        for pool, tenant, resource, used, limit, charged in rows
    ]


def check_concurrent_quota() -> list[str]:
    """The concurrent quota: for every instant, each concurrent-mode tenant's use per resource <= its limit.

    Use at an instant: the atoms of the class booked then by the tenant's live
    allocations in the pool, plus the scalars they claim over their
    reservation's window. The use is highest at the start of some holding, so
    each start is an instant to check: every holding whose range contains it
    is summed there (a self-join, not the sweep the charge uses).
    """
    rows = sql_rows(
        """
        WITH live AS (
            SELECT r.pool_id, r.tenant_id, a.id AS allocation_id, a.resources, r.starts_at, r.ends_at
              FROM reservations_allocation a JOIN reservations_reservation r ON r.id = a.reservation_id
             WHERE NOT a.released
        ), held AS (
            SELECT l.pool_id, l.tenant_id, d.device_class AS resource, b.during, 1 AS amount
              FROM live l JOIN device_bookings b ON b.allocation_id = l.allocation_id
              JOIN inventory_device d ON d.id = b.device_id
            UNION ALL
            SELECT l.pool_id, l.tenant_id, r.key, tstzrange(l.starts_at, l.ends_at, '[)'),
                   (r.value #>> '{}')::bigint
              FROM live l, jsonb_each(l.resources) r
        ), limited AS (
            SELECT h.*, q.max FROM held h JOIN quota_usage q
                ON q.pool_id = h.pool_id AND q.tenant_id = h.tenant_id AND q.resource = h.resource
             WHERE q.mode = 'concurrent'
        ), instants AS (
            SELECT DISTINCT pool_id, tenant_id, resource, max, lower(during) AS at FROM limited
        )
        SELECT i.pool_id, i.tenant_id, i.resource, i.max, i.at, sum(h.amount)
          FROM instants i JOIN limited h
            ON h.pool_id = i.pool_id AND h.tenant_id = i.tenant_id AND h.resource = i.resource
           AND h.during @> i.at
         GROUP BY 1, 2, 3, 4, 5
        HAVING sum(h.amount) > i.max
         ORDER BY 1, 2, 3, 5
         LIMIT 20
        """
    )
    return [
        f"concurrent quota {tenant}@{pool} {resource}: {in_use} in use at {at}, limit {limit}"
        for pool, tenant, resource, limit, at, in_use in rows
    ]


def rollup_snapshot() -> dict[tuple[str, str], tuple[int, ...]]:
    """(pool, resource) -> every stored count of its rollup row, as the transactions' deltas left it."""
    columns = ", ".join(ROLLUP_STORED_COUNTS)
    return {
        (pool, resource): tuple(counts)
        for pool, resource, *counts in sql_rows(
            f"SELECT pool_id, resource, {columns} FROM pool_capacity_rollup"
        )
    }


def rollup_differences(
    rows: dict[tuple[str, str], tuple[int, ...]], counted: dict[tuple[str, str], tuple[int, ...]], what: str
) -> list[str]:
    zero = (0,) * len(ROLLUP_STORED_COUNTS)
    problems = []
    for key in sorted(set(rows) | set(counted)):
        old, new = rows.get(key, zero), counted.get(key, zero)
        if old != new:
            moved = {
                name: (a, b) for name, a, b in zip(ROLLUP_STORED_COUNTS, old, new, strict=True) if a != b
            }
            problems.append(f"rollup {key[0]} {key[1]}: the rows hold / {what} counts {moved}")
    return problems


def check_rollups_match_count() -> list[str]:
    """Every rollup row equals a recount of the bookings by phase (read-only; at every committed instant).

    The recount is the rebuild's (`reservations.rollups.counts`) without its writes and
    without moving any phase: each transaction that changes a booking, a claim,
    a node or a device applies its delta before it commits, so any one snapshot
    must agree, even with the worker behind the clock.
    """
    pools = [pool for (pool,) in sql_rows("SELECT id FROM inventory_pool ORDER BY id")]
    counted = {
        key: tuple(counts[name] for name in ROLLUP_STORED_COUNTS)
        for key, counts in rollup_recount(pool_ids=pools).items()
    }
    return rollup_differences(rollup_snapshot(), counted, "a recount")


def kept_differences(
    what: str,
    columns: str,
    kept: dict[tuple[Any, ...], tuple[Any, ...]],
    counted: dict[tuple[Any, ...], tuple[Any, ...]],
) -> list[str]:
    """The first 20 keys whose row a trigger keeps differs from its recount, each with both values."""
    return [
        f"{what} {key}: kept ({columns}) {kept.get(key)}, recounted {counted.get(key)}"
        for key in sorted(set(kept) | set(counted))
        if kept.get(key) != counted.get(key)
    ][:20]


def check_node_atom_counts() -> list[str]:
    """Every node's kept free-atom counts (what the placer ranks by) equal a recount (at every instant).

    The triggers that keep `node_atom_counts` run in the statement that changes
    a booking, a device or a node, so any one snapshot must agree with the
    recount (`reservations.rollups.counts.NODE_ATOM_COUNTS_SQL`), the node's
    schedulability and fabric label included; rows kept at zero have no
    recounted row and are left out.
    """
    kept = {
        (node, device_class): tuple(rest)
        for node, device_class, *rest in sql_rows(
            "SELECT node_id, device_class, pool_id, atoms, running, schedulable, fabric FROM node_atom_counts"
            " WHERE atoms <> 0 OR running <> 0"
        )
    }
    counted = {
        (node, device_class): (pool, atoms, running, schedulable, fabric)
        for node, pool, device_class, atoms, running, schedulable, fabric in sql_rows(NODE_ATOM_COUNTS_SQL)
    }
    return kept_differences("node", "pool, atoms, running, schedulable, fabric", kept, counted)


def check_pool_fabric_counts() -> list[str]:
    """Every pool's kept fabric counts (`capacity/byPool`'s fragmentation) equal a recount (at every instant).

    Recounted from the nodes, devices and bookings themselves
    (`POOL_FABRIC_COUNTS_SQL` over `NODE_ATOM_COUNTS_SQL`), not from the node
    rows the triggers add up, so a wrong node row shows here too. Rows kept
    at zero have no recounted row and are left out.
    """
    kept = {
        (pool, device_class, fabric): tuple(counts)
        for pool, device_class, fabric, *counts in sql_rows(
            "SELECT pool_id, device_class, fabric, nodes, nodes_free, whole_free, stranded"
            " FROM pool_fabric_counts WHERE nodes <> 0 OR nodes_free <> 0 OR whole_free <> 0 OR stranded <> 0"
        )
    }
    counted = {
        (pool, device_class, fabric): tuple(counts)
        for pool, device_class, fabric, *counts in sql_rows(
            POOL_FABRIC_COUNTS_SQL.format(rows=f"({NODE_ATOM_COUNTS_SQL})")
        )
    }
    return kept_differences("pool, class, fabric", "nodes, free, whole, stranded", kept, counted)


def check_reservations_whole() -> list[str]:
    """Every reservation has exactly its allocations and bookings, and a release left nothing behind."""
    problems: list[str] = []
    reservations = sql_rows(
        "SELECT id, state, request, starts_at, ends_at, released_at FROM reservations_reservation ORDER BY id"
    )
    allocations: dict[str, list[tuple[Any, ...]]] = {}
    allocation_rows = "SELECT reservation_id, id, node_id, resources, released FROM reservations_allocation"
    for row in sql_rows(allocation_rows):
        allocations.setdefault(row[0], []).append(row[1:])
    bookings: dict[str, list[tuple[Any, ...]]] = {}
    for row in sql_rows(
        "SELECT b.allocation_id, d.node_id, d.device_class, lower(b.during), upper(b.during)"
        " FROM device_bookings b JOIN inventory_device d ON d.id = b.device_id"
        " WHERE b.allocation_id IS NOT NULL"
    ):
        bookings.setdefault(row[0], []).append(row[1:])
    for rid, state, request, starts_at, ends_at, released_at in reservations:
        request = json.loads(request) if isinstance(request, str) else request
        mine = allocations.get(rid, [])
        if len(mine) != 1:
            problems.append(f"{rid}: {len(mine)} allocations, a reservation without gang has exactly one")
            continue
        allocation_id, node_id, resources, released = mine[0]
        resources = json.loads(resources) if isinstance(resources, str) else resources
        booked = bookings.get(allocation_id, [])
        asked = {k: v for k, v in (request.get("resources") or {}).items() if v}
        if resources != asked:
            problems.append(f"{rid}: allocation claims {resources}, the request asked {asked}")
        if any(node != node_id for node, *_ in booked):
            problems.append(f"{rid}: a booking sits on another node than its allocation's")
        if state in ("scheduled", "active"):
            wanted = sum(item["count"] for item in request["devices"])
            if released:
                problems.append(f"{rid}: {state} but its allocation is released")
            if len(booked) != wanted:
                problems.append(f"{rid}: {len(booked)} bookings for {wanted} atoms asked")
            if any((lo, hi) != (starts_at, ends_at) for _n, _c, lo, hi in booked):
                problems.append(f"{rid}: a booking's range differs from the reservation's")
        elif state == "released":
            if not released:
                problems.append(f"{rid}: released but its allocation still holds its claims")
            if any(hi > released_at for _n, _c, _lo, hi in booked):
                problems.append(f"{rid}: a booking outlives its release")
    orphans = sql_rows(
        "SELECT a.id FROM reservations_allocation a LEFT JOIN device_bookings b ON b.allocation_id = a.id"
        " WHERE b.id IS NULL AND NOT a.released"
    )
    problems.extend(f"allocation {a} holds no booking" for (a,) in orphans)
    return problems


def check_no_tenant_booking_in_a_window() -> list[str]:
    """No tenant booking inside a live maintenance window, but one there before it and marked at risk.

    A reservation that was booked inside when the window was scheduled and could
    not move stays (it is running, or nothing else fits) and must carry the
    at-risk mark; anything else there is a booking the window should have refused.
    """
    return [
        f"{rid} (tenant {tenant}) is booked on {node} inside maintenance window {window}"
        + ("" if marked else " and is not marked at risk")
        + ("" if before else ", created after the window")
        for rid, tenant, node, window, marked, before in sql_rows(
            "SELECT DISTINCT r.id, r.tenant_id, d.node_id, w.id, r.at_risk_since IS NOT NULL,"
            " r.created_at < w.created_at"
            " FROM reservations_maintenancewindow w"
            " JOIN reservations_maintenancewindownode m ON m.window_id = w.id"
            " JOIN inventory_device d ON d.node_id = m.node_id"
            " JOIN device_bookings b ON b.device_id = d.id AND b.purpose = 'allocation'"
            " JOIN reservations_allocation a ON a.id = b.allocation_id"
            " JOIN reservations_reservation r ON r.id = a.reservation_id"
            " WHERE w.state IN ('scheduled', 'active')"
            " AND b.during && tstzrange(GREATEST(w.starts_at, w.created_at), w.ends_at, '[)')"
            " AND NOT a.released AND r.state IN ('scheduled', 'active')"
            " ORDER BY 1, 3"
        )
        if not (marked and before)
    ]


# Every invariant an operator can check, by the name `check_invariants` prints.
INVARIANTS: dict[str, Callable[[], list[str]]] = {
    "no atom booked twice": check_no_double_booking,
    "bookings carry their node's pool": check_booking_pools,
    "node scalars equal their live claims": check_scalars,
    "quota used equals the live charges": check_quota,
    "concurrent quota within its limit at every instant": check_concurrent_quota,
    "reservations hold their allocations and bookings": check_reservations_whole,
    "rollups equal a recount": check_rollups_match_count,
    "node free-atom counts equal a recount": check_node_atom_counts,
    "pool fabric counts equal a recount": check_pool_fabric_counts,
    "no tenant booking inside a maintenance window": check_no_tenant_booking_in_a_window,
}


def invariant_report() -> dict[str, list[str]]:
    """Every invariant's problems (none: an empty list), all read in one read-only snapshot."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        return {name: check() for name, check in INVARIANTS.items()}
