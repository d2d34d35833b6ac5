"""The invariants every run must leave behind; each returns what it found wrong, as sentences.

These are written to catch a broken guard, not to restate the code: they
recount from the rows (bookings, allocations, requests) what the counters,
quota rows and rollups claim. The ones that hold at every committed instant
are the operator's (`operations.invariants`, `manage.py check_invariants`);
here are those that move the clock or rebuild the rollups, and the fake node
daemon's, on top of them.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from django.db import connection, transaction

from operations.invariants import (
    check_booking_pools,
    check_concurrent_quota,
    check_no_double_booking,
    check_no_tenant_booking_in_a_window,
    check_node_atom_counts,
    check_pool_fabric_counts,
    check_quota,
    check_reservations_whole,
    check_rollups_match_count,
    check_scalars,
    rollup_differences,
    rollup_snapshot,
    sql_rows,
)
from reservations.lifecycle.phases import bookings_advance
from reservations.rollups.recount import rollup_rebuild_all
from tests.support.torture.commitlog import commitlog_check
from tests.support.torture.fleet import Fleet, fleet_restore


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
    return rollup_differences(before, after, "a rebuild")


def check_phases_follow_the_clock() -> list[str]:
    """After `bookings_advance`, every booking's phase is the one its window has on the clock.

    FUTURE bookings start later, RUNNING ones have started and not ended, OVER
    ones have ended. One transaction fixes the clock for both steps.
    """
    with transaction.atomic():
        bookings_advance()
        wrong = sql_rows(
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


def check_daemon(*, require_delivery: bool = True) -> list[str]:
    """Guard 6: the fake node daemon never refused, and holds every live booking it was sent."""
    problems = [
        f"{rid}: the node refused it ({reason})"
        for rid, reason in sql_rows(
            "SELECT id, release_reason FROM reservations_reservation WHERE release_reason LIKE %s",
            ["AllocationFailed%"],
        )
    ]
    if require_delivery:
        missing = sql_rows(
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
        *check_pool_fabric_counts(),
        *check_no_tenant_booking_in_a_window(),
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
    counts the placer ranks by and the pools' fabric counts. Left out: the node daemon (told
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
            *check_pool_fabric_counts(),
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


__all__ = [
    "Sampler",
    "check_booking_pools",
    "check_concurrent_quota",
    "check_daemon",
    "check_no_double_booking",
    "check_node_atom_counts",
    "check_phases_follow_the_clock",
    "check_pool_fabric_counts",
    "check_quota",
    "check_reservations_whole",
    "check_rollups_match_count",
    "check_rollups_match_rebuild",
    "check_scalars",
    "invariant_problems",
    "problems_after_run",
    "rollup_snapshot",
    "snapshot_problems",
]
