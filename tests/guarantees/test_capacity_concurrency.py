"""The torture tests: 1,000 interleaved and 1,000 concurrent operations, then every invariant.

The mix (`tests.support.torture.ops`) is reservations (create, release) against
cordons, uncordons, taints, untaints, maintenance and `healthy` flips, cordons
of nodes and failures of GPUs that hold future bookings, and BookingRepair
runs (`bookings_repair`) between them, on a small fleet where most creates
fight for the last atoms of some node. After
each run the checks in `tests.support.torture.checks` recount everything from the
rows, and `tests.support.torture.commitlog` judges every committed booking against
the node and atom states that committed before it. While the run is in
flight, every `SAMPLE_EVERY` operations one of the threads (or sessions) also
reads, in one snapshot, the invariants that must hold at every instant
(`checks.Sampler`): no atom booked twice, scalars and quota within their
limits and equal to the live claims.

Seeds and counts are arguments: `SOAK=1` (`make soak`) runs ten times the
operations with the same code, `TORTURE_SEED` picks another schedule.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connections

from core.clock import compute_now
from tests.support.clock import now_ms
from tests.support.threads import Dealer, threads_run
from tests.support.torture.checks import (
    Sampler,
    check_phases_follow_the_clock,
    check_rollups_match_rebuild,
    invariant_problems,
)
from tests.support.torture.commitlog import LogSummary, commitlog_check
from tests.support.torture.fleet import Fleet, fleet_restore
from tests.support.torture.ops import Ledger, Op, Tally, op_run_http, op_run_service, ops_generate
from tests.support.torture.repair_checks import at_risk_count, check_repaired
from tests.support.torture.scale import JOIN_SECONDS, SCALE, SEED
from tests.support.torture.servers import ServerGroup, http_tokens
from tests.support.torture.stepper import Stepper

INTERLEAVED_OPERATIONS = 1_000 * SCALE
INTERLEAVED_SESSIONS = 6
CONCURRENT_OPERATIONS = 1_000 * SCALE
CONCURRENT_THREADS = 16
HTTP_OPERATIONS = 2_000 * SCALE
HTTP_CLIENTS = 16
# One snapshot of the every-instant invariants per this many operations, taken mid-run.
SAMPLE_EVERY = 10


def verify_run(fleet: Fleet, tally: Tally, sampler: Sampler, *, operations: int) -> LogSummary:
    """Every check of the brief, in an order where none disturbs the next; returns the log's summary."""
    from core.models import AuditEvent
    from reservations.lifecycle.repair_sweep import bookings_repair

    assert tally.total == operations, (tally.counts, tally.failures[:10])
    assert not tally.failures, tally.failures[:10]
    # The counters were right while the work was in flight, not only once it settled.
    assert sampler.samples == sampler.expected(operations), sampler.samples
    assert not sampler.problems, "\n".join(sampler.problems[:20])
    # The run must have contested something, or it proves nothing.
    assert tally.counts["created"] > 0 and tally.counts["released"] > 0 and tally.counts["node-op"] > 0
    assert tally.counts["no-capacity"] + tally.counts["quota"] > 0, tally.counts
    assert tally.counts["repaired"] > 0, tally.counts
    # Maintenance windows were scheduled and cancelled among the operations.
    assert tally.counts["window"] > 0 and tally.counts["window-cancelled"] > 0, tally.counts
    problems = invariant_problems()
    log = commitlog_check()
    problems.extend(log.violations)
    assert log.bookings > 0 and log.state_changes > 0
    problems.extend(check_phases_follow_the_clock())
    # The run's repairs acted: they moved bookings (each move's bookings judged by the commit log
    # above) or marked reservations at risk.
    acted = AuditEvent.objects.filter(action__in=("reservation.repaired", "reservation.at-risk"))
    assert acted.exists(), tally.counts
    # At rest, one more repair pass (as the worker's after the last node change) leaves nothing undone,
    # and the rollups equal a rebuild in the fleet state the run left, cordons and all.
    bookings_repair()
    problems.extend(check_repaired())
    problems.extend(invariant_problems())
    problems.extend(check_rollups_match_rebuild())
    moved = AuditEvent.objects.filter(action="reservation.repaired").count()
    print(f"\nrepair: {moved} reservations moved, {at_risk_count()} at risk at rest")
    # Every node schedulable again: the next pass clears every mark that no longer holds.
    fleet_restore(fleet)
    bookings_repair()
    problems.extend(check_repaired())
    problems.extend(check_rollups_match_rebuild())
    assert not problems, "\n".join(problems[:20])
    return log


def run_interleaved(
    fleet: Fleet, sampler: Sampler, *, seed: int, operations: int, sessions: int
) -> tuple[Tally, Stepper]:
    """Deal the seeded schedule to `sessions` open transactions and step them statement by statement.

    A sample is dealt like an operation, so its statements are stepped between the others'.
    """
    ops = ops_generate(fleet=fleet, seed=seed, count=operations, now_ms=now_ms(), key_prefix="il")
    ledger = Ledger()
    tally = Tally()

    def bind(op: Op) -> Any:
        def run() -> str:
            try:
                outcome = op_run_service(op, ledger, fleet)
            except Exception as exc:
                # The stepper records the exception; this names the operation that raised it.
                raise RuntimeError(f"{op.kind} {op.args}: {type(exc).__name__}: {exc}") from exc
            tally.record(op, outcome)
            return outcome

        return run

    dealt: list[list[Any]] = [[] for _ in range(sessions)]
    for index, op in enumerate(ops):
        if sampler.due(index):
            dealt[index % sessions].append(sampler.sample)
        dealt[index % sessions].append(bind(op))
    stepper = Stepper(seed=seed, sessions=dealt)
    outcomes = stepper.run()
    # An exception inside an operation is an outcome the tally never saw.
    errors = [o for o in outcomes if o.startswith("error:")]
    tally.failures.extend(errors)
    return tally, stepper


def work_the_queue(
    queue: Dealer[tuple[int, Op]], sampler: Sampler, tally: Tally, run: Callable[[int, Op], str]
) -> None:
    """Take the dealt operations until none is left: the sampler samples when due, each op runs, is tallied.

    Every unexpected exception is an `error:` outcome, which fails the run; the thread's
    connections are closed at the end.
    """
    try:
        while (item := queue.next()) is not None:
            index, op = item
            try:
                sampler.maybe(index)
                outcome = run(index, op)
            except Exception as exc:  # every unexpected exception fails the run
                outcome = f"error: {type(exc).__name__}: {exc}"
            tally.record(op, outcome)
    finally:
        connections.close_all()


def run_concurrent_service(
    fleet: Fleet, sampler: Sampler, *, seed: int, operations: int, threads: int
) -> Tally:
    """`threads` threads, each with its own connection, take the seeded operations from one queue."""
    ops = ops_generate(fleet=fleet, seed=seed, count=operations, now_ms=now_ms(), key_prefix="cc")
    ledger = Ledger()
    tally = Tally()
    queue = Dealer(enumerate(ops))
    start = threading.Barrier(threads)

    def worker() -> None:
        start.wait(JOIN_SECONDS)
        work_the_queue(queue, sampler, tally, lambda _, op: op_run_service(op, ledger, fleet))

    threads_run(worker, threads, seconds=JOIN_SECONDS)
    return tally


def run_concurrent_http(
    fleet: Fleet, servers: ServerGroup, sampler: Sampler, *, seed: int, operations: int, clients: int
) -> Tally:
    """`clients` threads send the seeded operations to the server processes, alternating between them."""
    tokens = http_tokens(fleet)
    ops = ops_generate(fleet=fleet, seed=seed, count=operations, now_ms=now_ms(), key_prefix="http")
    ledger = Ledger()
    tally = Tally()
    queue = Dealer(enumerate(ops))

    def run(index: int, op: Op) -> str:
        base_url = servers.urls[index % len(servers.urls)]
        return op_run_http(op, ledger, base_url=base_url, tokens=tokens, fleet=fleet)

    def worker() -> None:
        # The samples read from the database the servers write, mid-run; a dropped connection
        # or a timeout is an error outcome, and fails the run.
        work_the_queue(queue, sampler, tally, run)

    threads_run(worker, clients, seconds=JOIN_SECONDS)
    return tally


@pytest.mark.slow
def test_interleaved_operations_keep_every_invariant(fleet: Fleet) -> None:
    sampler = Sampler(every=SAMPLE_EVERY)
    tally, stepper = run_interleaved(
        fleet, sampler, seed=SEED, operations=INTERLEAVED_OPERATIONS, sessions=INTERLEAVED_SESSIONS
    )
    # The schedule really interleaved: sessions waited on each other's locks mid-transaction.
    assert stepper.steps > INTERLEAVED_OPERATIONS and stepper.lock_waits > 0
    log = verify_run(fleet, tally, sampler, operations=INTERLEAVED_OPERATIONS)
    print(
        f"\ninterleaved: {dict(tally.counts)}, {stepper.steps} statements stepped,"
        f" {stepper.lock_waits} lock waits, {sampler.samples} snapshots mid-run, {log.bookings} bookings"
        f" judged against {log.state_changes} changes"
    )


@pytest.mark.slow
def test_concurrent_operations_through_the_services_keep_every_invariant(fleet: Fleet) -> None:
    sampler = Sampler(every=SAMPLE_EVERY)
    tally = run_concurrent_service(
        fleet, sampler, seed=SEED + 1, operations=CONCURRENT_OPERATIONS, threads=CONCURRENT_THREADS
    )
    log = verify_run(fleet, tally, sampler, operations=CONCURRENT_OPERATIONS)
    print(
        f"\nconcurrent: {dict(tally.counts)}, {sampler.samples} snapshots mid-run, {log.bookings} bookings"
        f" judged against {log.state_changes} changes"
    )


@pytest.mark.slow
def test_concurrent_operations_through_two_server_processes_keep_every_invariant(fleet: Fleet) -> None:
    sampler = Sampler(every=SAMPLE_EVERY)
    with ServerGroup.start(count=2) as servers:
        tally = run_concurrent_http(
            fleet, servers, sampler, seed=SEED + 2, operations=HTTP_OPERATIONS, clients=HTTP_CLIENTS
        )
        assert servers.all_alive(), "a server process died under load"
    log = verify_run(fleet, tally, sampler, operations=HTTP_OPERATIONS)
    print(
        f"\nhttp: {dict(tally.counts)}, {sampler.samples} snapshots mid-run, {log.bookings} bookings judged"
        f" against {log.state_changes} changes"
    )


# --- The checks catch what they are for: each broken on purpose -------------------------------


def _one_gpu_reservation(fleet: Fleet, key: str, booker: int = 0) -> Any:
    from reservations.request.parse import parse_reservation_request
    from reservations.services import reservation_create

    pool_id, tenant_id = fleet.bookers[booker]
    body = {
        "tenantId": tenant_id,
        "poolId": pool_id,
        "devices": [{"class": "gpu", "count": 1}],
        "duration": "1h",
        "idempotencyKey": key,
        "resources": {"vcpu": 2},
    }
    reservation, _ = reservation_create(request=parse_reservation_request(body), actor="test")
    return reservation


def test_the_commit_log_catches_a_placer_that_skips_the_node_lock(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Guard 4 broken on purpose: the placer no longer re-checks the node under its lock."""
    from inventory.models import Node
    from inventory.services.nodes import node_cordon
    from reservations.placer import filters, option

    for node in Node.objects.filter(pk__in=fleet.node_ids):
        node_cordon(node=node, reason="test", actor="test")
    monkeypatch.setattr(option, "_lock_node", lambda **_: True)
    # The plan reads the predicate too; make it blind as well, as a stale plan would be.
    monkeypatch.setattr(filters, "_SCHEDULABLE_SQL", "true")
    _one_gpu_reservation(fleet, "broken-guard-4")
    violations = commitlog_check().violations
    assert len(violations) == 1 and "the node was unschedulable" in violations[0]


def test_the_checks_catch_forged_counters_quota_rollups_and_half_written_reservations(fleet: Fleet) -> None:
    from django.db import connection

    reservation = _one_gpu_reservation(fleet, "forged")
    assert invariant_problems() == []
    forgeries = [
        (
            "UPDATE inventory_noderesource SET allocated = allocated + 1 WHERE allocated > 0",
            "vcpu: allocated",
        ),
        ("UPDATE quota_usage SET used = used + 1 WHERE resource = 'gpu'", "quota"),
        (
            "DELETE FROM fake_daemon_assignments WHERE reservation_id = %s",
            "the node does not hold",
        ),
        (
            "DELETE FROM device_bookings WHERE allocation_id IN"
            " (SELECT id FROM reservations_allocation WHERE reservation_id = %s)",
            "bookings for 1 atoms asked",
        ),
    ]
    for sql, expected_text in forgeries:
        with connection.cursor() as cursor:
            cursor.execute(sql, [reservation.pk] if "%s" in sql else None)
        assert any(expected_text in p for p in invariant_problems()), (sql, invariant_problems())
    with connection.cursor() as cursor:
        cursor.execute("UPDATE pool_capacity_rollup SET reserved = reserved + 3 WHERE resource = 'gpu'")
    assert check_rollups_match_rebuild()


def test_the_sampler_catches_a_wrong_counter_that_is_gone_by_the_end_of_the_run(fleet: Fleet) -> None:
    """A counter wrong for a moment (here forged, then put back) is seen mid-run, never at the end."""
    from django.db import connection

    _one_gpu_reservation(fleet, "sampled")
    sampler = Sampler(every=1)
    sampler.sample()
    assert sampler.problems == []
    forgeries = [
        (
            "UPDATE inventory_noderesource SET allocated = allocated + {} WHERE allocated > 0",
            "vcpu: allocated",
        ),
        ("UPDATE quota_usage SET used = used + {} WHERE resource = 'gpu'", "quota"),
    ]
    for sql, expected_text in forgeries:
        with connection.cursor() as cursor:
            cursor.execute(sql.format(1))
        sampler.sample()
        with connection.cursor() as cursor:
            cursor.execute(sql.format(-1))
        assert any(expected_text in p for p in sampler.problems), (sql, sampler.problems)
    assert sampler.samples == 3 and invariant_problems() == []


def test_a_sample_taken_while_a_create_holds_its_claims_uncommitted_finds_nothing_wrong(fleet: Fleet) -> None:
    """No false alarm mid-flight: a create stopped after its scalar claim and quota charge, then committed."""
    from django.db import connection, transaction

    from reservations.models import PoolCapacityRollup
    from tests.support.threads import JOIN_SECONDS as WORKER_SECONDS
    from tests.support.threads import Worker, wait_until_blocked_on_lock

    pool_id, guest = fleet.bookers[1]
    assert guest != fleet.tenants[0]  # the guest books under quota
    locked = threading.Event()
    release = threading.Event()

    def hold_rollup_rows() -> None:
        with transaction.atomic():
            list(PoolCapacityRollup.objects.select_for_update().filter(pool_id=pool_id))
            locked.set()
            assert release.wait(WORKER_SECONDS)

    gate = Worker(hold_rollup_rows)
    gate.start()
    assert locked.wait(WORKER_SECONDS)
    # The create claims its vCPUs and charges its quota, then waits for the rollup rows.
    placer = Worker(lambda: _one_gpu_reservation(fleet, "in-flight", booker=1))
    placer.start()
    wait_until_blocked_on_lock(placer)
    with connection.cursor() as cursor:
        cursor.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", [placer.pid])
        assert "pool_capacity_rollup" in cursor.fetchone()[0]
    sampler = Sampler(every=1)
    sampler.sample()
    release.set()
    gate.join_ok()
    placer.join_ok()
    sampler.sample()
    assert sampler.samples == 2 and sampler.problems == []
    assert invariant_problems() == []


def test_a_create_delivered_before_the_release_news_reaches_the_node_is_accepted(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race the HTTP run found: release commits, a create books the atom and delivers first."""
    from inventory.models import Node
    from inventory.services.nodes import node_cordon
    from reservations.delivery import sending
    from reservations.models import Reservation
    from reservations.services import reservation_release

    # One schedulable node with its GPUs: the second reservation must reuse the first's atom.
    for node in Node.objects.filter(pk__in=fleet.node_ids[1:]):
        node_cordon(node=node, reason="test", actor="test")
    first = _one_gpu_reservation(fleet, "first")
    late: list[str] = []
    monkeypatch.setattr(sending, "daemon_shorten", lambda *, reservation_id, **_: late.append(reservation_id))
    reservation_release(reservation=first, actor="test")
    monkeypatch.undo()
    assert late == [first.pk]  # the node has not heard of the release yet
    for index in range(4):  # every GPU of the node, the released one included
        second = _one_gpu_reservation(fleet, f"second-{index}")
        assert Reservation.objects.get(pk=second.pk).state == "active", second.release_reason
    assert check_daemon_refusals() == []


def check_daemon_refusals() -> list[str]:
    from tests.support.torture.checks import check_daemon

    return check_daemon(require_delivery=True)


def test_the_repair_check_catches_a_booking_left_on_a_cordoned_node_and_a_stale_mark(fleet: Fleet) -> None:
    """The new invariant broken on purpose: BookingRepair skipped, then a mark forged on a healthy one."""
    from inventory.models import Node
    from operations.services import node_cordon
    from reservations.lifecycle.repair_sweep import bookings_repair
    from reservations.models import Allocation, Reservation
    from reservations.request.parse import parse_reservation_request
    from reservations.services import reservation_create

    pool_id, tenant_id = fleet.bookers[0]
    body = {
        "tenantId": tenant_id,
        "poolId": pool_id,
        "devices": [{"class": "gpu", "count": 1}],
        "duration": "1h",
        "start": now_ms() + 3_600_000,
        "idempotencyKey": "left-behind",
    }
    reservation, _ = reservation_create(request=parse_reservation_request(body), actor="test")
    assert check_repaired() == []
    node_id = Allocation.objects.get(reservation=reservation).node_id
    node_cordon(node=Node.objects.get(pk=node_id), reason="test", actor="test")
    left = check_repaired()
    assert len(left) == 1 and reservation.pk in left[0] and "not at risk" in left[0]
    assert bookings_repair() == 1
    assert check_repaired() == []
    assert Allocation.objects.get(reservation=reservation).node_id != node_id
    Reservation.objects.filter(pk=reservation.pk).update(at_risk_reason="forged", at_risk_since=compute_now())
    stale = check_repaired()
    assert len(stale) == 1 and "marked at risk (forged) with nothing left at risk" in stale[0]
