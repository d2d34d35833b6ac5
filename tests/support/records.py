"""Rows the tests write or read the same way everywhere: a booking, a rollup row, a node's audit trail."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.db import IntegrityError, transaction
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange

from core.clock import compute_now
from core.models import AuditEvent
from inventory.models import Device, Node, Pool
from reservations.models import Allocation, DeviceBooking, PoolCapacityRollup
from reservations.rollups.recount import rollup_rebuild
from tests.support.factories import AllocationFactory, DeviceFactory

COUNTED = ("total", "allocatable", "allocated", "reserved", "available")
BUCKET_FIELDS = ("provisioning", "unhealthy", "maintenance", "unreachable")


def book(
    device: Device,
    start: datetime | timedelta,
    end: datetime | timedelta,
    *,
    allocation: Allocation | None = None,
    pool: Pool | None = None,
) -> DeviceBooking:
    """A booking of `device` for [start, end).

    An instant is taken as given, a `timedelta` from the database clock's now. The
    booking is on `allocation`, or on a new allocation of the device's node whose
    reservation is in `pool` (the node's pool unless said otherwise).
    """
    now = compute_now() if isinstance(start, timedelta) or isinstance(end, timedelta) else None
    lower = now + start if isinstance(start, timedelta) and now is not None else start
    upper = now + end if isinstance(end, timedelta) and now is not None else end
    if allocation is None:
        allocation = AllocationFactory.create(node=device.node, reservation__pool=pool or device.node.pool)
    return DeviceBooking.objects.create(
        device=device, allocation=allocation, during=DateTimeTZRange(lower, upper)
    )


def assert_an_overlapping_booking_is_refused(first: DateTimeTZRange, overlapping: DateTimeTZRange) -> None:
    """A device booked for `first` is refused a booking for `overlapping`: the exclusion constraint holds."""
    device = DeviceFactory.create()
    allocation = AllocationFactory.create()
    DeviceBooking.objects.create(device=device, allocation=allocation, during=first)
    with pytest.raises(IntegrityError), transaction.atomic():
        DeviceBooking.objects.create(device=device, allocation=allocation, during=overlapping)


def row(pool: Pool, resource: str = "gpu") -> PoolCapacityRollup:
    """The pool's rollup row for `resource`."""
    return PoolCapacityRollup.objects.get(pool=pool, resource=resource)


def snapshot(pool_ids: list[str] | None = None) -> dict[tuple[str, str], tuple[int, ...]]:
    """Every rollup row's numbers (not its timestamps), for comparing two states."""
    fields = ("allocatable", "allocated", "reserved", "available", *BUCKET_FIELDS, "total")
    qs = PoolCapacityRollup.objects.all()
    if pool_ids is not None:
        qs = qs.filter(pool_id__in=pool_ids)
    return {(r.pool_id, r.resource): tuple(getattr(r, f) for f in fields) for r in qs}


def snapshot_after_rebuild(pool: Pool) -> dict[tuple[str, str], tuple[int, ...]]:
    """The pool's rollup numbers once rebuilt from scratch."""
    rollup_rebuild(pool_id=pool.id)
    return snapshot([pool.id])


def audit_trail(node: Node) -> list[str]:
    """The actions of the node's audit events, oldest first."""
    return list(
        AuditEvent.objects.filter(subject_type="node", subject_id=node.pk)
        .order_by("id")
        .values_list("action", flat=True)
    )
