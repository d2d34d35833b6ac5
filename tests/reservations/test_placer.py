"""The placer: filters, scorers, atom choice, gangs, whole nodes, future starts, spot notices, scalars."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection

from core.clock import compute_now, set_clock_offset
from core.errors import InvalidInput, NoCapacity
from inventory.models import Device, Pool
from reservations.models import DeviceBooking, Reservation
from reservations.placer.plan import placement_plan, placement_window
from reservations.request.types import ReservationRequest
from reservations.selectors import reservation_get, reservation_payload, reservation_state
from reservations.services import reservation_create
from tests.support.clock import HOUR_MS, now_ms
from tests.support.factories import DeviceFactory, NodeFactory, PoolFactory, TaintFactory, partitioned_gpu
from tests.support.placement import gpu_request, make_node


def plan_for(request: ReservationRequest, **kwargs: Any) -> Any:
    pool = Pool.objects.get(pk=request.pool_id)
    return placement_plan(request=request, pool=pool, window=placement_window(request=request), **kwargs)


@pytest.fixture
def pool() -> Pool:
    return PoolFactory()


@pytest.mark.django_db
def test_selector_compares_ints_as_numbers(pool: Pool) -> None:
    small = make_node(pool, gpus=2, vram=40)
    big = make_node(pool, gpus=2, vram=141)
    plan = plan_for(gpu_request(pool, 2, selector={"vramGiB": {"gte": 80}}))
    assert [o.members[0].node_id for o in plan.options] == [big.id]
    plan = plan_for(gpu_request(pool, 1, selector={"vramGiB": {"lt": 100}}))
    assert [o.members[0].node_id for o in plan.options] == [small.id]


@pytest.mark.django_db
def test_selector_on_strings_labels_in_notin_and_exists(pool: Pool) -> None:
    east = make_node(pool, gpus=1, labels={"fabric": "f1", "rack": "r01"})
    west = make_node(pool, gpus=1, labels={"fabric": "f1", "rack": "r02"})

    def nodes(selector: dict[str, Any]) -> set[str]:
        return {o.members[0].node_id for o in plan_for(gpu_request(pool, 1, selector=selector)).options}

    assert nodes({"node.rack": {"eq": "r02"}}) == {west.id}
    assert nodes({"node.rack": {"in": ["r01", "r09"]}}) == {east.id}
    assert nodes({"node.rack": {"notIn": ["r01"]}}) == {west.id}
    assert nodes({"gpuModel": {"eq": "H100"}, "node.rack": {"ne": "r01"}}) == {west.id}
    assert nodes({"nvlinkDomain": {"exists": True}}) == set()
    assert nodes({"nvlinkDomain": {"exists": False}}) == {east.id, west.id}


@pytest.mark.django_db
def test_a_booked_atom_is_not_offered_for_an_overlapping_window(pool: Pool) -> None:
    make_node(pool, gpus=2)
    first = reservation_create(request=gpu_request(pool, 2), actor="t").reservation
    assert first.allocations.count() == 1
    plan = plan_for(gpu_request(pool, 1))
    assert not plan.fits
    assert plan.reason is not None and plan.reason.code == "NO_FIT"
    # After the first reservation ends, the same atoms are free again.
    later = compute_now() + timedelta(hours=2)
    plan = plan_for(gpu_request(pool, 2, start_ms=int(later.timestamp() * 1000)))
    assert plan.fits


@pytest.mark.django_db
def test_nvlink_all_keeps_every_gpu_in_one_domain(pool: Pool) -> None:
    split = make_node(pool, gpus=4, nvlink=["a", "a", "b", "b"])
    whole = make_node(pool, gpus=4, nvlink=["a", "a", "a", "b"])
    plan = plan_for(gpu_request(pool, 3, item_topology="nvlink-all"))
    assert [o.members[0].node_id for o in plan.options] == [whole.id]
    atoms = plan.options[0].members[0].atoms
    domains = set(Device.objects.filter(uid__in=atoms).values_list("attributes__nvlinkDomain", flat=True))
    assert domains == {"a"}
    # Without the topology both nodes fit.
    assert {o.members[0].node_id for o in plan_for(gpu_request(pool, 3)).options} == {split.id, whole.id}


@pytest.mark.django_db
def test_atoms_come_from_one_numa_node_when_one_holds_them(pool: Pool) -> None:
    make_node(pool, gpus=8, numa_split=5)  # NUMA 0 holds 5, NUMA 1 holds 3
    member = plan_for(gpu_request(pool, 3)).options[0].members[0]
    numas = set(Device.objects.filter(uid__in=member.atoms).values_list("attributes__numaNode", flat=True))
    # Best fit: the NUMA node with exactly 3 free is used, keeping the 5 together.
    assert numas == {1}


@pytest.mark.django_db
def test_numa_locality_and_bin_packing_rank_nodes(pool: Pool) -> None:
    spread = make_node(pool, gpus=4, numa_split=2)  # 4 free, at most 2 per NUMA node
    local = make_node(pool, gpus=4, numa_split=4)  # 4 free on one NUMA node
    plan = plan_for(gpu_request(pool, 4))
    assert [o.members[0].node_id for o in plan.options] == [local.id, spread.id]
    assert plan.options[0].score > plan.options[1].score

    big = make_node(pool, gpus=8, numa_split=8)
    plan = plan_for(gpu_request(pool, 2))
    # Bin packing: the 4-GPU nodes are filled before the 8-GPU node is broken.
    assert plan.options[-1].members[0].node_id == big.id


@pytest.mark.django_db
def test_prefer_no_schedule_taint_is_a_penalty_not_a_filter(pool: Pool) -> None:
    tainted = make_node(pool, gpus=2)
    TaintFactory(node=tainted, effect="PreferNoSchedule")
    clean = make_node(pool, gpus=2)
    plan = plan_for(gpu_request(pool, 2))
    assert [o.members[0].node_id for o in plan.options] == [clean.id, tainted.id]


@pytest.mark.django_db
def test_unschedulable_nodes_and_unhealthy_atoms_are_filtered(pool: Pool) -> None:
    make_node(pool, gpus=2, cordoned=True)
    make_node(pool, gpus=2, maintenance=True)
    make_node(pool, gpus=2, connectivity="disconnected")
    make_node(pool, gpus=2, noschedule_taints=1)
    make_node(pool, gpus=2, provision_state="adopting")
    make_node(pool, gpus=2, converged_specs=0)
    sick = make_node(pool, gpus=2)
    Device.objects.filter(node=sick).update(healthy=False)
    assert not plan_for(gpu_request(pool, 1)).fits


@pytest.mark.django_db
def test_archived_pool_does_not_place(pool: Pool) -> None:
    make_node(pool, gpus=2)
    Pool.objects.filter(pk=pool.pk).update(archived_at=compute_now())
    plan = plan_for(gpu_request(pool, 1))
    assert not plan.fits and plan.reason is not None and plan.reason.code == "POOL_ARCHIVED"


@pytest.mark.django_db
def test_mig_and_slot_classes_must_fit_the_pool() -> None:
    mig_pool = PoolFactory(sharing="mig")
    instances = {f"gi{gi}/ci0": {"migProfile": "2g.20gb", "memoryGiB": 20, "numaNode": 0} for gi in range(3)}
    partitioned_gpu(NodeFactory(pool=mig_pool), "GPU-mig-0", "gpu.mig", instances)
    plan = plan_for(
        gpu_request(mig_pool, 2, device_class="gpu.mig", selector={"migProfile": {"eq": "2g.20gb"}})
    )
    assert plan.fits and all("/gi" in atom for atom in plan.options[0].members[0].atoms)
    # Whole GPUs are not sold from a MIG pool (the parent is never bookable either).
    plan = plan_for(gpu_request(mig_pool, 1))
    assert not plan.fits and plan.reason is not None and plan.reason.code == "SHARING_MISMATCH"

    slot_pool = PoolFactory(sharing="timeslice", slots_per_gpu=4)
    slots = {f"s{k}": {"slotIndex": k, "numaNode": 0} for k in range(4)}
    partitioned_gpu(NodeFactory(pool=slot_pool), "GPU-ts-0", "gpu.slot", slots)
    plan = plan_for(gpu_request(slot_pool, 3, device_class="gpu.slot"))
    assert plan.fits and len(plan.options[0].members[0].atoms) == 3
    assert not plan_for(gpu_request(slot_pool, 1, device_class="gpu.mig")).fits


@pytest.mark.django_db
def test_gang_takes_nodes_sharing_one_fabric(pool: Pool) -> None:
    make_node(pool, gpus=8, labels={"fabric": "f-a"})
    b1 = make_node(pool, gpus=8, labels={"fabric": "f-b"})
    b2 = make_node(pool, gpus=8, labels={"fabric": "f-b"})
    make_node(pool, gpus=8, labels={"rack": "no-fabric"})
    request = gpu_request(pool, 8, gang_size=2)
    plan = plan_for(request)
    assert len(plan.options) == 1
    assert {m.node_id for m in plan.options[0].members} == {b1.id, b2.id}
    reservation, created = reservation_create(request=request, actor="t")
    assert created
    assert set(reservation.allocations.values_list("node_id", flat=True)) == {b1.id, b2.id}
    assert DeviceBooking.objects.filter(allocation__reservation=reservation).count() == 16
    # No second gang of two fits on one fabric now.
    assert not plan_for(gpu_request(pool, 8, gang_size=2)).fits


@pytest.mark.django_db
def test_gang_with_custom_topology_key(pool: Pool) -> None:
    make_node(pool, gpus=2, labels={"fabric": "f", "rack": "r1"})
    make_node(pool, gpus=2, labels={"fabric": "f", "rack": "r2"})
    assert plan_for(gpu_request(pool, 2, gang_size=2)).fits
    plan = plan_for(gpu_request(pool, 2, gang_size=2, gang_topology_key="rack"))
    assert not plan.fits and plan.reason is not None and plan.reason.code == "NO_GANG"


@pytest.mark.django_db
def test_binding_node_books_every_atom_of_a_wholly_free_node(pool: Pool) -> None:
    busy = make_node(pool, gpus=4, node_atom=True)
    free = make_node(pool, gpus=4, node_atom=True)
    reservation_create(request=gpu_request(pool, 1, tenant_id=pool.owner_id), actor="t")  # lands somewhere
    taken_node = Reservation.objects.get().allocations.get().node_id
    other = free if taken_node == busy.id else busy
    request = gpu_request(pool, 1, binding="node")
    plan = plan_for(request)
    assert [o.members[0].node_id for o in plan.options] == [other.id]
    assert set(plan.options[0].members[0].atoms) == set(
        Device.objects.filter(node=other).values_list("uid", flat=True)
    )
    reservation, _ = reservation_create(request=request, actor="t")
    assert DeviceBooking.objects.filter(allocation__reservation=reservation).count() == 5
    assert not plan_for(gpu_request(pool, 1, binding="node")).fits


@pytest.mark.django_db
def test_future_start_books_the_later_window_and_counts_reserved(pool: Pool) -> None:
    make_node(pool, gpus=1)
    now = compute_now()
    start = now + timedelta(days=1)
    reservation, _ = reservation_create(
        request=gpu_request(pool, 1, start_ms=int(start.timestamp() * 1000)), actor="t"
    )
    assert reservation.state == "scheduled"
    booking = DeviceBooking.objects.get(allocation__reservation=reservation)
    assert booking.during.lower >= start - timedelta(milliseconds=1)
    # The GPU is still free now, for a window that ends before the calendar booking.
    assert plan_for(gpu_request(pool, 1, duration_seconds=3600)).fits
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT allocated, reserved FROM pool_capacity_rollup WHERE pool_id = %s AND resource = 'gpu'",
            [pool.id],
        )
        assert cursor.fetchone() == (0, 1)


@pytest.mark.django_db
def test_a_start_long_past_is_invalid_and_a_little_past_means_now(pool: Pool) -> None:
    make_node(pool, gpus=1)
    now = compute_now()
    with pytest.raises(InvalidInput):
        placement_window(
            request=gpu_request(pool, 1, start_ms=int((now - timedelta(minutes=6)).timestamp() * 1000))
        )
    window = placement_window(
        request=gpu_request(pool, 1, start_ms=int((now - timedelta(minutes=1)).timestamp() * 1000))
    )
    assert window.start == window.now


@pytest.mark.django_db
def test_scalars_must_fit_allocatable_times_ratio_minus_allocated(pool: Pool) -> None:
    node = make_node(pool, gpus=4, resources={"vcpu": 10})
    from inventory.models import NodeResource

    NodeResource.objects.filter(node=node, resource="vcpu").update(ratio=2)  # 20 schedulable
    reservation_create(request=gpu_request(pool, 1, resources={"vcpu": 15}), actor="t")
    assert NodeResource.objects.get(node=node, resource="vcpu").allocated == 15
    assert not plan_for(gpu_request(pool, 1, resources={"vcpu": 6})).fits
    assert plan_for(gpu_request(pool, 1, resources={"vcpu": 5})).fits
    # A node without the resource at all cannot serve a claim on it.
    assert not plan_for(gpu_request(pool, 1, resources={"hugepages1Gi": 1})).fits


@pytest.mark.django_db
def test_spot_reservations_are_displaced_with_a_notice(pool: Pool) -> None:
    Pool.objects.filter(pk=pool.pk).update(notice_seconds=120)
    make_node(pool, gpus=2)
    spot, _ = reservation_create(request=gpu_request(pool, 2, spot=True), actor="t")
    # Another spot request never displaces.
    with pytest.raises(NoCapacity):
        reservation_create(request=gpu_request(pool, 2, spot=True), actor="t")
    now = compute_now()
    regular, _ = reservation_create(request=gpu_request(pool, 2), actor="t")
    spot.refresh_from_db()
    assert spot.notice_at is not None and spot.notice_ends_at is not None
    assert spot.notice_ends_at == regular.starts_at
    assert regular.starts_at >= now + timedelta(seconds=120)
    for booking in DeviceBooking.objects.filter(allocation__reservation=spot):
        assert booking.during.upper == spot.notice_ends_at
    assert DeviceBooking.objects.filter(allocation__reservation=regular).count() == 2
    payload = reservation_payload(reservation_get(tenant_id=spot.tenant_id, reservation_id=spot.id))
    assert payload["state"] == "active" and payload["notice"] is not None
    assert regular.state == "scheduled"
    set_clock_offset(timedelta(seconds=121), local=True)
    assert reservation_state(spot) == "preempted"
    assert reservation_state(regular) == "active"


@pytest.mark.django_db
def test_no_capacity_carries_the_placer_reason(pool: Pool) -> None:
    make_node(pool, gpus=1)
    with pytest.raises(NoCapacity) as caught:
        reservation_create(request=gpu_request(pool, 2), actor="t")
    assert caught.value.details and caught.value.details[0]["code"] == "NO_FIT"
    assert not Reservation.objects.exists()


@pytest.mark.django_db
def test_planning_costs_a_fixed_number_of_queries_however_many_nodes(
    pool: Pool, django_assert_num_queries: Any
) -> None:
    # Starting now: one query (the kept counts name the candidates, and the
    # shortlist's atoms come back with the ranking); for later: the ranking over
    # the pool, then the shortlist's atoms.
    now = gpu_request(pool, 2, selector={"vramGiB": {"gte": 80}}, resources={"vcpu": 2})
    later = gpu_request(
        pool, 2, selector={"vramGiB": {"gte": 80}}, resources={"vcpu": 2}, start_ms=now_ms() + HOUR_MS
    )
    for _ in range(3):
        make_node(pool, gpus=4, resources={"vcpu": 8})
    plans = {}
    for name, request, queries in (("now", now, 1), ("later", later, 2)):
        window = placement_window(request=request)
        with django_assert_num_queries(queries):
            plans[name] = placement_plan(request=request, pool=pool, window=window)
    for _ in range(12):
        make_node(pool, gpus=4, resources={"vcpu": 8})
    for name, request, queries in (("now", now, 1), ("later", later, 2)):
        window = placement_window(request=request)
        with django_assert_num_queries(queries):
            many = placement_plan(request=request, pool=pool, window=window)
        assert len(plans[name].options) == 3 and len(many.options) == 10
    assert plans["now"].scope == "counts" and plans["later"].scope == "pool"


@pytest.mark.django_db
def test_selector_sql_agrees_with_the_python_matcher(pool: Pool) -> None:
    from reservations.placer.filters import selector_sql
    from reservations.placer.sql import Params
    from reservations.request.device_match import normalize_selector, selector_matches

    shapes: list[tuple[dict[str, Any], dict[str, str]]] = [
        ({"gpuModel": "H100", "vramGiB": 80, "numaNode": 0}, {"rack": "r1"}),
        ({"gpuModel": "H200", "vramGiB": 141, "numaNode": 1, "nvlinkDomain": "a"}, {"rack": "r2"}),
        ({"gpuModel": "A100", "vramGiB": "80", "numaNode": True}, {}),  # wrong JSON types never compare
        ({"gpuModel": "L40S", "vramGiB": 48}, {"rack": "r1", "zone": "z"}),
        ({}, {"rack": "r3"}),
    ]
    devices = []
    for attributes, labels in shapes:
        node = NodeFactory(pool=pool, labels=labels)
        devices.append((DeviceFactory(node=node, attributes=attributes), attributes, labels))
    selectors: list[dict[str, Any]] = [
        {"vramGiB": {"gte": 80}},
        {"vramGiB": {"lt": 100}},
        {"vramGiB": {"in": [48, 141]}},
        {"vramGiB": {"notIn": [80]}},
        {"vramGiB": {"ne": 80}},
        {"numaNode": 1},
        {"gpuModel": {"in": ["H100", "L40S"]}},
        {"gpuModel": {"ne": "H100"}},
        {"nvlinkDomain": {"exists": True}},
        {"nvlinkDomain": {"exists": False}},
        {"node.rack": "r1"},
        {"node.rack": {"notIn": ["r1", "r2"]}},
        {"node.zone": {"exists": True}, "vramGiB": {"lte": 48}},
    ]
    ids = [device.id for device, _, _ in devices]
    for raw in selectors:
        selector = normalize_selector(raw, field="selector")
        q = Params()
        sql = (
            "SELECT d.id FROM inventory_device d JOIN inventory_node n ON n.id = d.node_id"
            f" WHERE d.id = ANY({q.p(ids, 'bigint[]')}) AND {selector_sql(selector, q)}"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, q.values)
            in_sql = {row[0] for row in cursor.fetchall()}
        in_python = {
            device.id
            for device, attributes, labels in devices
            if selector_matches(selector, attributes, labels)
        }
        assert in_sql == in_python, raw
