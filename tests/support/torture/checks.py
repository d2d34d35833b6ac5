"""The invariants every run must leave behind; each returns what it found wrong, as sentences.

These are written to catch a broken guard, not to restate the code: they
recount from the rows (bookings, allocations, requests) what the counters,
quota rows and rollups claim.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, transaction

from reservations.lifecycle.phases import bookings_advance
from reservations.rollups.counts import NODE_ATOM_COUNTS_SQL
from reservations.rollups.deltas import ROLLUP_STORED_COUNTS
from reservations.rollups.recount import rollup_rebuild_all, rollup_recount
from tests.support.torture.commitlog import commitlog_check
from tests.support.torture.fleet import Fleet, fleet_restore


def _rows(sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def check_no_double_booking() -> list[str]:
    """Guard 1: no atom in two overlapping bookings, and the exclusion constraint is still there."""
    problems = [
        f"device {device} booked twice: bookings {a} and {b} overlap"
        for device, a, b in _rows(
            "SELECT a.device_id, a.id, b.id FROM device_bookings a JOIN device_bookings b"
            " ON a.device_id = b.device_id AND a.id < b.id AND a.during && b.during"
        )
    ]
    if not _rows(
        "SELECT 1 FROM pg_constraint WHERE conname = 'device_bookings_no_overlap' AND contype = 'x'"
    ):
        problems.append("the exclusion constraint device_bookings_no_overlap is missing")
    return problems


def check_booking_pools() -> list[str]:
    """Guard 1's shard key: every booking carries its device's node's pool, or the constraint splits."""
    return [
        f"booking {booking} of device {device} says pool {said}, its node is in {actual}"
        for booking, device, said, actual in _rows(
            "SELECT b.id, b.device_id, b.pool_id, n.pool_id FROM device_bookings b"
            " JOIN inventory_device d ON d.id = b.device_id JOIN inventory_node n ON n.id = d.node_id"
            " WHERE b.pool_id IS DISTINCT FROM n.pool_id"
        )
    ]


def check_scalars() -> list[str]:
    """Guard 3: every node_resources.allocated equals the sum of the live claims on it, within its limit."""
    rows = _rows(
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
    rows = _rows(
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
    rows = _rows(
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
        for pool, resource, *counts in _rows(f"SELECT pool_id, resource, {columns} FROM pool_capacity_rollup")
    }


def _rollup_differences(
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


def check_rollups_match_rebuild() -> list[str]:
    """Every rollup row equals a fresh rebuild's, in whatever state the fleet is (cordons, taints and all).

    Bookings, node and device changes and bookings changing phase all move
    the rows in their own transactions, so no count waits for the rebuild.
    One transaction fixes the clock: the phases are first caught up with it
    (`bookings_advance`, as the worker would), then the rows are compared with
    the rebuild's recount (which then has no phase left to move).
    """
    with transaction.atomic():
        bookings_advance()
        before = rollup_snapshot()
        rollup_rebuild_all()
        after = rollup_snapshot()
    return _rollup_differences(before, after, "a rebuild")


def check_rollups_match_count() -> list[str]:
    """Every rollup row equals a recount of the bookings by phase (read-only; at every committed instant).

    The recount is the rebuild's (`reservations.rollups.counts`) without its writes and
    without moving any phase: each transaction that changes a booking, a claim,
    a node or a device applies its delta before it commits, so any one snapshot
    must agree, even with the worker behind the clock.
    """
    pools = [pool for (pool,) in _rows("SELECT id FROM inventory_pool ORDER BY id")]
    counted = {
        key: tuple(counts[name] for name in ROLLUP_STORED_COUNTS)
        for key, counts in rollup_recount(pool_ids=pools).items()
    }
    return _rollup_differences(rollup_snapshot(), counted, "a recount")


def check_node_atom_counts() -> list[str]:
    """Every node's kept free-atom counts (what the placer ranks by) equal a recount (at every instant).

    The triggers that keep `node_atom_counts` run in the statement that changes
    a booking or a device, so any one snapshot must agree with the recount
    (`reservations.rollups.counts.NODE_ATOM_COUNTS_SQL`); rows kept at zero have no
    recounted row and are left out.
    """
    kept = {
        (node, device_class): (pool, atoms, running)
        for node, pool, device_class, atoms, running in _rows(
            "SELECT node_id, pool_id, device_class, atoms, running FROM node_atom_counts"
            " WHERE atoms <> 0 OR running <> 0"
        )
    }
    counted = {
        (node, device_class): (pool, atoms, running)
        for node, pool, device_class, atoms, running in _rows(NODE_ATOM_COUNTS_SQL)
    }
    return [
        f"node {node} {device_class}: kept (pool, atoms, running) {kept.get((node, device_class))},"
        f" recounted {counted.get((node, device_class))}"
        for node, device_class in sorted(set(kept) | set(counted))
        if kept.get((node, device_class)) != counted.get((node, device_class))
    ][:20]


def check_phases_follow_the_clock() -> list[str]:
    """After `bookings_advance`, every booking's phase is the one its window has on the clock.

    FUTURE bookings start later, RUNNING ones have started and not ended, OVER
    ones have ended. One transaction fixes the clock for both steps.
    """
    with transaction.atomic():
        bookings_advance()
        wrong = _rows(
            """
            SELECT b.id, b.phase, lower(b.during), upper(b.during), compute_now() FROM device_bookings b
             WHERE b.phase <> CASE WHEN upper(b.during) <= compute_now() THEN 2
                                   WHEN lower(b.during) <= compute_now() THEN 1
                                   ELSE 0 END
             ORDER BY b.id LIMIT 20
            """
        )
    return [
        f"booking {booking}: phase {phase} for [{lower}, {upper}) at {now}"
        for booking, phase, lower, upper, now in wrong
    ]


def check_reservations_whole() -> list[str]:
    """Every reservation has exactly its allocations and bookings, and a release left nothing behind."""
    problems: list[str] = []
    reservations = _rows(
        "SELECT id, state, request, starts_at, ends_at, released_at FROM reservations_reservation ORDER BY id"
    )
    allocations: dict[str, list[tuple[Any, ...]]] = {}
    for row in _rows("SELECT reservation_id, id, node_id, resources, released FROM reservations_allocation"):
        allocations.setdefault(row[0], []).append(row[1:])
    bookings: dict[str, list[tuple[Any, ...]]] = {}
    for row in _rows(
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
    orphans = _rows(
        "SELECT a.id FROM reservations_allocation a LEFT JOIN device_bookings b ON b.allocation_id = a.id"
        " WHERE b.id IS NULL AND NOT a.released"
    )
    problems.extend(f"allocation {a} holds no booking" for (a,) in orphans)
    return problems


def check_daemon(*, require_delivery: bool = True) -> list[str]:
    """Guard 6: the fake node daemon never refused, and holds every live booking it was sent."""
    problems = [
        f"{rid}: the node refused it ({reason})"
        for rid, reason in _rows(
            "SELECT id, release_reason FROM reservations_reservation WHERE release_reason LIKE %s",
            ["AllocationFailed%"],
        )
    ]
    if require_delivery:
        missing = _rows(
            """
            SELECT r.id, d.uid FROM reservations_reservation r
              JOIN reservations_allocation a ON a.reservation_id = r.id
              JOIN device_bookings b ON b.allocation_id = a.id
              JOIN inventory_device d ON d.id = b.device_id
             WHERE r.state IN ('scheduled', 'active') AND NOT EXISTS (
                   SELECT 1 FROM fake_daemon_assignments f
                    WHERE f.reservation_id = r.id AND f.device_uid = d.uid
                      AND f.starts_at = lower(b.during) AND f.ends_at = upper(b.during))
            """
        )
        problems.extend(f"{rid}: the node does not hold {uid}" for rid, uid in missing)
    return problems


def invariant_problems(*, require_delivery: bool = True) -> list[str]:
    """Every check above except the ones that move phases or rebuild (`problems_after_run` adds them)."""
    return [
        *check_no_double_booking(),
        *check_booking_pools(),
        *check_scalars(),
        *check_quota(),
        *check_concurrent_quota(),
        *check_reservations_whole(),
        *check_node_atom_counts(),
        *check_daemon(require_delivery=require_delivery),
    ]


def snapshot_problems() -> list[str]:
    """The invariants that hold at every instant, read in ONE snapshot while other work is in flight.

    Every booking, scalar claim and quota charge commits in the transaction that
    makes or releases the reservation, so any committed state must already have
    no atom booked twice, every `node_resources.allocated` within
    `floor(allocatable * ratio)` and equal to its live claims, every quota's
    `used` equal to its live charges and within `max` (a counter's), and every
    concurrent quota's use within its limit at every instant. One REPEATABLE READ
    transaction makes the recounts agree with each other. The rollups too: every
    row equals a recount of the bookings by phase, of the counted atoms and of
    the scalars, whatever the nodes' state, and so do the per-node free-atom
    counts the placer ranks by. Left out: the node daemon (told
    after commit).
    """
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        return [
            *check_no_double_booking(),
            *check_scalars(),
            *check_quota(),
            *check_concurrent_quota(),
            *check_rollups_match_count(),
            *check_node_atom_counts(),
        ]


@dataclass
class Sampler:
    """Runs `snapshot_problems` every `every` operations of a run, on the calling thread's connection.

    The runs call `maybe(index)` before operation `index`, so the number of
    samples is fixed by the operation count, not by timing; each sample sees
    the other threads' transactions open mid-flight.
    """

    every: int
    samples: int = 0
    problems: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def expected(self, operations: int) -> int:
        return -(-operations // self.every)

    def due(self, index: int) -> bool:
        return index % self.every == 0

    def sample(self) -> str:
        found = snapshot_problems()
        with self.lock:
            self.samples += 1
            self.problems.extend(f"in flight, sample {self.samples}: {problem}" for problem in found)
        return "sampled"

    def maybe(self, index: int) -> None:
        if self.due(index):
            self.sample()


def problems_after_run(fleet: Fleet) -> list[str]:
    """Every check after a run: the recounts and the commit-order log's verdicts, the phases against the
    clock and the rollups against a rebuild in the state the run left the fleet in (cordons, taints,
    maintenance and quarantines included); then, with all of those lifted (through the node events,
    which move the rollups), the rollups once more."""
    problems = invariant_problems()
    problems.extend(commitlog_check().violations)
    problems.extend(check_phases_follow_the_clock())
    problems.extend(check_rollups_match_rebuild())
    fleet_restore(fleet)
    problems.extend(check_rollups_match_rebuild())
    return problems
