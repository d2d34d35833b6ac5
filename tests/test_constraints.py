"""The database's own guards: the exclusion constraint and the CHECKs."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange

from reservations.models import DeviceBooking
from tests.factories import AllocationFactory, DeviceFactory


def at(hour: int, minute: int = 0) -> datetime:
    return datetime(2030, 1, 1, hour, minute, tzinfo=UTC)


@pytest.mark.django_db
def test_exclusion_refuses_an_overlapping_booking_of_one_device() -> None:
    device = DeviceFactory()
    allocation = AllocationFactory()
    DeviceBooking.objects.create(device=device, allocation=allocation, during=DateTimeTZRange(at(10), at(11)))
    with pytest.raises(IntegrityError), transaction.atomic():
        DeviceBooking.objects.create(
            device=device, allocation=allocation, during=DateTimeTZRange(at(10, 30), at(11, 30))
        )
