"""Guard 6, attacked with real connections: the node refuses an overlapping assignment.

The fake daemon holds what the nodes believe they run; what it refuses is released, and what
never reached it is delivered from the outbox or resynced.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection

from core.clock import compute_now
from inventory.models import Device, NodeResource
from reservations.delivery.daemon import daemon_holdings
from reservations.models import Reservation
from reservations.services import reservation_create
from tests.support.factories import NodeResourceFactory, PoolFactory
from tests.support.placement import gpu_request
from tests.support.races import one_node


@pytest.mark.django_db(transaction=True)
def test_guard6_the_fake_daemon_refuses_a_forged_overlap_and_the_reservation_is_released() -> None:
    pool = PoolFactory()
    node = one_node(pool, 1)
    device = Device.objects.get(node=node)
    now = compute_now()
    # The node already believes it runs something on this GPU (a forged, stale assignment).
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO fake_daemon_assignments"
            " (node_id, device_uid, reservation_id, allocation_id, starts_at, ends_at)"
            " VALUES (%s, %s, 'rsv_forged', 'alloc_forged', %s, %s)",
            [node.id, device.uid, now - timedelta(hours=1), now + timedelta(days=1)],
        )
    reservation, created = reservation_create(request=gpu_request(pool, 1), actor="t")
    assert created
    reservation.refresh_from_db()
    assert reservation.state == "released"
    assert reservation.release_reason.startswith("AllocationFailed")
    holders = {holder for holder, _, _ in daemon_holdings(device_uid=device.uid)}
    assert holders == {"rsv_forged"}


@pytest.mark.django_db(transaction=True)
def test_guard6_the_daemon_accepts_what_the_database_accepted() -> None:
    pool = PoolFactory()
    node = one_node(pool, 2)
    reservation, _ = reservation_create(request=gpu_request(pool, 2), actor="t")
    reservation.refresh_from_db()
    assert reservation.state == "active"
    for device in Device.objects.filter(node=node):
        assert [holder for holder, _, _ in daemon_holdings(device_uid=device.uid)] == [reservation.id]


@pytest.mark.django_db(transaction=True)
def test_guard6_the_fake_daemon_refuses_claims_beyond_its_capacity_and_the_reservation_is_released() -> None:
    from reservations.delivery.daemon import daemon_claims

    pool = PoolFactory()
    node = one_node(pool, 2)
    NodeResourceFactory(node=node, resource="vcpu", allocatable=16)
    now = compute_now()
    # The node knows better: it holds a claim the control plane never made (a forged, stale one).
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO fake_daemon_claims"
            " (node_id, reservation_id, allocation_id, resources, node_profile, starts_at, ends_at)"
            " VALUES (%s, 'rsv_forged', %s, '{\"vcpu\": 12}', NULL, %s, %s)",
            [node.id, f"alloc_forged_{node.id}", now - timedelta(hours=1), now + timedelta(days=1)],
        )
    # The control plane sees 16 vCPUs free and books 8; the node has 4 left and refuses.
    reservation, created = reservation_create(request=gpu_request(pool, 1, resources={"vcpu": 8}), actor="t")
    assert created
    reservation.refresh_from_db()
    assert reservation.state == "released"
    assert reservation.release_reason.startswith("AllocationFailed: vcpu on ")
    assert "rsv_forged" in reservation.release_reason
    # The refusal left no trace on the node, and the release gave back the scalars it claimed.
    assert daemon_claims(reservation_id=reservation.pk) == []
    assert all(daemon_holdings(device_uid=d.uid) == [] for d in Device.objects.filter(node=node))
    assert NodeResource.objects.get(node=node, resource="vcpu").allocated == 0
    # What fits beside the forged claim is accepted.
    fits, _ = reservation_create(request=gpu_request(pool, 1, resources={"vcpu": 4}), actor="t")
    assert Reservation.objects.get(pk=fits.pk).state == "active"
    assert [claims.resources for claims in daemon_claims(reservation_id=fits.pk)] == [{"vcpu": 4}]


@pytest.mark.django_db(transaction=True)
def test_guard6_a_delivery_lost_after_commit_is_delivered_from_the_outbox(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from core.clock import set_clock_offset
    from reservations.delivery import sending
    from reservations.delivery.daemon import daemon_behind
    from reservations.delivery.outbox import outbox_deliver_due
    from reservations.models import Delivery

    def unreachable(**_: Any) -> None:
        raise ConnectionError("the node did not answer")

    pool = PoolFactory()
    node = one_node(pool, 2)
    monkeypatch.setattr(sending, "daemon_deliver", unreachable)
    reservation, _ = reservation_create(request=gpu_request(pool, 2), actor="t")
    uids = list(Device.objects.filter(node=node).values_list("uid", flat=True))
    assert all(daemon_holdings(device_uid=uid) == [] for uid in uids)
    assert Delivery.objects.filter(reservation=reservation, kind="assign", attempts=1).exists()
    monkeypatch.undo()
    set_clock_offset(timedelta(seconds=5))  # past the retry's backoff
    try:
        assert outbox_deliver_due() == 1
        assert outbox_deliver_due() == 0  # a second pass finds nothing left to deliver
    finally:
        set_clock_offset(timedelta(0))
    for uid in uids:
        assert [holder for holder, _, _ in daemon_holdings(device_uid=uid)] == [reservation.id]
    assert reservation.pk not in daemon_behind()


@pytest.mark.django_db(transaction=True)
def test_guard6_a_node_that_lost_its_record_is_resynced_on_demand() -> None:
    from reservations.delivery.daemon import daemon_behind, daemon_claims
    from reservations.delivery.sending import reservations_redeliver

    pool = PoolFactory()
    node = one_node(pool, 2)
    NodeResourceFactory(node=node, resource="vcpu", allocatable=8)
    reservation, _ = reservation_create(request=gpu_request(pool, 2, resources={"vcpu": 4}), actor="t")
    with connection.cursor() as cursor:
        for table in ("fake_daemon_assignments", "fake_daemon_claims"):
            cursor.execute(f"DELETE FROM {table} WHERE reservation_id = %s", [reservation.pk])
    assert reservation.pk in daemon_behind()
    assert reservations_redeliver() >= 1
    assert reservation.pk not in daemon_behind()
    for device in Device.objects.filter(node=node):
        assert [holder for holder, _, _ in daemon_holdings(device_uid=device.uid)] == [reservation.id]
    assert [claims.resources for claims in daemon_claims(reservation_id=reservation.pk)] == [{"vcpu": 4}]


@pytest.mark.django_db(transaction=True)
def test_guard6_a_delivery_reads_only_the_holders_that_could_overlap_and_still_sees_those_that_do() -> None:
    """An atom booked again and again keeps every earlier holder's row; a delivery reads none of those."""
    from reservations.delivery.daemon.assign import _assignments_and_holdings

    pool = PoolFactory()
    node = one_node(pool, 1)
    device = Device.objects.get(node=node)
    now = compute_now()
    with connection.cursor() as cursor:
        for index in range(5):  # earlier holders, each ended before the next booking starts
            cursor.execute(
                "INSERT INTO fake_daemon_assignments"
                " (node_id, device_uid, reservation_id, allocation_id, starts_at, ends_at)"
                " VALUES (%s, %s, %s, %s, %s, %s)",
                [
                    node.id,
                    device.uid,
                    f"rsv_old{index}",
                    f"alloc_old{index}",
                    now - timedelta(hours=10 - index),
                    now - timedelta(hours=9 - index),
                ],
            )
    reservation, _ = reservation_create(request=gpu_request(pool, 1), actor="t")
    reservation.refresh_from_db()
    assert reservation.state == "active"
    _, held = _assignments_and_holdings(reservation.id, [node.id])
    assert {holder for _, holder, _, _, _ in held[node.id][device.uid]} == {reservation.id}
    # A holder that does overlap is still read, so the daemon still refuses it.
    later = reservation_create(
        request=gpu_request(pool, 1, start_ms=int((now + timedelta(days=2)).timestamp() * 1000)), actor="t"
    ).reservation
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO fake_daemon_assignments"
            " (node_id, device_uid, reservation_id, allocation_id, starts_at, ends_at)"
            " VALUES (%s, %s, 'rsv_forged', 'alloc_forged', %s, %s)",
            [node.id, device.uid, now + timedelta(days=2), now + timedelta(days=3)],
        )
    _, held = _assignments_and_holdings(later.id, [node.id])
    assert "rsv_forged" in {holder for _, holder, _, _, _ in held[node.id][device.uid]}
