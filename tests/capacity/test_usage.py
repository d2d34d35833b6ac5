"""Hourly usage: exact against the bookings, written once per closed hour, corrected (never edited) late.

The clock is the database's, moved on this connection; the services are
called as the API and the worker call them, and `usage/hourly` is read over HTTP.
"""

from __future__ import annotations

import contextlib
from collections import Counter, defaultdict
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from capacity.models import HourlyUsage, UsageHour
from capacity.selectors.usage import UsageScope, UsageWindow, usage_page
from capacity.services import usage_close_due
from capacity.usage import HOUR, hour_floor
from core.clock import compute_now, to_millis
from core.errors import NoCapacity
from inventory.models import Node, Pool
from reservations.lifecycle.deadlines import lease_expire_due, reservation_settle_ended
from reservations.lifecycle.phases import bookings_advance
from reservations.models import DeviceBooking, Reservation
from reservations.services import reservation_create, reservation_release
from tests.support.api import post_json
from tests.support.factories import ProjectFactory
from tests.support.placement import gpu_request, make_node
from tests.support.properties import rolled_back
from worker.deadlines import next_deadline

GRACE = timedelta(seconds=300)
US = timedelta(microseconds=1)


@pytest.fixture(autouse=True)
def usage_settings(settings: Any) -> None:
    settings.CAPACITY_USAGE_CLOSE_GRACE_SECONDS = int(GRACE.total_seconds())
    settings.CAPACITY_USAGE_RECHECK_HOURS = 6


def overlap_us(start: datetime, end: datetime, lo: datetime, hi: datetime) -> int:
    return max(0, (min(end, hi) - max(start, lo)) // US)


def expected_usage(lo: datetime, hi: datetime, *, tenant_id: str | None = None) -> Counter[tuple[str, bool]]:
    """From the bookings, each clipped to `[lo, min(hi, now))`; scalars over their allocation's span."""
    hi = min(hi, compute_now())
    out: Counter[tuple[str, bool]] = Counter()
    spans: dict[str, list[DeviceBooking]] = defaultdict(list)
    bookings = DeviceBooking.objects.filter(purpose="allocation").select_related(
        "device", "allocation__reservation"
    )
    for booking in bookings:
        assert booking.allocation is not None
        reservation = booking.allocation.reservation
        if tenant_id is not None and reservation.tenant_id != tenant_id:
            continue
        key = (booking.device.device_class, reservation.spot)
        out[key] += overlap_us(booking.during.lower, booking.during.upper, lo, hi)
        spans[booking.allocation.pk].append(booking)
    for members in spans.values():
        allocation = members[0].allocation
        assert allocation is not None
        start = min(b.during.lower for b in members)
        end = max(b.during.upper for b in members)
        for resource, amount in (allocation.resources or {}).items():
            if amount > 0:
                out[(resource, allocation.reservation.spot)] += amount * overlap_us(start, end, lo, hi)
    return +out


def reported_usage(lo: datetime, hi: datetime, *, tenant_id: str | None = None) -> Counter[tuple[str, bool]]:
    rows, _ = usage_page(scope=UsageScope(tenant_id=tenant_id), window=UsageWindow(lo, hi), limit=None)
    out: Counter[tuple[str, bool]] = Counter()
    for row in rows:
        out[(row.resource, row.spot)] += row.usage_us
    return +out


def stored_rows() -> dict[int, tuple[Any, ...]]:
    return {
        row.pk: (row.hour, row.tenant_id, row.pool_id, row.project_id, row.resource, row.spot, row.usage_us)
        for row in HourlyUsage.objects.all()
    }


# --- the property: exact to the microsecond, rows written once ---------------------------------

creates = st.tuples(
    st.just("create"),
    st.integers(1, 2),  # GPUs
    st.booleans(),  # spot
    st.booleans(),  # in a project
    st.sampled_from([0, 0, 4, 16]),  # vCPUs
    st.integers(0, 150),  # start, minutes from now
    st.integers(15, 300),  # duration, minutes
    st.booleans(),  # with a 60 s lease (expires unless released first)
)
steps = st.lists(
    st.one_of(
        creates,
        creates,
        st.tuples(st.just("wait"), st.integers(1, 150)),
        st.tuples(st.just("wait"), st.integers(1, 20)),
        st.tuples(st.just("release"), st.integers(0, 20)),
        st.tuples(st.just("displace")),  # a regular request for every GPU: spot reservations get notice
        st.tuples(st.just("worker")),  # the deadline jobs, late by as long as the waits were
        st.tuples(st.just("close")),
    ),
    min_size=3,
    max_size=16,
)


@pytest.mark.django_db
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(script=steps)
def test_hourly_usage_sums_to_the_clipped_bookings_over_any_range_and_closed_rows_never_change(
    owned_pool: Pool, clock: Any, script: list[tuple[Any, ...]]
) -> None:
    try:
        with rolled_back():
            _run_script(owned_pool, clock, script)
    finally:
        clock(timedelta(0))


def _run_script(pool: Pool, clock: Any, script: list[tuple[Any, ...]]) -> None:
    make_node(pool, gpus=3, resources={"vcpu": 64}, hostname="usage-1")
    project = ProjectFactory.create(tenant=pool.owner)
    start = compute_now()
    made: list[str] = []
    closed: dict[int, tuple[Any, ...]] = {}
    for index, step in enumerate(script):
        kind = step[0]
        if kind == "create":
            _, gpus, spot, in_project, vcpu, start_min, minutes, lease = step
            now = compute_now()
            request = gpu_request(
                pool,
                gpus,
                spot=spot,
                project_id=project.pk if in_project else None,
                resources={"vcpu": vcpu} if vcpu else {},
                start_ms=to_millis(now + timedelta(minutes=start_min)) if start_min else None,
                duration_seconds=minutes * 60,
                lease_seconds=60 if lease else None,
                idempotency_key=f"usage-{index}",
            )
            with contextlib.suppress(NoCapacity):
                made.append(reservation_create(request=request, actor="test", pool=pool).reservation.pk)
        elif kind == "displace":
            request = gpu_request(pool, 3, duration_seconds=3600, idempotency_key=f"usage-{index}")
            with contextlib.suppress(NoCapacity):
                made.append(reservation_create(request=request, actor="test", pool=pool).reservation.pk)
        elif kind == "wait":
            clock(timedelta(minutes=step[1], seconds=7))
        elif kind == "release" and made:
            reservation_release(reservation=Reservation(pk=made[step[1] % len(made)]), actor="test")
        elif kind == "worker":
            lease_expire_due()
            reservation_settle_ended()
            bookings_advance()
        elif kind == "close":
            usage_close_due()
            current = stored_rows()
            assert {pk: current[pk] for pk in closed} == closed, "a closed row changed"
            closed = current
    clock(timedelta(hours=2, minutes=13))  # time passes on what is left, so every example holds something
    lease_expire_due()
    reservation_settle_ended()
    usage_close_due()
    now = compute_now()
    assert stored_rows().items() >= closed.items()
    # Nothing the services do reaches into a closed hour: no correction was ever needed.
    assert not HourlyUsage.objects.filter(revision__gt=0).exists()

    first, last = hour_floor(start) - HOUR, hour_floor(now) + HOUR
    assert reported_usage(first, last) == expected_usage(first, last)
    hour = first
    while hour < last:
        assert reported_usage(hour, hour + HOUR) == expected_usage(hour, hour + HOUR), hour
        hour += HOUR
    middle = first + (last - first) // HOUR // 2 * HOUR
    for lo, hi in ((first, middle), (middle, last)):
        assert reported_usage(lo, hi) == expected_usage(lo, hi)


# --- closing hours ---------------------------------------------------------------------------


@pytest.fixture
def one_gpu_node(owned_pool: Pool) -> Node:
    """A node of one GPU in `owned_pool`, for the tests whose reservations book one GPU at a time."""
    return make_node(owned_pool, gpus=1)


def _one_gpu(pool: Pool, **fields: Any) -> str:
    return reservation_create(request=gpu_request(pool, 1, **fields), actor="test", pool=pool).reservation.pk


@pytest.mark.django_db
def test_an_hour_closes_only_once_its_grace_has_passed_and_is_written_once(
    owned_pool: Pool, clock: Any
) -> None:
    make_node(owned_pool, gpus=2)
    now = compute_now()
    # To a minute past an hour, so the hour just ended is the one waiting on its grace.
    now = clock(hour_floor(now) + HOUR + timedelta(minutes=1) - now)
    _one_gpu(owned_pool, duration_seconds=4 * 3600)
    clock(timedelta(hours=1))  # the booking's first hour ended a minute ago
    usage_close_due()
    booked_hour = hour_floor(now)
    assert not UsageHour.objects.filter(hour=booked_hour).exists()
    clock(GRACE - timedelta(seconds=61))
    usage_close_due()
    assert not UsageHour.objects.filter(hour=booked_hour).exists()
    clock(timedelta(seconds=2))
    assert usage_close_due() >= 1
    marker = UsageHour.objects.get(hour=booked_hour)
    row = HourlyUsage.objects.get(hour=booked_hour)
    assert (row.resource, row.spot, row.revision) == ("gpu", False, 0)
    assert row.usage_us == (booked_hour + HOUR - now) // US
    assert marker.rows == 1
    # The worker's next deadline: the grace after the next hour's end.
    assert next_deadline(periodic={}).usage_close == booked_hour + 2 * HOUR + GRACE
    assert usage_close_due() == 0  # nothing new is due: nothing is written twice


@pytest.mark.django_db
@pytest.mark.usefixtures("one_gpu_node")
def test_a_usage_row_and_a_closed_hour_refuse_to_be_changed_or_removed(owned_pool: Pool, clock: Any) -> None:
    _one_gpu(owned_pool)
    clock(timedelta(hours=3))
    usage_close_due()
    row = HourlyUsage.objects.first()
    assert row is not None
    for attempt in (
        lambda: HourlyUsage.objects.filter(pk=row.pk).update(usage_us=1),
        lambda: HourlyUsage.objects.filter(pk=row.pk).delete(),
        lambda: UsageHour.objects.filter(hour=row.hour).delete(),
    ):
        with pytest.raises(DatabaseError, match="history"), transaction.atomic():
            attempt()


@pytest.mark.django_db
@pytest.mark.usefixtures("one_gpu_node")
def test_a_late_lease_expiry_ends_the_booking_when_it_is_applied_so_closed_hours_stand(
    owned_pool: Pool, clock: Any
) -> None:
    """The rule for late workers: a booking ends when the release is applied, never back in time.

    A lease that lapsed while no worker ran keeps its atoms until the expiry is
    applied (no one else could book them), so the closed hours are what was
    held, and the expiry changes only the open hour onwards.
    """
    start = compute_now()
    rsv = _one_gpu(owned_pool, duration_seconds=6 * 3600, lease_seconds=60)
    now = clock(timedelta(hours=3))  # the lease lapsed 3 hours ago; nothing applied it
    usage_close_due()
    before = stored_rows()
    assert before
    assert lease_expire_due() == 1
    booking = DeviceBooking.objects.get(allocation__reservation_id=rsv)
    assert booking.during.upper == now
    clock(timedelta(hours=2))
    usage_close_due()
    after = stored_rows()
    assert after.items() >= before.items()
    assert not HourlyUsage.objects.filter(revision__gt=0).exists()
    total = reported_usage(hour_floor(start), hour_floor(now) + 2 * HOUR)
    assert total == Counter({("gpu", False): (now - start) // US})


@pytest.mark.django_db
@pytest.mark.usefixtures("one_gpu_node")
def test_a_change_that_reaches_into_a_closed_hour_is_recorded_as_a_correction_row(
    owned_pool: Pool, clock: Any, owner_client: APIClient
) -> None:
    """A late commit (a transaction that read the clock before the hour closed) or an operator's repair.

    The closed row stays as it was; the next close counts the recent hours
    again and writes the difference as the key's next revision, so reports
    add up to the bookings again and say the hour was corrected.
    """
    # Twenty minutes into an hour, whatever the wall clock says: three hours on, the
    # first three hours are all past their grace and closed (a start in the first
    # minutes of an hour would leave the third open, and nothing to correct there).
    now = compute_now()
    start = clock(hour_floor(now) + HOUR + timedelta(minutes=20) - now)
    rsv = _one_gpu(owned_pool, duration_seconds=5 * 3600)
    clock(timedelta(hours=3))
    usage_close_due()
    original = stored_rows()
    booking = DeviceBooking.objects.get(allocation__reservation_id=rsv)
    cut_at = hour_floor(start) + HOUR + timedelta(minutes=20)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE device_bookings SET during = tstzrange(lower(during), %s, '[)') WHERE id = %s",
            [cut_at, booking.pk],
        )
    now = clock(timedelta(hours=1))
    usage_close_due()
    assert stored_rows().items() >= original.items()
    corrections = {
        row.hour: (row.revision, row.usage_us) for row in HourlyUsage.objects.filter(revision__gt=0)
    }
    assert corrections == {
        hour_floor(start) + HOUR: (1, -(timedelta(minutes=40) // US)),
        hour_floor(start) + 2 * HOUR: (1, -(HOUR // US)),  # nothing is left of that hour
    }
    window = (hour_floor(start), hour_floor(now) + HOUR)
    assert (
        reported_usage(*window)
        == expected_usage(*window)
        == Counter({("gpu", False): (cut_at - start) // US})
    )
    status, body = post_json(
        owner_client,
        "usage/hourly",
        {"tenantId": "acme", "from": to_millis(window[0]), "to": to_millis(window[1])},
    )
    assert status == 200, body
    assert [(r["hour"], r["corrected"]) for r in body["rows"]] == [
        (to_millis(hour_floor(start)), False),
        (to_millis(hour_floor(start) + HOUR), True),
    ]


@pytest.mark.django_db
@pytest.mark.usefixtures("one_gpu_node")
def test_spot_and_regular_usage_are_counted_apart_and_a_spot_notice_ends_the_spot_usage(
    owned_pool: Pool, clock: Any
) -> None:
    start = compute_now()
    _one_gpu(owned_pool, spot=True, duration_seconds=4 * 3600)
    notice_at = clock(timedelta(minutes=30))
    _one_gpu(owned_pool, duration_seconds=3600)  # displaces the spot reservation after its notice
    now = clock(timedelta(hours=3))
    usage_close_due()
    ends = notice_at + timedelta(seconds=owned_pool.notice_seconds)
    total = reported_usage(hour_floor(start), hour_floor(now) + HOUR)
    assert total == Counter({("gpu", True): (ends - start) // US, ("gpu", False): 3600 * 10**6})
