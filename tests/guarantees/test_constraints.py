"""The database's own guards: the exclusion constraint and the CHECKs."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange

from core.clock import compute_now, set_clock_offset
from inventory.models import NodeResource
from ledger.models import QuotaUsage
from reservations.models import DeviceBooking, PoolCapacityRollup
from tests.support.clock import at
from tests.support.factories import (
    AllocationFactory,
    DeviceFactory,
    NodeResourceFactory,
    PoolFactory,
    QuotaUsageFactory,
)
from tests.support.records import assert_an_overlapping_booking_is_refused


@pytest.mark.django_db
def test_exclusion_refuses_an_overlapping_booking_of_one_device() -> None:
    assert_an_overlapping_booking_is_refused(
        DateTimeTZRange(at(10), at(11)), DateTimeTZRange(at(10, 30), at(11, 30))
    )


@pytest.mark.django_db
def test_exclusion_allows_the_same_range_on_another_device() -> None:
    allocation = AllocationFactory()
    first, second = DeviceFactory(), DeviceFactory()
    DeviceBooking.objects.create(device=first, allocation=allocation, during=DateTimeTZRange(at(10), at(11)))
    DeviceBooking.objects.create(device=second, allocation=allocation, during=DateTimeTZRange(at(10), at(11)))
    assert DeviceBooking.objects.count() == 2


@pytest.mark.django_db
def test_exclusion_allows_touching_ranges_on_one_device() -> None:
    device = DeviceFactory()
    allocation = AllocationFactory()
    DeviceBooking.objects.create(device=device, allocation=allocation, during=DateTimeTZRange(at(10), at(11)))
    DeviceBooking.objects.create(device=device, allocation=allocation, during=DateTimeTZRange(at(11), at(12)))
    assert DeviceBooking.objects.filter(device=device).count() == 2


@pytest.mark.django_db
def test_the_constraint_is_keyed_by_device_pool_and_time() -> None:
    # The device first: GiST tests an entry's keys in column order (migration 0018).
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'device_bookings_no_overlap'"
        )
        (definition,) = cursor.fetchone()
    assert definition == "EXCLUDE USING gist (device_id WITH =, pool_id WITH =, during WITH &&)"


@pytest.mark.django_db
def test_a_booking_carries_its_devices_pool_whatever_the_writer_passed() -> None:
    device = DeviceFactory()
    allocation = AllocationFactory()
    with connection.cursor() as cursor:
        # A writer that names another pool is overruled by the trigger, so the
        # overlap is still refused: the pool column cannot split a device's bookings.
        cursor.execute(
            "INSERT INTO device_bookings (device_id, allocation_id, purpose, during, pool_id)"
            " VALUES (%s, %s, 'allocation', tstzrange(%s, %s), 'pool_elsewhere')",
            [device.pk, allocation.pk, at(10), at(11)],
        )
    booking = DeviceBooking.objects.get(device=device)
    assert booking.pool_id == device.node.pool_id
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO device_bookings (device_id, allocation_id, purpose, during, pool_id)"
            " VALUES (%s, %s, 'allocation', tstzrange(%s, %s), 'pool_other')",
            [device.pk, allocation.pk, at(10, 30), at(11, 30)],
        )
    with pytest.raises(IntegrityError), transaction.atomic():
        DeviceBooking.objects.filter(pk=booking.pk).update(pool_id="pool_other")
        DeviceBooking.objects.create(
            device=device, allocation=allocation, during=DateTimeTZRange(at(10, 30), at(11, 30))
        )


@pytest.mark.django_db
def test_bookings_follow_a_node_or_a_device_that_moves_to_another_pool() -> None:
    device = DeviceFactory()
    allocation = AllocationFactory()
    DeviceBooking.objects.create(device=device, allocation=allocation, during=DateTimeTZRange(at(10), at(11)))
    node = device.node
    other = PoolFactory()
    node.pool = other
    node.save(update_fields=["pool"])
    assert list(DeviceBooking.objects.values_list("pool_id", flat=True)) == [other.pk]
    # After the move the overlap is refused as before.
    with pytest.raises(IntegrityError), transaction.atomic():
        DeviceBooking.objects.create(
            device=device, allocation=allocation, during=DateTimeTZRange(at(10, 30), at(11, 30))
        )
    elsewhere = DeviceFactory()
    device.node = elsewhere.node
    device.save(update_fields=["node"])
    assert list(DeviceBooking.objects.values_list("pool_id", flat=True)) == [elsewhere.node.pool_id]


def insert_booking_on_conflict_do_nothing(
    device_id: int, allocation_id: str, start: datetime, end: datetime
) -> int:
    """The placer's form: no conflict target, so the exclusion constraint is honoured."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO device_bookings (device_id, allocation_id, purpose, during)
            VALUES (%s, %s, 'allocation', tstzrange(%s, %s))
            ON CONFLICT DO NOTHING
            """,
            [device_id, allocation_id, start, end],
        )
        return cursor.rowcount


@pytest.mark.django_db
def test_insert_on_conflict_do_nothing_inserts_zero_rows_on_an_overlap_instead_of_raising() -> None:
    device = DeviceFactory()
    allocation = AllocationFactory()
    assert insert_booking_on_conflict_do_nothing(device.pk, allocation.pk, at(10), at(11)) == 1
    assert insert_booking_on_conflict_do_nothing(device.pk, allocation.pk, at(10, 30), at(12)) == 0
    # The transaction is still usable: the next statement succeeds.
    assert insert_booking_on_conflict_do_nothing(device.pk, allocation.pk, at(11), at(12)) == 1
    assert DeviceBooking.objects.filter(device=device).count() == 2


@pytest.mark.django_db
@pytest.mark.parametrize("allocated", [65, -1])
def test_node_resources_check_refuses_an_over_claim_and_a_negative_value(allocated: int) -> None:
    resource = NodeResourceFactory(allocatable=32, ratio=Decimal("2.0"))
    NodeResource.objects.filter(pk=resource.pk).update(allocated=64)  # exactly floor(32 * 2) fits
    with pytest.raises(IntegrityError), transaction.atomic():
        NodeResource.objects.filter(pk=resource.pk).update(allocated=allocated)
    resource.refresh_from_db()
    assert resource.allocated == 64


@pytest.mark.django_db
@pytest.mark.parametrize("used", [17, -1])
def test_quota_usage_check_refuses_an_over_claim_and_a_negative_value(used: int) -> None:
    quota = QuotaUsageFactory(max=16)
    QuotaUsage.objects.filter(pk=quota.pk).update(used=16)
    with pytest.raises(IntegrityError), transaction.atomic():
        QuotaUsage.objects.filter(pk=quota.pk).update(used=used)
    quota.refresh_from_db()
    assert quota.used == 16


@pytest.mark.django_db
def test_rollup_check_refuses_an_over_count_and_a_negative_bucket() -> None:
    pool = PoolFactory()
    rollup = PoolCapacityRollup.objects.create(
        pool=pool, resource="gpu", total=10, allocatable=8, maintenance=2
    )
    # A total above the sum of allocatable and the buckets.
    with pytest.raises(IntegrityError), transaction.atomic():
        PoolCapacityRollup.objects.filter(pk=rollup.pk).update(total=11)
    # A negative bucket breaks the sum (the table has no per-column sign CHECK; the sum is its guard).
    with pytest.raises(IntegrityError), transaction.atomic():
        PoolCapacityRollup.objects.filter(pk=rollup.pk).update(maintenance=-2)
    rollup.refresh_from_db()
    assert (rollup.total, rollup.allocatable, rollup.maintenance, rollup.available) == (10, 8, 2, 8)


@pytest.mark.django_db
def test_compute_now_follows_the_session_clock_offset() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        db_now = cursor.fetchone()[0]
    assert compute_now() == db_now  # no offset: the transaction's now()
    set_clock_offset(timedelta(hours=3))
    try:
        assert compute_now() - db_now == timedelta(hours=3)
        set_clock_offset(timedelta(days=-1))
        assert compute_now() - db_now == timedelta(days=-1)
    finally:
        set_clock_offset(timedelta(0))
    assert compute_now() == db_now
