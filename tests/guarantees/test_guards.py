"""The six guards, each attacked with real connections in threads.

Interleavings are made deterministic with hooks in the commit
(`reservations.placer.commit.HOOKS`) and events: a placement is held open at
a known point while another transaction acts, and a transaction that must be
waiting on a row lock is observed in `pg_stat_activity` before the test
moves on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange

from core.clock import compute_now
from core.errors import Conflict, NoCapacity, QuotaExceeded
from inventory.models import Device, Node, NodeResource, Pool
from ledger.models import PoolCapacityRollup, QuotaUsage
from reservations.delivery.daemon import daemon_holdings
from reservations.models import DeviceBooking, Reservation
from reservations.nodes.reports import node_report_apply
from reservations.placer import commit
from reservations.request.types import ReservationRequest
from reservations.rollups.recount import rollup_rebuild
from reservations.services import ReservationCreated, reservation_create, reservation_release
from tests.support.factories import (
    AllocationFactory,
    DeviceFactory,
    NodeFactory,
    NodeResourceFactory,
    PoolFactory,
    QuotaUsageFactory,
    partitioned_gpu,
)
from tests.support.placement import gpu_request
from tests.support.reports import gpu, mig, report
from tests.support.threads import JOIN_SECONDS, Worker, wait_until_blocked_on_lock, workers_race, workers_run


@pytest.fixture
def hooks() -> Iterator[list[Callable[[str, str], None]]]:
    commit.HOOKS.clear()
    yield commit.HOOKS
    commit.HOOKS.clear()


# Events that hold a thread (and its open transaction) until the test lets it go.
_GATES: list[threading.Event] = []


def gate() -> threading.Event:
    """An event a thread waits on; set at the latest when the test ends, pass or fail."""
    event = threading.Event()
    _GATES.append(event)
    return event


@pytest.fixture(autouse=True)
def open_every_gate_at_the_end() -> Iterator[None]:
    """A failing test (a guard removed) lets its held threads go at once instead of after JOIN_SECONDS."""
    yield
    while _GATES:
        _GATES.pop().set()


def one_node(pool: Pool, gpus: int, **fields: Any) -> Node:
    node = NodeFactory(pool=pool, **fields)
    for index in range(gpus):
        DeviceFactory(node=node, uid=f"GPU-{node.id}-{index}")
    return node


def attempt(request: Any) -> Callable[[], Any]:
    def run() -> Any:
        try:
            return reservation_create(request=request, actor="test")
        except (NoCapacity, QuotaExceeded) as exc:
            return exc

    return run


def hold_two_placements_until_both_planned(hooks: list[Callable[[str, str], None]]) -> None:
    """A commit hook that holds each of two placements before its node lock until both got there."""
    both_planned = threading.Barrier(2)
    seen: set[int] = set()

    def rendezvous(point: str, node_id: str) -> None:
        if point == "before_node_lock" and threading.get_ident() not in seen:
            seen.add(threading.get_ident())
            both_planned.wait(JOIN_SECONDS)

    hooks.append(rendezvous)


def assert_no_overlapping_bookings() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM device_bookings a JOIN device_bookings b"
            " ON a.device_id = b.device_id AND a.id < b.id AND a.during && b.during"
        )
        assert cursor.fetchone()[0] == 0


def hold_first_placement(
    hooks: list[Callable[[str, str], None]], point: str = "after_locks"
) -> tuple[threading.Event, threading.Event]:
    """A commit hook that holds the first placement to reach `point` until `go_on` is set.

    Returns `(reached, go_on)`; placements that come later pass the point freely.
    """
    reached = threading.Event()
    go_on = gate()
    claimed = threading.Lock()

    def hold(at: str, node_id: str) -> None:
        if at == point and claimed.acquire(blocking=False):
            reached.set()
            assert go_on.wait(JOIN_SECONDS)

    hooks.append(hold)
    return reached, go_on


def waiting_statement(worker: Worker) -> str:
    """The statement a worker's backend is running (or waiting in)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", [worker.pid])
        return str(cursor.fetchone()[0])


def rows_held(lock_rows: Callable[[], Any]) -> tuple[Worker, threading.Event]:
    """A transaction that runs `lock_rows` (a `select_for_update`) and keeps the locks until told."""
    locked = threading.Event()
    release = gate()

    def hold() -> None:
        with transaction.atomic():
            lock_rows()
            locked.set()
            assert release.wait(JOIN_SECONDS)

    holder = Worker(hold)
    holder.start()
    assert locked.wait(JOIN_SECONDS)
    return holder, release


def bus(index: int) -> str:
    return f"00000000:{0x18 + index:02x}:00.0"


def gpus_by_bus(pool: Pool, gpus: int, *, first_bus: int = 0, **resources: int) -> Node:
    """A node whose GPUs a request can name one by one (`pciBusId`), with scalar `resources`."""
    node = NodeFactory(pool=pool)
    for index in range(first_bus, first_bus + gpus):
        DeviceFactory(
            node=node,
            uid=f"GPU-{node.id}-{index}",
            attributes={"gpuModel": "H100", "vramGiB": 80, "numaNode": 0, "pciBusId": bus(index)},
        )
    for resource, amount in resources.items():
        NodeResourceFactory(node=node, resource=resource, allocatable=amount)
    return node


def on_gpu(pool: Pool, index: int, **fields: Any) -> ReservationRequest:
    """One whole GPU, the one on bus `index`: two such requests never queue on one atom."""
    return gpu_request(pool, 1, selector={"pciBusId": {"eq": bus(index)}}, **fields)


def booked_device_ids(reservation: Reservation | None = None) -> set[int]:
    bookings = DeviceBooking.objects.all()
    if reservation is not None:
        bookings = bookings.filter(allocation__reservation=reservation)
    return set(bookings.values_list("device_id", flat=True))


# --- Guard 1: device-time exclusivity ---------------------------------------------


@pytest.mark.django_db
def test_guard1_the_database_refuses_a_forged_overlapping_booking() -> None:
    device = DeviceFactory()
    allocation = AllocationFactory()
    now = compute_now()
    DeviceBooking.objects.create(
        device=device, allocation=allocation, during=DateTimeTZRange(now, now + timedelta(hours=1))
    )
    with pytest.raises(IntegrityError), transaction.atomic():
        DeviceBooking.objects.create(
            device=device,
            allocation=allocation,
            during=DateTimeTZRange(now + timedelta(minutes=30), now + timedelta(hours=2)),
        )


@pytest.mark.django_db(transaction=True)
def test_guard1_two_placements_racing_for_the_last_atoms_one_wins_the_other_replans(
    hooks: list[Callable[[str, str], None]],
) -> None:
    pool = PoolFactory()
    first = one_node(pool, 2)
    second = one_node(pool, 2)
    # Both placements plan before either books: each has chosen the same best node.
    hold_two_placements_until_both_planned(hooks)
    results = [w.result for w in workers_run([attempt(gpu_request(pool, 2)) for _ in range(2)])]
    assert all(isinstance(r, ReservationCreated) and r.created for r in results), results
    nodes = {Reservation.objects.get(pk=r.reservation.pk).allocations.get().node_id for r in results}
    # The loser's booking INSERT came back short; it rolled back its savepoint and replanned.
    assert nodes == {first.id, second.id}
    assert_no_overlapping_bookings()


@pytest.mark.django_db(transaction=True)
def test_guard1_the_loser_gets_no_capacity_when_nothing_is_left(
    hooks: list[Callable[[str, str], None]],
) -> None:
    pool = PoolFactory()
    one_node(pool, 2)
    hold_two_placements_until_both_planned(hooks)
    results = [w.result for w in workers_run([attempt(gpu_request(pool, 2)) for _ in range(2)])]
    assert sum(isinstance(r, ReservationCreated) for r in results) == 1
    assert sum(isinstance(r, NoCapacity) for r in results) == 1
    assert DeviceBooking.objects.count() == 2
    assert_no_overlapping_bookings()


@pytest.mark.django_db(transaction=True)
def test_guard1_many_concurrent_creates_never_double_book() -> None:
    pool = PoolFactory()
    for _ in range(3):
        one_node(pool, 4)
    results = [w.result for w in workers_race([attempt(gpu_request(pool, 2)) for _ in range(8)])]
    assert sum(isinstance(r, ReservationCreated) for r in results) == 6  # 12 GPUs, 2 each
    assert sum(isinstance(r, NoCapacity) for r in results) == 2
    assert DeviceBooking.objects.count() == 12
    assert_no_overlapping_bookings()


# --- Guard 2: the atom rule -------------------------------------------------------------


@pytest.mark.django_db
def test_guard2_a_partitioned_parent_is_never_offered_and_a_layout_change_blocks_its_atoms() -> None:
    pool = PoolFactory(sharing="mig")
    node = NodeFactory(pool=pool)
    parent, children = partitioned_gpu(node, "GPU-parent", "gpu.mig", {f"gi{g}/ci0": {} for g in range(2)})
    now = compute_now()
    window = DateTimeTZRange(now, now + timedelta(minutes=10))
    for device in [parent, *children]:
        DeviceBooking.objects.create(device=device, allocation=None, purpose="layout-change", during=window)
    with pytest.raises(NoCapacity):
        reservation_create(request=gpu_request(pool, 1, device_class="gpu.mig"), actor="t")
    later = now + timedelta(minutes=10)
    reservation, _ = reservation_create(
        request=gpu_request(pool, 2, device_class="gpu.mig", start_ms=int(later.timestamp() * 1000) + 1000),
        actor="t",
    )
    booked = set(
        DeviceBooking.objects.filter(allocation__reservation=reservation).values_list("device_id", flat=True)
    )
    assert parent.id not in booked and booked == {c.id for c in children}


@pytest.mark.django_db
def test_guard2_whole_gpus_never_come_from_a_partitioned_gpu_in_an_exclusive_pool() -> None:
    # An exclusive pool sells whole GPUs; this node also carries a MIG-enabled one,
    # whose parent is a `gpu` device too, healthy, free and matching every selector.
    pool = PoolFactory(sharing="exclusive")
    node = NodeFactory(pool=pool)
    whole = DeviceFactory(node=node, uid="GPU-whole")
    parent, _children = partitioned_gpu(node, "GPU-partitioned", "gpu.mig", {"gi1/ci0": {}, "gi2/ci0": {}})
    with pytest.raises(NoCapacity):
        reservation_create(request=gpu_request(pool, 2), actor="t")
    reservation_create(request=gpu_request(pool, 1), actor="t")
    assert booked_device_ids() == {whole.id}
    with pytest.raises(NoCapacity):
        reservation_create(request=gpu_request(pool, 1), actor="t")
    assert not DeviceBooking.objects.filter(device=parent).exists()


@pytest.mark.django_db
def test_guard2_a_whole_node_lease_takes_the_partitions_but_never_their_parent() -> None:
    pool = PoolFactory(sharing="exclusive")
    node = NodeFactory(pool=pool)
    whole = DeviceFactory(node=node, uid="GPU-whole")
    _parent, children = partitioned_gpu(node, "GPU-partitioned", "gpu.mig", {"gi1/ci0": {}, "gi2/ci0": {}})
    node_atom = DeviceFactory(node=node, uid=node.id, device_class="node", attributes={})
    reservation, _ = reservation_create(request=gpu_request(pool, 1, binding="node"), actor="t")
    assert booked_device_ids(reservation) == {whole.id, node_atom.id, *(c.id for c in children)}


@pytest.mark.django_db(transaction=True)
def test_guard2_enabling_mig_under_a_placement_in_flight_is_refused(
    hooks: list[Callable[[str, str], None]],
) -> None:
    pool = PoolFactory(sharing="exclusive")
    node = NodeFactory(pool=pool)
    node_report_apply(node=node, report=report(node.hostname, [gpu(0)]), actor="agent")
    reached, go_on = hold_first_placement(hooks)
    placer = Worker(attempt(gpu_request(pool, 1)))
    placer.start()
    assert reached.wait(JOIN_SECONDS)

    def enable_mig() -> str:
        try:
            node_report_apply(
                node=node,
                report=report(node.hostname, [gpu(0, mig=mig("3g.40gb", "3g.40gb"))]),
                actor="agent",
            )
        except Conflict:
            return "refused"
        return "applied"

    # The placement holds the node and the GPU FOR SHARE, not yet booked: the report waits for it.
    reporter = Worker(enable_mig)
    reporter.start()
    wait_until_blocked_on_lock(reporter)
    go_on.set()
    assert isinstance(placer.finish(), ReservationCreated), placer.error
    # The layout change then finds the GPU booked and is refused whole.
    assert reporter.finish() == "refused", reporter.error
    assert Device.objects.get(uid=gpu(0)["uuid"]).bookable
    assert not Device.objects.filter(node=node, device_class="gpu.mig").exists()
    assert not DeviceBooking.objects.filter(purpose="layout-change").exists()


# --- Guard 3: guarded scalar counters ----------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_guard3_scalar_claims_never_exceed_allocatable_times_ratio_under_concurrency() -> None:
    pool = PoolFactory()
    node = one_node(pool, 8)
    NodeResourceFactory(node=node, resource="vcpu", allocatable=10)
    attempts = [attempt(gpu_request(pool, 1, resources={"vcpu": 4})) for _ in range(5)]
    results = [w.result for w in workers_race(attempts)]
    assert sum(isinstance(r, ReservationCreated) for r in results) == 2
    assert sum(isinstance(r, NoCapacity) for r in results) == 3
    assert NodeResource.objects.get(node=node).allocated == 8
    assert_no_overlapping_bookings()


# The two races below take different GPUs of one node, so the exclusion
# constraint never orders them: only the guarded UPDATE (and its CHECK) does.


@pytest.mark.django_db(transaction=True)
def test_guard3_a_placement_planned_before_another_commits_cannot_claim_the_vcpus_taken_since(
    hooks: list[Callable[[str, str], None]],
) -> None:
    pool = PoolFactory()
    node = gpus_by_bus(pool, 2, vcpu=10)
    reached, go_on = hold_first_placement(hooks)
    first = Worker(attempt(on_gpu(pool, 0, resources={"vcpu": 6})))
    first.start()
    # Planned (10 vCPUs free, so the node fit) and locked, its claim not yet made.
    assert reached.wait(JOIN_SECONDS)
    # Meanwhile another placement takes the other GPU and 6 of the 10 vCPUs, and commits.
    second = attempt(on_gpu(pool, 1, resources={"vcpu": 6}))()
    go_on.set()
    assert isinstance(second, ReservationCreated) and second.created, second
    result = first.finish()
    assert first.error is None, first.error
    # The first one's claim comes back short; replanned, the node no longer fits it.
    assert isinstance(result, NoCapacity), result
    assert NodeResource.objects.get(node=node).allocated == 6
    assert booked_device_ids() == {Device.objects.get(uid=f"GPU-{node.id}-1").id}


@pytest.mark.django_db(transaction=True)
def test_guard3_a_claim_that_waited_for_another_claims_row_lock_rechecks_the_limit() -> None:
    pool = PoolFactory()
    node = gpus_by_bus(pool, 2, vcpu=10)
    QuotaUsageFactory(pool=pool, tenant=pool.owner, resource="gpu", max=8)
    # Holding the quota row stops the first placement just after its scalar claim,
    # whose row lock it then holds, uncommitted.
    gate, open_gate = rows_held(lambda: list(QuotaUsage.objects.select_for_update().filter(pool=pool)))
    first = Worker(attempt(on_gpu(pool, 0, resources={"vcpu": 6})))
    first.start()
    wait_until_blocked_on_lock(first)
    assert "quota_usage" in waiting_statement(first)
    # The second planned while the first's claim was invisible (0 of 10 vCPUs taken)
    # and now books the other GPU, which waits for the node's kept counts row (the
    # first's booking insert updated it): its claim comes after the first commits.
    second = Worker(attempt(on_gpu(pool, 1, resources={"vcpu": 6})))
    second.start()
    wait_until_blocked_on_lock(second)
    assert "INSERT INTO device_bookings" in waiting_statement(second)
    open_gate.set()
    gate.join_ok()
    assert isinstance(first.finish(), ReservationCreated), first.error
    result = second.finish()
    assert second.error is None, second.error
    # Its UPDATE re-read the row the first committed (6 of 10): 0 rows, a lost race, no capacity.
    assert isinstance(result, NoCapacity), result
    assert NodeResource.objects.get(node=node).allocated == 6
    assert QuotaUsage.objects.get(pool=pool).used == 1
    assert booked_device_ids() == {Device.objects.get(uid=f"GPU-{node.id}-0").id}


# --- Guard 4: linearizable eligibility ----------------------------------------------------


def _cordon(node: Node) -> None:
    Node.objects.filter(pk=node.pk).update(cordoned=True, cordon_reason="test")


def _taint(node: Node) -> None:
    Node.objects.filter(pk=node.pk).update(noschedule_taints=1)


def _maintenance(node: Node) -> None:
    Node.objects.filter(pk=node.pk).update(maintenance=True)


def _unhealthy(node: Node) -> None:
    Device.objects.filter(node=node).update(healthy=False)


def _disconnect(node: Node) -> None:
    Node.objects.filter(pk=node.pk).update(connectivity="disconnected")


FLIPS = {
    "cordon": _cordon,
    "taint": _taint,
    "maintenance": _maintenance,
    "health": _unhealthy,
    "liveness": _disconnect,
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("flip", sorted(FLIPS))
def test_guard4_a_flip_that_commits_first_is_seen_by_the_placement(flip: str) -> None:
    pool = PoolFactory()
    node = one_node(pool, 2)
    flipped = threading.Event()
    go_commit = gate()

    def operator() -> None:
        with transaction.atomic():
            FLIPS[flip](node)
            flipped.set()
            assert go_commit.wait(JOIN_SECONDS)

    op = Worker(operator)
    op.start()
    assert flipped.wait(JOIN_SECONDS)
    # The placement plans on the old snapshot (the flip is not committed yet),
    # then its FOR SHARE lock waits for the operator's row lock.
    placer = Worker(attempt(gpu_request(pool, 1)))
    placer.start()
    wait_until_blocked_on_lock(placer)
    go_commit.set()
    op.finish()
    assert op.error is None
    result = placer.finish()
    # Re-checked under the lock, the node (or atom) is no longer eligible: no booking.
    assert isinstance(result, NoCapacity), result
    assert DeviceBooking.objects.count() == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("flip", sorted(FLIPS))
def test_guard4_a_flip_that_commits_second_sees_the_placement(
    flip: str, hooks: list[Callable[[str, str], None]]
) -> None:
    pool = PoolFactory()
    node = one_node(pool, 2)
    locked = threading.Event()
    go_on = gate()

    def hold(point: str, node_id: str) -> None:
        if point == "after_locks":
            locked.set()
            assert go_on.wait(JOIN_SECONDS)

    hooks.append(hold)
    placer = Worker(attempt(gpu_request(pool, 1)))
    placer.start()
    assert locked.wait(JOIN_SECONDS)
    hooks.clear()
    seen_by_operator: dict[str, int] = {}

    def operator() -> None:
        with transaction.atomic():
            FLIPS[flip](node)  # waits for the placement's FOR SHARE lock
            seen_by_operator["bookings"] = DeviceBooking.objects.filter(device__node=node).count()

    op = Worker(operator)
    op.start()
    wait_until_blocked_on_lock(op)
    go_on.set()
    result = placer.finish()
    assert isinstance(result, ReservationCreated) and result.created, result
    op.finish()
    assert op.error is None
    # The operator's write committed second and saw the booking made first.
    assert seen_by_operator["bookings"] == 1


# --- Guard 5: quota ----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_guard5_quota_is_never_exceeded_under_concurrency() -> None:
    pool = PoolFactory()
    one_node(pool, 8)
    QuotaUsageFactory(pool=pool, tenant=pool.owner, resource="gpu", max=3)
    results = [w.result for w in workers_race([attempt(gpu_request(pool, 1)) for _ in range(5)])]
    assert sum(isinstance(r, ReservationCreated) for r in results) == 3
    assert sum(isinstance(r, QuotaExceeded) for r in results) == 2
    assert QuotaUsage.objects.get(pool=pool).used == 3
    assert DeviceBooking.objects.count() == 3
    assert_no_overlapping_bookings()


@pytest.mark.django_db(transaction=True)
def test_guard5_a_charge_that_waited_for_another_charges_row_lock_rechecks_the_limit() -> None:
    pool = PoolFactory()
    # One GPU on each of two nodes, so the two placements share no atom and no node.
    gpus_by_bus(pool, 1)
    gpus_by_bus(pool, 1, first_bus=1)
    QuotaUsageFactory(pool=pool, tenant=pool.owner, resource="gpu", max=1)
    rollup_rebuild(pool_id=pool.id)
    # Holding the pool's rollup rows stops the first placement just after its quota
    # charge (the rollup deltas come next), whose row lock it then holds, uncommitted.
    gate, open_gate = rows_held(
        lambda: list(PoolCapacityRollup.objects.select_for_update().filter(pool=pool))
    )
    first = Worker(attempt(on_gpu(pool, 0)))
    first.start()
    wait_until_blocked_on_lock(first)
    assert "pool_capacity_rollup" in waiting_statement(first)
    # The second booked the other node's GPU (no atom or node to queue on) and now waits for
    # the quota row.
    second = Worker(attempt(on_gpu(pool, 1)))
    second.start()
    wait_until_blocked_on_lock(second)
    assert "quota_usage" in waiting_statement(second)
    open_gate.set()
    gate.join_ok()
    assert isinstance(first.finish(), ReservationCreated), first.error
    result = second.finish()
    assert second.error is None, second.error
    # Its guarded UPDATE re-read the row the first committed (1 of 1): refused.
    assert isinstance(result, QuotaExceeded), result
    assert QuotaUsage.objects.get(pool=pool).used == 1
    assert DeviceBooking.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_guard5_a_concurrent_charge_that_waited_for_the_row_lock_sees_the_first_ones_bookings() -> None:
    """The concurrent quota's race: two overlapping windows, each within the limit alone, not together.

    The second's bookings were inserted while the first held the quota row,
    uncommitted; its peak, read only after it got the lock, must see the
    first's committed bookings (a peak read in the locking statement's
    snapshot would not) and refuse.
    """
    pool = PoolFactory()
    gpus_by_bus(pool, 1)
    gpus_by_bus(pool, 1, first_bus=1)
    QuotaUsageFactory(pool=pool, tenant=pool.owner, resource="gpu", max=1, mode="concurrent")
    rollup_rebuild(pool_id=pool.id)
    later = int((compute_now() + timedelta(minutes=30)).timestamp() * 1000)
    gate, open_gate = rows_held(
        lambda: list(PoolCapacityRollup.objects.select_for_update().filter(pool=pool))
    )
    first = Worker(attempt(on_gpu(pool, 0)))
    first.start()
    wait_until_blocked_on_lock(first)
    assert "pool_capacity_rollup" in waiting_statement(first)
    # Starts half an hour into the first's hour: they overlap, on two different GPUs.
    second = Worker(attempt(on_gpu(pool, 1, start_ms=later)))
    second.start()
    wait_until_blocked_on_lock(second)
    assert "quota_usage" in waiting_statement(second)
    open_gate.set()
    gate.join_ok()
    assert isinstance(first.finish(), ReservationCreated), first.error
    result = second.finish()
    assert second.error is None, second.error
    assert isinstance(result, QuotaExceeded), result
    assert result.details == [{"field": "quota", "resource": "gpu", "used": 1, "max": 1, "asked": 1}]
    assert QuotaUsage.objects.get(pool=pool).used == 1
    assert DeviceBooking.objects.count() == 1


@pytest.mark.django_db
def test_guard5_no_quota_row_means_unlimited() -> None:
    pool = PoolFactory()
    one_node(pool, 4)
    reservation_create(request=gpu_request(pool, 4), actor="t")
    assert not QuotaUsage.objects.exists()


def quota_used(pool: Pool) -> dict[str, int]:
    return dict(QuotaUsage.objects.filter(pool=pool).values_list("resource", "used"))


@pytest.mark.django_db
def test_guard5_a_release_gives_back_what_the_create_charged_once() -> None:
    pool = PoolFactory()
    node = one_node(pool, 4)
    NodeResourceFactory(node=node, resource="vcpu", allocatable=16)
    QuotaUsageFactory(pool=pool, tenant=pool.owner, resource="gpu", max=2)
    QuotaUsageFactory(pool=pool, tenant=pool.owner, resource="vcpu", max=8)
    first, _ = reservation_create(request=gpu_request(pool, 2, resources={"vcpu": 8}), actor="t")
    assert quota_used(pool) == {"gpu": 2, "vcpu": 8}
    with pytest.raises(QuotaExceeded):
        reservation_create(request=gpu_request(pool, 1), actor="t")
    reservation_release(reservation=first, actor="t")
    assert quota_used(pool) == {"gpu": 0, "vcpu": 0}
    # What was given back can be charged again, and a second release of the first gives nothing more.
    reservation_create(request=gpu_request(pool, 2, resources={"vcpu": 8}), actor="t")
    assert quota_used(pool) == {"gpu": 2, "vcpu": 8}
    reservation_release(reservation=first, actor="t")
    assert quota_used(pool) == {"gpu": 2, "vcpu": 8}


# --- Guard 6: the node refuses an overlapping assignment ---------------------------------


@pytest.mark.django_db(transaction=True)
def test_guard6_the_fake_daemon_refuses_a_forged_overlap_and_the_reservation_is_released() -> None:
    pool = PoolFactory()
    node = one_node(pool, 1)
    device = Device.objects.get(node=node)
    now = compute_now()
    # The node already believes it runs something on this GPU (a forged, stale assignment).
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO fake_daemon_assignments"
            " (node_id, device_uid, reservation_id, allocation_id, starts_at, ends_at)"
            " VALUES (%s, %s, 'rsv_forged', 'alloc_forged', %s, %s)",
            [node.id, device.uid, now - timedelta(hours=1), now + timedelta(days=1)],
        )
    reservation, created = reservation_create(request=gpu_request(pool, 1), actor="t")
    assert created
    reservation.refresh_from_db()
    assert reservation.state == "released"
    assert reservation.release_reason.startswith("AllocationFailed")
    holders = {holder for holder, _, _ in daemon_holdings(device_uid=device.uid)}
    assert holders == {"rsv_forged"}


@pytest.mark.django_db(transaction=True)
def test_guard6_the_daemon_accepts_what_the_database_accepted() -> None:
    pool = PoolFactory()
    node = one_node(pool, 2)
    reservation, _ = reservation_create(request=gpu_request(pool, 2), actor="t")
    reservation.refresh_from_db()
    assert reservation.state == "active"
    for device in Device.objects.filter(node=node):
        assert [holder for holder, _, _ in daemon_holdings(device_uid=device.uid)] == [reservation.id]


@pytest.mark.django_db(transaction=True)
def test_guard6_the_fake_daemon_refuses_claims_beyond_its_capacity_and_the_reservation_is_released() -> None:
    from reservations.delivery.daemon import daemon_claims

    pool = PoolFactory()
    node = one_node(pool, 2)
    NodeResourceFactory(node=node, resource="vcpu", allocatable=16)
    now = compute_now()
    # The node knows better: it holds a claim the control plane never made (a forged, stale one).
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO fake_daemon_claims"
            " (node_id, reservation_id, allocation_id, resources, node_profile, starts_at, ends_at)"
            " VALUES (%s, 'rsv_forged', %s, '{\"vcpu\": 12}', NULL, %s, %s)",
            [node.id, f"alloc_forged_{node.id}", now - timedelta(hours=1), now + timedelta(days=1)],
        )
    # The control plane sees 16 vCPUs free and books 8; the node has 4 left and refuses.
    reservation, created = reservation_create(request=gpu_request(pool, 1, resources={"vcpu": 8}), actor="t")
    assert created
    reservation.refresh_from_db()
    assert reservation.state == "released"
    assert reservation.release_reason.startswith("AllocationFailed: vcpu on ")
    assert "rsv_forged" in reservation.release_reason
    # The refusal left no trace on the node, and the release gave back the scalars it claimed.
    assert daemon_claims(reservation_id=reservation.pk) == []
    assert all(daemon_holdings(device_uid=d.uid) == [] for d in Device.objects.filter(node=node))
    assert NodeResource.objects.get(node=node, resource="vcpu").allocated == 0
    # What fits beside the forged claim is accepted.
    fits, _ = reservation_create(request=gpu_request(pool, 1, resources={"vcpu": 4}), actor="t")
    assert Reservation.objects.get(pk=fits.pk).state == "active"
    assert [claims.resources for claims in daemon_claims(reservation_id=fits.pk)] == [{"vcpu": 4}]


# --- Idempotency under a race ------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_two_identical_creates_racing_make_one_reservation() -> None:
    pool = PoolFactory()
    one_node(pool, 8)
    request = gpu_request(pool, 1, idempotency_key="race")
    workers = workers_race([lambda: reservation_create(request=request, actor="t")] * 2)
    assert all(w.error is None for w in workers), [w.error for w in workers]
    results = [w.result for w in workers]
    assert len({r.reservation.pk for r in results}) == 1
    assert sorted(r.created for r in results) == [False, True]
    assert Reservation.objects.count() == 1 and DeviceBooking.objects.count() == 1


# --- Everything at once: invariants after a concurrent mix -------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_concurrent_mix_of_creates_and_releases_keeps_every_invariant() -> None:
    import random

    from ledger.models import PoolCapacityRollup
    from reservations.rollups.recount import rollup_rebuild
    from reservations.services import reservation_release

    pool = PoolFactory()
    for _ in range(3):
        node = one_node(pool, 4)
        NodeResourceFactory(node=node, resource="vcpu", allocatable=12)
    QuotaUsageFactory(pool=pool, tenant=pool.owner, resource="gpu", max=9)
    later = int((compute_now() + timedelta(hours=2)).timestamp() * 1000)

    def client(seed: int) -> None:
        rng = random.Random(seed)  # a fixed mix per worker
        mine: list[Reservation] = []
        for _ in range(12):
            if mine and rng.random() < 0.4:
                reservation_release(reservation=mine.pop(rng.randrange(len(mine))), actor="mix")
                continue
            fields: dict[str, Any] = {"resources": {"vcpu": rng.choice([0, 2, 4])}}
            if rng.random() < 0.3:
                fields["start_ms"] = later
            result = attempt(gpu_request(pool, rng.choice([1, 2, 3]), **fields))()
            if isinstance(result, ReservationCreated):
                mine.append(result.reservation)

    for worker in workers_race([lambda seed=seed: client(seed) for seed in range(4)]):
        assert worker.error is None, worker.error

    assert_no_overlapping_bookings()
    live = Reservation.objects.filter(state__in=["active", "scheduled"])
    # Guard 3: each node's claimed scalars are exactly its live allocations' claims.
    for node_resource in NodeResource.objects.all():
        claimed = sum(
            int(a.resources.get("vcpu", 0))
            for r in live
            for a in r.allocations.filter(node_id=node_resource.node_id)
        )
        assert node_resource.allocated == claimed
    # Guard 5: the quota counts exactly the live reservations' GPUs.
    used = QuotaUsage.objects.get(pool=pool).used
    assert used == DeviceBooking.objects.filter(allocation__reservation__in=live).count() <= 9
    # The booking-transaction deltas agree with a rebuild from scratch.
    before = {r.resource: (r.allocated, r.reserved) for r in PoolCapacityRollup.objects.filter(pool=pool)}
    rollup_rebuild(pool_id=pool.id)
    after = {r.resource: (r.allocated, r.reserved) for r in PoolCapacityRollup.objects.filter(pool=pool)}
    for resource in ("gpu", "vcpu"):
        assert before.get(resource, (0, 0)) == after.get(resource, (0, 0)), resource


@pytest.mark.django_db(transaction=True)
def test_guard6_a_delivery_lost_after_commit_is_delivered_from_the_outbox(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from core.clock import set_clock_offset
    from reservations import services
    from reservations.delivery.daemon import daemon_behind
    from reservations.delivery.outbox import outbox_deliver_due
    from reservations.models import Delivery

    def unreachable(**_: Any) -> None:
        raise ConnectionError("the node did not answer")

    pool = PoolFactory()
    node = one_node(pool, 2)
    monkeypatch.setattr(services, "daemon_deliver", unreachable)
    reservation, _ = reservation_create(request=gpu_request(pool, 2), actor="t")
    uids = list(Device.objects.filter(node=node).values_list("uid", flat=True))
    assert all(daemon_holdings(device_uid=uid) == [] for uid in uids)
    assert Delivery.objects.filter(reservation=reservation, kind="assign", attempts=1).exists()
    monkeypatch.undo()
    set_clock_offset(timedelta(seconds=5))  # past the retry's backoff
    try:
        assert outbox_deliver_due() == 1
        assert outbox_deliver_due() == 0  # a second pass finds nothing left to deliver
    finally:
        set_clock_offset(timedelta(0))
    for uid in uids:
        assert [holder for holder, _, _ in daemon_holdings(device_uid=uid)] == [reservation.id]
    assert reservation.pk not in daemon_behind()


@pytest.mark.django_db(transaction=True)
def test_guard6_a_node_that_lost_its_record_is_resynced_on_demand() -> None:
    from reservations.delivery.daemon import daemon_behind, daemon_claims
    from reservations.services import reservations_redeliver

    pool = PoolFactory()
    node = one_node(pool, 2)
    NodeResourceFactory(node=node, resource="vcpu", allocatable=8)
    reservation, _ = reservation_create(request=gpu_request(pool, 2, resources={"vcpu": 4}), actor="t")
    with connection.cursor() as cursor:
        for table in ("fake_daemon_assignments", "fake_daemon_claims"):
            cursor.execute(f"DELETE FROM {table} WHERE reservation_id = %s", [reservation.pk])
    assert reservation.pk in daemon_behind()
    assert reservations_redeliver() >= 1
    assert reservation.pk not in daemon_behind()
    for device in Device.objects.filter(node=node):
        assert [holder for holder, _, _ in daemon_holdings(device_uid=device.uid)] == [reservation.id]
    assert [claims.resources for claims in daemon_claims(reservation_id=reservation.pk)] == [{"vcpu": 4}]
