"""Rollup deltas: what a booking transaction adds to the counters agrees with a rebuild from scratch."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange

from core.clock import compute_now
from reservations.models import DeviceBooking
from reservations.rollups.deltas import rollup_apply_delta, rollup_apply_deltas
from reservations.rollups.recount import rollup_rebuild
from tests.support.clock import HOUR
from tests.support.factories import NodeFactory, NodeResourceFactory, PoolFactory, gpus
from tests.support.records import book, row, snapshot, snapshot_after_rebuild


@pytest.mark.django_db
def test_deltas_and_the_rebuild_agree() -> None:
    pool = PoolFactory.create()
    node = NodeFactory.create(pool=pool)
    NodeResourceFactory.create(node=node, resource="vcpu", allocatable=64)
    devices = gpus(node, 4)
    rollup_rebuild(pool_id=pool.id)

    # Placements: two GPUs from now with 16 vCPUs, one GPU later.
    now_bookings = [book(d, -timedelta(minutes=1), HOUR) for d in devices[:2]]
    node.resources.filter(resource="vcpu").update(allocated=16)
    rollup_apply_deltas(pool_id=pool.id, deltas={"gpu": (2, 0), "vcpu": (16, 0)})
    later = book(devices[2], 2 * HOUR, 3 * HOUR)
    rollup_apply_delta(pool_id=pool.id, resource="gpu", reserved=1)
    assert snapshot([pool.id]) == snapshot_after_rebuild(pool)

    # Releases: one started booking ends now, the future one is deleted.
    now = compute_now()
    DeviceBooking.objects.filter(pk=now_bookings[0].pk).update(
        during=DateTimeTZRange(now_bookings[0].during.lower, now)
    )
    later.delete()
    rollup_apply_delta(pool_id=pool.id, resource="gpu", allocated=-1, reserved=-1)
    assert snapshot([pool.id]) == snapshot_after_rebuild(pool)
    assert (row(pool).allocated, row(pool).reserved, row(pool).available) == (1, 0, 3)
