"""Every admin list page: its queries do not grow with its rows, and bookings and rollups are read-only."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from core.models import AuditEvent
from inventory.models import Device, Node, Pool
from reservations.models import DeviceBooking, PoolCapacityRollup
from reservations.rollups.recount import rollup_rebuild
from tests.support.factories import (
    AllocationFactory,
    DeviceFactory,
    NodeFactory,
    PoolFactory,
    ReservationFactory,
)

pytestmark = pytest.mark.django_db


def test_bookings_and_rollups_are_read_only(operator: Client, gpu_node: Node) -> None:
    rollup_rebuild(pool_id=gpu_node.pool_id)
    row = PoolCapacityRollup.objects.get(pool=gpu_node.pool, resource="gpu")
    response = operator.post(
        reverse("admin:reservations_poolcapacityrollup_change", args=[row.pk]), {"allocated": 5}
    )
    assert response.status_code == 403
    assert operator.get(reverse("admin:reservations_devicebooking_add")).status_code == 403
    assert operator.get(reverse("admin:inventory_device_add")).status_code == 403


def _grow_fleet(pool: Pool, nodes: int) -> None:
    for _ in range(nodes):
        node = NodeFactory(pool=pool)
        DeviceFactory.create_batch(2, node=node)
        reservation = ReservationFactory(pool=pool, tenant=pool.owner)
        allocation = AllocationFactory(node=node, reservation=reservation)
        now = timezone.now()
        for device in Device.objects.filter(node=node):
            DeviceBooking.objects.create(
                device=device, allocation=allocation, during=DateTimeTZRange(now, now + timedelta(hours=1))
            )
    rollup_rebuild(pool_id=pool.pk)
    AuditEvent.objects.create(actor="a", action="node.cordon", subject_type="node", subject_id="x")


LIST_PAGES = [
    "admin:inventory_node_changelist",
    "admin:inventory_pool_changelist",
    "admin:inventory_device_changelist",
    "admin:reservations_reservation_changelist",
    "admin:reservations_allocation_changelist",
    "admin:reservations_devicebooking_changelist",
    "admin:reservations_poolcapacityrollup_changelist",
    "admin:core_auditevent_changelist",
]


@pytest.mark.parametrize("url_name", LIST_PAGES)
def test_list_pages_cost_the_same_number_of_queries_as_rows_grow(
    operator: Client, url_name: str, django_assert_max_num_queries: Any
) -> None:
    pool = PoolFactory()
    _grow_fleet(pool, 2)
    url = reverse(url_name)
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as small:
        assert operator.get(url).status_code == 200
    _grow_fleet(PoolFactory(), 15)
    with django_assert_max_num_queries(len(small.captured_queries)):
        response = operator.get(url)
    assert response.status_code == 200
