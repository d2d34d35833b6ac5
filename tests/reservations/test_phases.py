"""Booking phases on time: `bookings_advance` moves a booking from `reserved` to `allocated` to gone.

The clock is the database's (`compute_now()`), moved per connection; the rows
are read over HTTP (`capacity/byPool`) and compared with a rebuild's recount.
Concurrency: two advances, and a release racing an advance, on real
connections in threads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from rest_framework.test import APIClient

from core.clock import set_clock_offset
from inventory.models import Node, Pool
from reservations.lifecycle.deadlines import reservation_settle_ended
from reservations.lifecycle.phases import bookings_advance, bookings_next_boundary
from reservations.models import BookingPhase, DeviceBooking, Reservation
from reservations.rollups.recount import rollup_rebuild, rollup_recount
from reservations.services import reservation_release
from tests.support.api import post, reservation_body
from tests.support.clock import HOUR, HOUR_MS, now_ms, with_clock_offset
from tests.support.placement import make_node
from tests.support.records import book, snapshot, snapshot_after_rebuild
from tests.support.threads import started_until_blocked, transaction_held_open, workers_race


def gpu_counts(allocatable: int, allocated: int, reserved: int, available: int) -> dict[str, int]:
    """The `gpu` row's counts as `gpu_row` answers them."""
    return {"allocatable": allocatable, "allocated": allocated, "reserved": reserved, "available": available}


def gpu_row(client: APIClient, pool: Pool) -> dict[str, Any]:
    """The pool's `gpu` row as `capacity/byPool` answers it."""
    answer = post(client, "capacity/byPool", {"tenantId": pool.owner_id, "poolId": pool.id})
    assert answer.status_code == 200, answer.json()
    (row,) = [row for row in answer.json()["rows"] if row["resource"] == "gpu"]
    return {name: row[name] for name in ("allocatable", "allocated", "reserved", "available")}


def phases(pool: Pool) -> list[int]:
    return sorted(DeviceBooking.objects.filter(device__node__pool=pool).values_list("phase", flat=True))


def assert_every_booking_over_and_given_back(client: APIClient, pool: Pool, bookings: int) -> None:
    """The pool's `bookings` bookings are all OVER, its eight GPUs all available again, the rows exact."""
    assert gpu_row(client, pool) == gpu_counts(8, 0, 0, 8)
    assert phases(pool) == [BookingPhase.OVER] * bookings
    assert snapshot([pool.id]) == snapshot_after_rebuild(pool)


def matches_a_recount(pool: Pool) -> bool:
    """The rows equal what a rebuild would store, without moving a phase (`rollup_recount`)."""
    rows = {(pool.id, row.resource): row for row in pool.rollups.all()}
    counted = rollup_recount(pool_ids=[pool.id])
    return set(rows) == set(counted) and all(
        getattr(rows[key], name) == value for key, counts in counted.items() for name, value in counts.items()
    )


@pytest.fixture
def counted_gpu_node(owned_pool: Pool, gpu_node: Node) -> Node:
    """`gpu_node` with the pool's rows rebuilt, so that they count its eight GPUs before a test books them."""
    rollup_rebuild(pool_id=owned_pool.id)
    return gpu_node


@pytest.mark.django_db
def test_a_future_booking_is_reserved_then_allocated_then_gone_each_after_bookings_advance(
    owner_client: APIClient, owned_pool: Pool, counted_gpu_node: Node, clock: Callable[[timedelta], None]
) -> None:
    body = reservation_body(owned_pool, "acme", "later", gpus=2, start=now_ms() + HOUR_MS)
    created = post(owner_client, "reservations/create", body)
    assert created.status_code == 201, created.json()
    reservation = Reservation.objects.get(pk=created.json()["id"])
    assert gpu_row(owner_client, owned_pool) == gpu_counts(8, 0, 2, 6)
    assert phases(owned_pool) == [BookingPhase.FUTURE] * 2
    assert bookings_next_boundary() == reservation.starts_at
    assert bookings_advance() == 0
    assert snapshot([owned_pool.id]) == snapshot_after_rebuild(owned_pool)

    # The clock passes the start: nothing moves until the advance runs...
    clock(timedelta(minutes=90))
    assert gpu_row(owner_client, owned_pool)["reserved"] == 2
    assert matches_a_recount(owned_pool)  # the rows and the phases agree even while behind the clock
    # ...which moves both bookings from reserved to allocated, once.
    assert bookings_advance() == 2
    assert gpu_row(owner_client, owned_pool) == gpu_counts(8, 2, 0, 6)
    assert phases(owned_pool) == [BookingPhase.RUNNING] * 2
    assert bookings_advance() == 0
    assert bookings_next_boundary() == reservation.ends_at
    assert snapshot([owned_pool.id]) == snapshot_after_rebuild(owned_pool)

    # The clock passes the end: the bookings leave `allocated` with the next advance.
    clock(timedelta(minutes=150))
    assert gpu_row(owner_client, owned_pool)["allocated"] == 2
    assert matches_a_recount(owned_pool)
    assert bookings_advance() == 2
    assert gpu_row(owner_client, owned_pool) == gpu_counts(8, 0, 0, 8)
    assert phases(owned_pool) == [BookingPhase.OVER] * 2
    assert bookings_next_boundary() is None
    assert snapshot([owned_pool.id]) == snapshot_after_rebuild(owned_pool)


@pytest.mark.django_db
def test_a_booking_whose_whole_window_passed_goes_straight_from_reserved_to_over(
    owner_client: APIClient, owned_pool: Pool, counted_gpu_node: Node, clock: Callable[[timedelta], None]
) -> None:
    body = reservation_body(owned_pool, "acme", "missed", gpus=3, start=now_ms() + HOUR_MS)
    assert post(owner_client, "reservations/create", body).status_code == 201
    clock(timedelta(hours=3))

    assert bookings_advance() == 3

    assert_every_booking_over_and_given_back(owner_client, owned_pool, 3)


@pytest.mark.django_db
def test_bookings_on_atoms_outside_the_counted_set_change_phase_without_moving_the_rows(
    owned_pool: Pool, clock: Callable[[timedelta], None]
) -> None:
    """A cordoned node's bookings are in no count: their phases move, the rows stay as a rebuild has them."""
    node = make_node(owned_pool, gpus=2, cordoned=True)
    for device in node.devices.all():
        book(device, HOUR, 2 * HOUR)
    rollup_rebuild(pool_id=owned_pool.id)
    before = snapshot([owned_pool.id])
    clock(timedelta(minutes=90))

    assert bookings_advance() == 2

    assert phases(owned_pool) == [BookingPhase.RUNNING] * 2
    assert snapshot([owned_pool.id]) == before == snapshot_after_rebuild(owned_pool)


@pytest.mark.django_db
def test_an_advance_in_small_batches_moves_everything_due_and_nothing_else(
    owned_pool: Pool, clock: Callable[[timedelta], None]
) -> None:
    node = make_node(owned_pool, gpus=8)
    devices = list(node.devices.order_by("id"))
    for device in devices[:5]:
        book(device, HOUR, 2 * HOUR)
    for device in devices[5:]:
        book(device, 3 * HOUR, 4 * HOUR)
    rollup_rebuild(pool_id=owned_pool.id)
    clock(timedelta(minutes=90))

    assert bookings_advance(limit=2) == 5

    assert phases(owned_pool) == [BookingPhase.FUTURE] * 3 + [BookingPhase.RUNNING] * 5
    assert snapshot([owned_pool.id]) == snapshot_after_rebuild(owned_pool)


# --- Concurrency ---------------------------------------------------------------------------


def advancing(offset: timedelta, limit: int) -> Callable[[], int]:
    """An advance on the calling thread's own connection, with the clock moved there."""
    return with_clock_offset(offset, lambda: bookings_advance(limit=limit))


@pytest.mark.django_db(transaction=True)
def test_two_advances_at_once_move_each_booking_once(owned_pool: Pool) -> None:
    bookings = 0
    for _ in range(4):
        for device in make_node(owned_pool, gpus=8).devices.all():
            book(device, HOUR, 2 * HOUR)
            bookings += 1
    rollup_rebuild(pool_id=owned_pool.id)
    offset = timedelta(minutes=90)

    # Small batches, so the two interleave many times over the same rows.
    racers = workers_race([advancing(offset, 3), advancing(offset, 3)])

    for racer in racers:
        racer.join_ok()
    assert sum(racer.result for racer in racers) == bookings
    assert phases(owned_pool) == [BookingPhase.RUNNING] * bookings
    set_clock_offset(offset)
    try:
        assert (
            owned_pool.rollups.get(resource="gpu").allocated,
            owned_pool.rollups.get(resource="gpu").reserved,
        ) == (
            bookings,
            0,
        )
        assert snapshot([owned_pool.id]) == snapshot_after_rebuild(owned_pool)
    finally:
        set_clock_offset(timedelta(0))


@pytest.fixture
def started_reservation(owner_client: APIClient, owned_pool: Pool) -> Iterator[tuple[Pool, str]]:
    """Two GPUs booked from an hour on, with every connection's clock 90 minutes on: due to start."""
    make_node(owned_pool, gpus=2)
    rollup_rebuild(pool_id=owned_pool.id)
    body = reservation_body(owned_pool, "acme", "race", gpus=2, start=now_ms() + HOUR_MS)
    created = post(owner_client, "reservations/create", body)
    assert created.status_code == 201, created.json()
    set_clock_offset(timedelta(minutes=90))
    yield owned_pool, created.json()["id"]
    set_clock_offset(timedelta(0))


def released_by(reservation_id: str) -> Callable[[], Any]:
    """A release of the reservation on the calling thread's own connection, its clock 90 minutes on."""
    return with_clock_offset(
        timedelta(minutes=90),
        lambda: reservation_release(reservation=Reservation.objects.get(pk=reservation_id), actor="tenant"),
    )


def assert_given_back_once(pool: Pool) -> None:
    row = pool.rollups.get(resource="gpu")
    assert (row.allocatable, row.allocated, row.reserved) == (2, 0, 0)
    assert phases(pool) == [BookingPhase.OVER] * 2
    assert snapshot([pool.id]) == snapshot_after_rebuild(pool)


@pytest.mark.django_db(transaction=True)
def test_a_release_waits_for_an_advance_holding_the_bookings_and_gives_back_what_it_moved(
    started_reservation: tuple[Pool, str],
) -> None:
    pool, reservation_id = started_reservation
    advance, commit = transaction_held_open(with_clock_offset(timedelta(minutes=90), bookings_advance))
    # The release's cut locks the bookings the advance moved (uncommitted)...
    release = started_until_blocked(released_by(reservation_id))
    commit.set()
    advance.join_ok()
    release.join_ok()
    # ...and then gives back `allocated` (their new phase), not `reserved` a second time.
    assert advance.result == 2
    assert bookings_advance() == 0
    assert_given_back_once(pool)


@pytest.mark.django_db(transaction=True)
def test_an_advance_skips_the_bookings_a_release_holds_and_the_release_gives_back_once(
    started_reservation: tuple[Pool, str],
) -> None:
    pool, reservation_id = started_reservation
    release, commit = transaction_held_open(released_by(reservation_id))

    # The release holds the bookings: the advance leaves them to it instead of waiting.
    assert bookings_advance() == 0
    commit.set()
    release.join_ok()

    # The cut ended them now, from the phase they had: nothing is left for an advance.
    assert bookings_advance() == 0
    assert_given_back_once(pool)


@pytest.mark.django_db(transaction=True)
def test_a_release_and_an_advance_racing_give_back_exactly_once(
    owner_client: APIClient, owned_pool: Pool
) -> None:
    make_node(owned_pool, gpus=8)
    rollup_rebuild(pool_id=owned_pool.id)
    offset = timedelta(minutes=90)
    for round_ in range(4):
        body = reservation_body(owned_pool, "acme", f"race-{round_}", gpus=2, start=now_ms() + HOUR_MS)
        created = post(owner_client, "reservations/create", body)
        assert created.status_code == 201, created.json()
        for racer in workers_race([advancing(offset, 1), released_by(created.json()["id"])]):
            racer.join_ok()
        set_clock_offset(offset)
        try:
            bookings_advance()
            row = owned_pool.rollups.get(resource="gpu")
            assert (row.allocated, row.reserved) == (0, 0), round_
            assert snapshot([owned_pool.id]) == snapshot_after_rebuild(owned_pool)
        finally:
            set_clock_offset(timedelta(0))


# --- The other ways bookings end: settlement and a spot notice -------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("advance_first", [True, False], ids=["advance-then-settle", "settle-then-advance"])
def test_a_reservation_that_runs_to_its_end_leaves_the_counts_once_whichever_runs_first(
    advance_first: bool,
    owner_client: APIClient,
    owned_pool: Pool,
    counted_gpu_node: Node,
    clock: Callable[[timedelta], None],
) -> None:
    created = post(owner_client, "reservations/create", reservation_body(owned_pool, "acme", "runs", gpus=2))
    assert created.status_code == 201, created.json()
    assert gpu_row(owner_client, owned_pool)["allocated"] == 2
    clock(timedelta(minutes=61))

    if advance_first:
        assert bookings_advance() == 2
        assert reservation_settle_ended() == 1
    else:
        # Settlement leaves the bookings as they are (they already end there): the advance moves them.
        assert reservation_settle_ended() == 1
        assert gpu_row(owner_client, owned_pool)["allocated"] == 2
        assert bookings_advance() == 2

    assert_every_booking_over_and_given_back(owner_client, owned_pool, 2)


@pytest.mark.django_db
def test_a_spot_notice_keeps_the_running_phase_until_the_notice_ends(
    owner_client: APIClient, owned_pool: Pool, clock: Callable[[timedelta], None]
) -> None:
    Pool.objects.filter(pk=owned_pool.pk).update(notice_seconds=600)
    make_node(owned_pool, gpus=2)
    rollup_rebuild(pool_id=owned_pool.id)
    spot = post(owner_client, "reservations/create", reservation_body(owned_pool, "acme", "spot", spot=True))
    assert spot.status_code == 201, spot.json()

    regular = post(owner_client, "reservations/create", reservation_body(owned_pool, "acme", "regular"))
    assert regular.status_code == 201, regular.json()

    # The spot keeps running until its notice ends; the regular one is booked from then on.
    assert Reservation.objects.get(pk=spot.json()["id"]).notice_at is not None
    assert gpu_row(owner_client, owned_pool) == gpu_counts(2, 2, 2, 0)
    assert sorted(phases(owned_pool)) == [BookingPhase.FUTURE] * 2 + [BookingPhase.RUNNING] * 2
    assert snapshot([owned_pool.id]) == snapshot_after_rebuild(owned_pool)

    clock(timedelta(minutes=11))
    assert bookings_advance() == 4
    assert gpu_row(owner_client, owned_pool) == gpu_counts(2, 2, 0, 0)
    assert phases(owned_pool) == [BookingPhase.RUNNING] * 2 + [BookingPhase.OVER] * 2
    assert snapshot([owned_pool.id]) == snapshot_after_rebuild(owned_pool)
