"""The displaced window only when something is displaced (issue 11, item 9).

A regular request that fits nowhere is planned again in displace mode, with
its window moved to the end of the pool's spot notice. When the option it
then commits cuts no spot reservation (its atoms were simply free by commit
time), the reservation takes the window it asked for: `active` now, not
`scheduled` a notice later.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest

from core.clock import compute_now, to_millis
from inventory.models import Pool
from reservations.models import DeviceBooking, Reservation
from reservations.placer import commit, option
from reservations.placer.plan import placement_plan, placement_window
from reservations.selectors import reservation_state
from reservations.services import reservation_create, reservation_release
from tests.support.factories import PoolFactory, ReservationFactory
from tests.support.placement import gpu_request, make_node
from tests.support.threads import Worker

NOTICE_SECONDS = 30


@pytest.fixture
def hooks() -> Iterator[list[Callable[[str, str], None]]]:
    option.HOOKS.clear()
    yield option.HOOKS
    option.HOOKS.clear()


@pytest.fixture
def pool() -> Pool:
    pool = PoolFactory()
    Pool.objects.filter(pk=pool.pk).update(notice_seconds=NOTICE_SECONDS)
    pool.refresh_from_db()
    return pool


@pytest.mark.django_db(transaction=True)
def test_a_displacing_option_whose_spot_is_gone_at_commit_books_the_plain_window(
    pool: Pool, hooks: list[Callable[[str, str], None]]
) -> None:
    """The plan saw a spot booking on the atom; by the commit its reservation was released."""
    make_node(pool, gpus=1)
    later = compute_now() + timedelta(minutes=10)
    spot, _ = reservation_create(
        request=gpu_request(pool, 1, spot=True, start_ms=to_millis(later), duration_seconds=7200), actor="t"
    )
    released: list[Worker] = []

    def release_the_spot(point: str, node_id: str) -> None:
        # Held between the displace-mode plan and the commit's locks, another
        # connection releases the spot reservation the plan meant to displace.
        if point == "before_node_lock" and not released:
            worker = Worker(lambda: reservation_release(reservation=spot, actor="t"))
            released.append(worker)
            worker.start()
            worker.join_ok()

    hooks.append(release_the_spot)
    regular, created = reservation_create(request=gpu_request(pool, 1), actor="t")
    assert created and released
    regular.refresh_from_db()
    assert regular.state == "active"
    assert reservation_state(regular) == "active"
    booking = DeviceBooking.objects.get(allocation__reservation=regular)
    assert booking.during.lower == regular.starts_at
    assert regular.starts_at <= compute_now()
    spot.refresh_from_db()
    # Released by its owner, not given a notice by the regular reservation.
    assert spot.state == "released" and spot.notice_at is None


@pytest.mark.django_db
def test_a_displace_mode_option_on_free_atoms_is_committed_with_the_plain_window(pool: Pool) -> None:
    """The issue's race, crafted: the displace-mode plan picked atoms nothing books."""
    make_node(pool, gpus=2)
    request = gpu_request(pool, 1)
    window = placement_window(request=request)
    plan = placement_plan(request=request, pool=pool, window=window, displace=True)
    assert plan.fits and plan.window.start > window.start
    assert all(member.displaced == 0 for option in plan.options for member in option.members)
    reservation = ReservationFactory(
        pool=pool,
        tenant=pool.owner,
        starts_at=window.start,
        ends_at=window.end,
        idempotency_key=request.idempotency_key,
    )
    placement = commit.plan_commit(reservation=reservation, request=request, plan=plan, window=window)
    assert placement is not None
    assert placement.window == window
    assert placement.displaced_reservations == []
    booking = DeviceBooking.objects.get(allocation__reservation=reservation)
    assert booking.during.lower == window.start


@pytest.mark.django_db
def test_a_real_displacement_still_starts_when_the_notice_ends(pool: Pool) -> None:
    make_node(pool, gpus=1)
    spot, _ = reservation_create(request=gpu_request(pool, 1, spot=True), actor="t")
    now = compute_now()
    regular, _ = reservation_create(request=gpu_request(pool, 1), actor="t")
    assert regular.state == "scheduled"
    assert regular.starts_at == now + timedelta(seconds=NOTICE_SECONDS)
    spot.refresh_from_db()
    assert spot.notice_ends_at == regular.starts_at
    assert Reservation.objects.filter(state="scheduled").count() == 1


@pytest.mark.django_db
def test_a_spot_already_under_notice_still_delays_the_next_regular_request(pool: Pool) -> None:
    """Its bookings end with its notice: in the plain window's way, though nothing is left to cut."""
    make_node(pool, gpus=2)
    spot, _ = reservation_create(request=gpu_request(pool, 2, spot=True), actor="t")
    first, _ = reservation_create(request=gpu_request(pool, 1), actor="t")
    spot.refresh_from_db()
    assert spot.notice_ends_at == first.starts_at
    second, _ = reservation_create(request=gpu_request(pool, 1), actor="t")
    assert second.state == "scheduled"
    assert second.starts_at == spot.notice_ends_at
