"""The guards together, attacked with real connections in threads: an idempotency race, and a mix.

Each guard alone: `test_guard_bookings` (1, 2), `test_guard_counters` (3, 5),
`test_guard_eligibility` (4) and `test_guard_delivery` (6).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from core.clock import compute_now
from inventory.models import NodeResource
from ledger.models import QuotaUsage
from reservations.models import DeviceBooking, Reservation
from reservations.rollups.recount import rollup_rebuild
from reservations.services import ReservationCreated, reservation_create, reservation_release
from tests.support.factories import NodeResourceFactory, PoolFactory, QuotaUsageFactory
from tests.support.placement import gpu_request
from tests.support.races import assert_no_overlapping_bookings, attempt, one_node
from tests.support.threads import workers_race

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

    from reservations.models import PoolCapacityRollup

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
