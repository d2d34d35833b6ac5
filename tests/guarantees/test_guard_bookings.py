"""Guards 1 and 2, attacked with real connections in threads: device-time exclusivity and the atom rule.

The races are held with the commit hooks and gates of `tests.support.races`.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange

from core.clock import compute_now
from core.errors import Conflict, NoCapacity
from inventory.models import Device, Node, Pool
from reservations.models import DeviceBooking, Reservation
from reservations.nodes.reports import node_report_apply
from reservations.services import ReservationCreated, reservation_create
from tests.support.factories import (
    DeviceFactory,
    NodeFactory,
    PoolFactory,
    partitioned_gpu,
)
from tests.support.placement import gpu_request
from tests.support.races import (
    Hooks,
    assert_no_overlapping_bookings,
    attempt,
    booked_device_ids,
    hold_two_placements_until_both_planned,
    one_node,
    placement_held_after_its_locks,
)
from tests.support.records import assert_an_overlapping_booking_is_refused
from tests.support.reports import gpu, mig, report
from tests.support.threads import started_until_blocked, workers_race, workers_run

# --- Guard 1: device-time exclusivity ---------------------------------------------


@pytest.mark.django_db
def test_guard1_the_database_refuses_a_forged_overlapping_booking() -> None:
    now = compute_now()
    assert_an_overlapping_booking_is_refused(
        DateTimeTZRange(now, now + timedelta(hours=1)),
        DateTimeTZRange(now + timedelta(minutes=30), now + timedelta(hours=2)),
    )


@pytest.mark.django_db(transaction=True)
def test_guard1_two_placements_racing_for_the_last_atoms_one_wins_the_other_replans(hooks: Hooks) -> None:
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
def test_guard1_the_loser_gets_no_capacity_when_nothing_is_left(hooks: Hooks) -> None:
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


def an_exclusive_node_with_a_partitioned_gpu() -> tuple[Pool, Node, Device, Device, list[Device]]:
    """A node of an exclusive pool with a whole GPU and a MIG-partitioned one of two instances.

    Returns (pool, node, the whole GPU, the partitioned GPU, its instances).
    """
    pool = PoolFactory(sharing="exclusive")
    node = NodeFactory(pool=pool)
    whole = DeviceFactory(node=node, uid="GPU-whole")
    parent, children = partitioned_gpu(node, "GPU-partitioned", "gpu.mig", {"gi1/ci0": {}, "gi2/ci0": {}})
    return pool, node, whole, parent, children


@pytest.mark.django_db
def test_guard2_whole_gpus_never_come_from_a_partitioned_gpu_in_an_exclusive_pool() -> None:
    # An exclusive pool sells whole GPUs; this node also carries a MIG-enabled one,
    # whose parent is a `gpu` device too, healthy, free and matching every selector.
    pool, _node, whole, parent, _children = an_exclusive_node_with_a_partitioned_gpu()
    with pytest.raises(NoCapacity):
        reservation_create(request=gpu_request(pool, 2), actor="t")
    reservation_create(request=gpu_request(pool, 1), actor="t")
    assert booked_device_ids() == {whole.id}
    with pytest.raises(NoCapacity):
        reservation_create(request=gpu_request(pool, 1), actor="t")
    assert not DeviceBooking.objects.filter(device=parent).exists()


@pytest.mark.django_db
def test_guard2_a_whole_node_lease_takes_the_partitions_but_never_their_parent() -> None:
    pool, node, whole, _parent, children = an_exclusive_node_with_a_partitioned_gpu()
    node_atom = DeviceFactory(node=node, uid=node.id, device_class="node", attributes={})
    reservation, _ = reservation_create(request=gpu_request(pool, 1, binding="node"), actor="t")
    assert booked_device_ids(reservation) == {whole.id, node_atom.id, *(c.id for c in children)}


@pytest.mark.django_db(transaction=True)
def test_guard2_enabling_mig_under_a_placement_in_flight_is_refused(hooks: Hooks) -> None:
    pool = PoolFactory(sharing="exclusive")
    node = NodeFactory(pool=pool)
    node_report_apply(node=node, report=report(node.hostname, [gpu(0)]), actor="agent")
    placer, go_on = placement_held_after_its_locks(hooks, gpu_request(pool, 1))

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

    # The placement holds the node (FOR SHARE) and the GPU (FOR NO KEY UPDATE), not yet booked:
    # the report waits for it.
    reporter = started_until_blocked(enable_mig)
    go_on.set()
    assert isinstance(placer.finish(), ReservationCreated), placer.error
    # The layout change then finds the GPU booked and is refused whole.
    assert reporter.finish() == "refused", reporter.error
    assert Device.objects.get(uid=gpu(0)["uuid"]).bookable
    assert not Device.objects.filter(node=node, device_class="gpu.mig").exists()
    assert not DeviceBooking.objects.filter(purpose="layout-change").exists()
