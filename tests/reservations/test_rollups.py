"""Rollups: the rebuild's capacity math, the summary, the race with a booking, and the fleet rebuild.

(Deltas: `test_rollup_deltas.py`; the reconciler: `tests/worker/test_reconciler.py`;
the commands: `tests/capacity/test_commands.py`.)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import IntegrityError, connection, transaction

from capacity.selectors.pools import capacity_summary, rollup_rows
from core.clock import compute_now, set_clock_offset
from inventory.models import Device, Pool
from reservations.models import BookingPhase, DeviceBooking, PoolCapacityRollup
from reservations.rollups import recount as rollups
from reservations.rollups.deltas import rollup_apply_count_deltas, rollup_apply_delta
from reservations.rollups.recount import rollup_rebuild, rollup_rebuild_all, rollup_recount
from tests.support.clock import HOUR
from tests.support.factories import (
    AllocationFactory,
    DeviceFactory,
    NodeFactory,
    NodeResourceFactory,
    OfferingFactory,
    PoolFactory,
    TenantFactory,
    gpus,
)
from tests.support.records import BUCKET_FIELDS, COUNTED, book, row, snapshot, snapshot_after_rebuild
from tests.support.threads import Worker, started_until_blocked, transaction_held_open

# Capacity math ---------------------------------------------------------


@pytest.mark.django_db
def test_scalars_count_the_floor_of_allocatable_times_ratio() -> None:
    pool = PoolFactory.create()
    first, second = NodeFactory.create(pool=pool), NodeFactory.create(pool=pool)
    NodeResourceFactory.create(node=first, resource="vcpu", allocatable=7, ratio=Decimal("1.5"), allocated=3)
    NodeResourceFactory.create(node=second, resource="vcpu", allocatable=5, ratio=Decimal("2.3"), allocated=2)
    NodeResourceFactory.create(node=first, resource="memoryGiB", allocatable=10, ratio=Decimal("1.0"))
    cordoned = NodeFactory.create(pool=pool, cordoned=True)
    NodeResourceFactory.create(
        node=cordoned, resource="vcpu", allocatable=3, ratio=Decimal("1.5"), allocated=1
    )

    rollup_rebuild(pool_id=pool.id)

    vcpu = row(pool, "vcpu")
    # Allocatable: floor(7 * 1.5) + floor(5 * 2.3) = 10 + 11; not floor(10.5 + 11.5) = 22.
    # Maintenance: the cordoned node's floor(3 * 1.5) sits in its bucket, its claim outside the row.
    counts = (vcpu.allocatable, vcpu.allocated, vcpu.reserved, vcpu.available, vcpu.maintenance, vcpu.total)
    assert counts == (21, 5, 0, 16, 4, 25)
    assert row(pool, "memoryGiB").allocatable == 10


@pytest.mark.django_db
def test_gpus_are_never_overcommitted() -> None:
    pool = PoolFactory.create()
    node = NodeFactory.create(pool=pool)
    # A generous vcpu ratio on the node does not stretch its GPUs.
    NodeResourceFactory.create(node=node, resource="vcpu", allocatable=8, ratio=Decimal("4.0"))
    devices = gpus(node, 2)
    book(devices[0], -HOUR, HOUR)
    with pytest.raises(IntegrityError), transaction.atomic():
        book(devices[0], timedelta(minutes=-5), HOUR)

    rollup_rebuild(pool_id=pool.id)

    gpu = row(pool)
    assert (gpu.allocatable, gpu.allocated, gpu.available) == (2, 1, 1)
    assert row(pool, "vcpu").allocatable == 32


@pytest.mark.django_db
def test_total_is_allocatable_plus_the_four_buckets_in_every_row() -> None:
    pool = PoolFactory.create()
    healthy = NodeFactory.create(pool=pool)
    gpus(healthy, 3)
    gpus(healthy, 1, healthy=False)
    DeviceFactory.create(
        node=healthy, device_class="nic.vf", uid=f"{healthy.hostname}/0000:3b:00.2", attributes={}
    )
    NodeResourceFactory.create(node=healthy, resource="vcpu", allocatable=64)
    gpus(NodeFactory.create(pool=pool, maintenance=True), 2)
    gpus(NodeFactory.create(pool=pool, connectivity="disconnected"), 2)
    gpus(NodeFactory.create(pool=pool, provision_state="deploying"), 2)
    gpus(NodeFactory.create(pool=pool, noschedule_taints=1), 2)
    gpus(NodeFactory.create(pool=pool, role="controller"), 2)

    rows = rollup_rebuild(pool_id=pool.id)

    assert {r.resource for r in rows} == {"gpu", "nic.vf", "vcpu"}
    for r in rows:
        assert r.total == r.allocatable + r.provisioning + r.unhealthy + r.maintenance + r.unreachable
    gpu = row(pool)
    assert (gpu.allocatable, gpu.maintenance, gpu.unreachable, gpu.provisioning, gpu.unhealthy) == (
        3,
        2,
        2,
        2,
        3,
    )
    assert gpu.total == 12  # the controller's two GPUs are excluded


@pytest.mark.django_db
def test_every_pool_gets_a_gpu_row_and_rows_of_resources_it_lost_go() -> None:
    empty = PoolFactory.create(gpu_model="")
    pool = PoolFactory.create()
    node = NodeFactory.create(pool=pool)
    mig = DeviceFactory.create(node=node, device_class="gpu.mig", attributes={"migProfile": "3g.40gb"})

    assert rollup_rebuild_all() >= 2
    assert [r.resource for r in rollup_rebuild(pool_id=empty.id)] == ["gpu"]
    assert row(empty).total == 0
    assert {r.resource for r in PoolCapacityRollup.objects.filter(pool=pool)} == {"gpu", "gpu.mig"}

    Device.objects.filter(pk=mig.pk).update(bookable=False)
    assert [r.resource for r in rollup_rebuild(pool_id=pool.id)] == ["gpu"]


@pytest.mark.django_db
def test_moving_the_clock_moves_a_future_booking_from_reserved_to_allocated() -> None:
    pool = PoolFactory.create()
    (device,) = gpus(NodeFactory.create(pool=pool), 1)
    book(device, 2 * HOUR, 3 * HOUR)

    rollup_rebuild(pool_id=pool.id)
    assert (row(pool).allocated, row(pool).reserved) == (0, 1)

    set_clock_offset(timedelta(hours=2, minutes=30))
    # The rows do not move on their own: the booking's phase moves first (the worker's
    # `bookings_advance`, which a rebuild also runs before it counts).
    assert (row(pool).allocated, row(pool).reserved) == (0, 1)
    rollup_rebuild(pool_id=pool.id)
    assert (row(pool).allocated, row(pool).reserved) == (1, 0)

    set_clock_offset(timedelta(hours=4))
    rollup_rebuild(pool_id=pool.id)
    assert (row(pool).allocated, row(pool).reserved, row(pool).available) == (0, 0, 1)


@pytest.mark.django_db
def test_the_recount_counts_phases_not_the_clock_and_the_rebuild_catches_the_phases_up_first() -> None:
    pool = PoolFactory.create()
    (device,) = gpus(NodeFactory.create(pool=pool), 1)
    book(device, HOUR, 2 * HOUR)
    rollup_rebuild(pool_id=pool.id)
    set_clock_offset(timedelta(minutes=90))

    # Behind the clock, the recount agrees with the rows (both say reserved)...
    assert rollup_recount(pool_ids=[pool.id])[(pool.id, "gpu")]["reserved"] == row(pool).reserved == 1
    # ...and a rebuild moves the phase first, with its delta, then counts.
    rollup_rebuild(pool_id=pool.id)
    assert DeviceBooking.objects.get(device=device).phase == BookingPhase.RUNNING
    assert rollup_recount(pool_ids=[pool.id])[(pool.id, "gpu")] == {
        "allocatable": 1,
        "allocated": 1,
        "reserved": 0,
        "provisioning": 0,
        "unhealthy": 0,
        "maintenance": 0,
        "unreachable": 0,
    }
    assert (row(pool).allocated, row(pool).reserved) == (1, 0)


@pytest.mark.django_db
def test_count_deltas_keep_total_the_sum_create_rows_and_never_go_below_zero() -> None:
    pool = PoolFactory.create()
    rollup_apply_count_deltas(deltas={(pool.id, "gpu"): {"allocatable": 4, "maintenance": 2, "allocated": 1}})
    gpu = row(pool)
    assert (gpu.total, gpu.allocatable, gpu.maintenance, gpu.allocated, gpu.available) == (6, 4, 2, 1, 3)

    # A cordon: four atoms from allocatable to maintenance, their booking out of the count.
    rollup_apply_count_deltas(
        deltas={
            (pool.id, "gpu"): {"allocatable": -4, "maintenance": 4, "allocated": -1},
            (pool.id, "vcpu"): {},  # only makes sure the row exists
        }
    )
    gpu = row(pool)
    assert (gpu.total, gpu.allocatable, gpu.maintenance, gpu.allocated) == (6, 0, 6, 0)
    assert row(pool, "vcpu").total == 0

    rollup_apply_count_deltas(deltas={(pool.id, "gpu"): {"unhealthy": -3, "maintenance": -7}})
    gpu = row(pool)
    assert (gpu.total, gpu.unhealthy, gpu.maintenance) == (0, 0, 0)


@pytest.mark.django_db
def test_an_atom_booked_now_and_later_counts_in_both_allocated_and_reserved() -> None:
    pool = PoolFactory.create()
    first, second = gpus(NodeFactory.create(pool=pool), 2)
    book(first, -HOUR, HOUR)
    book(first, 2 * HOUR, 3 * HOUR)
    book(first, 4 * HOUR, 5 * HOUR)  # reserved counts bookings (the seeds' math): this one too
    book(second, -3 * HOUR, -2 * HOUR)  # over: neither

    rollup_rebuild(pool_id=pool.id)

    gpu = row(pool)
    assert (gpu.allocatable, gpu.allocated, gpu.reserved, gpu.available) == (2, 1, 2, 0)


@pytest.mark.django_db
def test_bookings_on_atoms_outside_allocatable_are_not_counted() -> None:
    pool = PoolFactory.create()
    node = NodeFactory.create(pool=pool)
    sick, well = gpus(node, 2)
    book(sick, -HOUR, HOUR)
    book(well, -HOUR, HOUR)
    Device.objects.filter(pk=sick.pk).update(healthy=False)

    rollup_rebuild(pool_id=pool.id)

    gpu = row(pool)
    assert (gpu.allocatable, gpu.unhealthy, gpu.allocated, gpu.available) == (1, 1, 1, 0)


# The summary -------------------------------------------------------------


@pytest.mark.django_db
def test_by_gpu_model_sums_only_gpu_rows_and_puts_pools_without_a_model_under_other(
    django_assert_max_num_queries: Callable[[int], AbstractContextManager[object]],
) -> None:
    acme, beta = TenantFactory.create(id="acme"), TenantFactory.create(id="beta")
    h100_a = PoolFactory.create(owner=acme, gpu_model="H100", name="h100-a")
    h100_b = PoolFactory.create(owner=beta, gpu_model="H100", name="h100-b")
    OfferingFactory.create(pool=h100_b, tenant=acme)
    plain = PoolFactory.create(owner=acme, gpu_model="", name="plain")
    hidden = PoolFactory.create(owner=beta, gpu_model="H100", name="not-offered")
    for pool, count in ((h100_a, 2), (h100_b, 3), (plain, 1), (hidden, 5)):
        node = NodeFactory.create(pool=pool)
        gpus(node, count)
        NodeResourceFactory.create(node=node, resource="vcpu", allocatable=100)
        DeviceFactory.create(node=node, device_class="gpu.mig", attributes={})
    book(Device.objects.filter(node__pool=h100_b, device_class="gpu")[0], -HOUR, HOUR)
    rollup_rebuild_all()

    with django_assert_max_num_queries(3):
        summary = capacity_summary(tenant_id="acme")

    assert [p["name"] for p in summary["pools"]] == ["h100-a", "h100-b", "plain"]
    offered = {p["name"]: p["offered"] for p in summary["pools"]}
    assert offered == {"h100-a": False, "h100-b": True, "plain": False}
    assert summary["byGpuModel"]["H100"] == {
        "total": 5,
        "allocatable": 5,
        "allocated": 1,
        "reserved": 0,
        "available": 4,
    }
    assert summary["byGpuModel"]["other"] == {
        "total": 1,
        "allocatable": 1,
        "allocated": 0,
        "reserved": 0,
        "available": 1,
    }
    plain_rows = next(p for p in summary["pools"] if p["name"] == "plain")["capacity"]
    assert [r["resource"] for r in plain_rows] == ["gpu", "gpu.mig", "vcpu"]
    first = plain_rows[0]
    assert set(first) == {"poolId", "resource", *COUNTED, *BUCKET_FIELDS, "updatedAt"}
    assert isinstance(first["updatedAt"], int)
    assert rollup_rows(pool_id=plain.id) == plain_rows


@pytest.mark.django_db
def test_archived_pools_appear_only_for_their_owner() -> None:
    acme, beta = TenantFactory.create(id="acme"), TenantFactory.create(id="beta")
    archived = PoolFactory.create(owner=acme, name="old", archived_at=compute_now())
    OfferingFactory.create(pool=archived, tenant=beta)
    rollup_rebuild_all()
    assert [p["archived"] for p in capacity_summary(tenant_id="acme")["pools"]] == [True]
    assert capacity_summary(tenant_id="beta")["pools"] == []


# The race between a booking and a rebuild -----------------------------------


def rebuild_quietly(pool: Pool) -> None:
    rollup_rebuild(pool_id=pool.id)


@pytest.fixture
def race_pool() -> Iterator[tuple[Pool, Device]]:
    pool = PoolFactory.create()
    (device,) = gpus(NodeFactory.create(pool=pool), 1)
    rollup_rebuild(pool_id=pool.id)
    yield pool, device


def book_from_now(device: Device) -> None:
    """A booking transaction's writes: the GPU booked from now for an hour, then the rollup delta."""
    allocation = AllocationFactory.create(node=device.node, reservation__pool=device.node.pool)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO device_bookings (device_id, allocation_id, purpose, during)"
            " VALUES (%s, %s, 'allocation',"
            " tstzrange(compute_now(), compute_now() + interval '1 hour'))",
            [device.id, allocation.id],
        )
    rollup_apply_delta(pool_id=device.node.pool_id, resource="gpu", allocated=1)


def booked_and_committed(device: Device) -> Callable[[], None]:
    """`book_from_now` in a transaction of its own, committed at once."""

    def run() -> None:
        with transaction.atomic():
            book_from_now(device)

    return run


@pytest.mark.django_db(transaction=True)
def test_a_booking_that_locks_first_is_counted_once_by_a_racing_rebuild(
    race_pool: tuple[Pool, Device],
) -> None:
    pool, device = race_pool
    booking, commit = transaction_held_open(lambda: book_from_now(device))
    # The rebuild waits on the row the uncommitted booking updated...
    rebuild = started_until_blocked(lambda: rebuild_quietly(pool))
    commit.set()
    booking.join_ok()
    rebuild.join_ok()
    # ...and, counting after the lock, sees the booking: once, not zero or twice.
    assert row(pool).allocated == 1
    assert snapshot([pool.id]) == snapshot_after_rebuild(pool)


@pytest.mark.django_db(transaction=True)
def test_a_booking_that_comes_after_the_rebuild_locked_is_counted_once(
    race_pool: tuple[Pool, Device], monkeypatch: pytest.MonkeyPatch
) -> None:
    pool, device = race_pool
    locked, resume = threading.Event(), threading.Event()

    def pause_after_lock() -> None:
        locked.set()
        assert resume.wait(30)

    monkeypatch.setattr(rollups, "_after_lock", pause_after_lock)
    rebuild = Worker(lambda: rebuild_quietly(pool))
    rebuild.start()
    assert locked.wait(30)
    # The booking's delta waits for the rebuild's row lock; the rebuild then
    # counts without the uncommitted booking, and the delta adds it after.
    booking = started_until_blocked(booked_and_committed(device))
    resume.set()
    rebuild.join_ok()
    booking.join_ok()
    monkeypatch.setattr(rollups, "_after_lock", lambda: None)
    assert row(pool).allocated == 1
    assert snapshot([pool.id]) == snapshot_after_rebuild(pool)


@pytest.mark.django_db
def test_the_fleet_rebuild_and_the_one_pool_rebuild_count_alike() -> None:
    """`rollup_rebuild_all` hashes the fleet's live bookings; `rollup_rebuild` probes per atom."""
    pools = [PoolFactory.create() for _ in range(3)]
    for index, pool in enumerate(pools):
        node = NodeFactory.create(pool=pool, cordoned=index == 1)
        NodeResourceFactory.create(node=node, resource="vcpu", allocatable=10 + index, allocated=index)
        devices = gpus(node, 3)
        gpus(NodeFactory.create(pool=pool, connectivity="unknown"), 1)
        book(devices[0], -HOUR, HOUR)
        book(devices[1], HOUR, 2 * HOUR)
        book(devices[1], -2 * HOUR, -HOUR)
    ids = [pool.id for pool in pools]

    rollup_rebuild_all()
    fleet = snapshot(ids)
    for pool in pools:
        rollup_rebuild(pool_id=pool.id)
    assert snapshot(ids) == fleet
    assert (row(pools[0]).allocated, row(pools[0]).reserved, row(pools[0]).unreachable) == (1, 1, 1)
    assert (row(pools[1]).allocatable, row(pools[1]).maintenance, row(pools[1]).allocated) == (0, 3, 0)
