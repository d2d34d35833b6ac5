"""Guards 3 and 5, attacked with real connections in threads: the guarded scalar counters and the quota.

The races are held with the commit hooks and gates of `tests.support.races`; a transaction that
must be waiting on a row lock is observed in `pg_stat_activity` before the test moves on.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from core.clock import compute_now
from core.errors import NoCapacity, QuotaExceeded
from inventory.models import Device, Node, NodeResource, Pool
from ledger.models import QuotaUsage
from reservations.models import DeviceBooking, PoolCapacityRollup
from reservations.rollups.recount import rollup_rebuild
from reservations.services import ReservationCreated, reservation_create, reservation_release
from tests.support.factories import NodeResourceFactory, PoolFactory, QuotaUsageFactory
from tests.support.placement import gpu_request
from tests.support.races import (
    Hooks,
    assert_no_overlapping_bookings,
    attempt,
    booked_device_ids,
    gpus_by_bus,
    on_gpu,
    one_node,
    placement_held_after_its_locks,
    second_placement_after_a_queue,
)
from tests.support.threads import workers_race

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
    hooks: Hooks,
) -> None:
    pool = PoolFactory()
    node = gpus_by_bus(pool, 2, vcpu=10)
    # Planned (10 vCPUs free, so the node fit) and locked, its claim not yet made.
    first, go_on = placement_held_after_its_locks(hooks, on_gpu(pool, 0, resources={"vcpu": 6}))
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
    # whose row lock it then holds, uncommitted. The second planned while the first's
    # claim was invisible (0 of 10 vCPUs taken) and now books the other GPU, which waits
    # for the node's kept counts row (the first's booking insert updated it): its claim
    # comes after the first commits.
    result = second_placement_after_a_queue(
        lambda: list(QuotaUsage.objects.select_for_update().filter(pool=pool)),
        on_gpu(pool, 0, resources={"vcpu": 6}),
        "quota_usage",
        on_gpu(pool, 1, resources={"vcpu": 6}),
        "INSERT INTO device_bookings",
    )
    # Its UPDATE re-read the row the first committed (6 of 10): 0 rows, a lost race, no capacity.
    assert isinstance(result, NoCapacity), result
    assert NodeResource.objects.get(node=node).allocated == 6
    assert QuotaUsage.objects.get(pool=pool).used == 1
    assert booked_device_ids() == {Device.objects.get(uid=f"GPU-{node.id}-0").id}


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


def a_gpu_quota_of_one_over_two_nodes(pool: Pool, **quota: Any) -> None:
    """One GPU on each of two nodes on two fabrics; a quota of one GPU.

    Two placements then share no atom, no node and no fabric count (the pool's
    row per fabric, which a placement holds from its booking insert): what they
    both wait for is the quota row.
    """
    for index, node in enumerate([gpus_by_bus(pool, 1), gpus_by_bus(pool, 1, first_bus=1)]):
        Node.objects.filter(pk=node.pk).update(labels={"fabric": f"fabric-{index}"})
    QuotaUsageFactory(pool=pool, tenant=pool.owner, resource="gpu", max=1, **quota)
    rollup_rebuild(pool_id=pool.id)


def rollup_rows_of(pool: Pool) -> Callable[[], Any]:
    """Locks the pool's rollup rows: a placement holding them stops just after its quota charge."""
    return lambda: list(PoolCapacityRollup.objects.select_for_update().filter(pool=pool))


@pytest.mark.django_db(transaction=True)
def test_guard5_a_charge_that_waited_for_another_charges_row_lock_rechecks_the_limit() -> None:
    pool = PoolFactory()
    a_gpu_quota_of_one_over_two_nodes(pool)
    # Holding the pool's rollup rows stops the first placement in its quota charge, just
    # after the guarded UPDATE (the rollup deltas ride in the same statement and run after
    # it), whose row lock it then holds, uncommitted. The second books the other node's GPU
    # (no atom or node to queue on) and then waits for the quota row.
    result = second_placement_after_a_queue(
        rollup_rows_of(pool), on_gpu(pool, 0), "quota_usage", on_gpu(pool, 1), "quota_usage"
    )
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
    a_gpu_quota_of_one_over_two_nodes(pool, mode="concurrent")
    later = int((compute_now() + timedelta(minutes=30)).timestamp() * 1000)
    # The second starts half an hour into the first's hour: they overlap, on two different GPUs.
    # The first stops in its charge's statement (holding the quota row), as above.
    result = second_placement_after_a_queue(
        rollup_rows_of(pool),
        on_gpu(pool, 0),
        "quota_usage",
        on_gpu(pool, 1, start_ms=later),
        "quota_usage",
    )
    assert isinstance(result, QuotaExceeded), result
    assert result.details == [
        {
            "field": "quota",
            "message": "gpu: 1 in use at the busiest instant of the window, a limit of 1, 1 asked",
            "resource": "gpu",
            "used": 1,
            "max": 1,
            "asked": 1,
        }
    ]
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
