"""Reservations via the services and the API: create, get, list, release, renew, leases, preview.

(Creates that wait for a release: `test_waits.py`; the preview CLI: `tests/capacity/test_commands.py`.)
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from rest_framework.test import APIClient

from core.clock import compute_now, set_clock_offset
from core.errors import IdempotencyConflict
from inventory.models import Node, NodeResource, Pool
from reservations.lifecycle import deadlines
from reservations.lifecycle.deadlines import lease_expire_due
from reservations.models import Allocation, DeviceBooking, Reservation
from reservations.request.parse import parse_reservation_request
from reservations.selectors import reservation_list, reservation_state
from reservations.services import (
    reservation_create,
    reservation_release,
    reservation_renew,
)
from tests.support.api import post, reservation_body
from tests.support.factories import (
    QuotaUsageFactory,
)
from tests.support.placement import gpu_request, make_node


def table_counts() -> dict[str, int]:
    with connection.cursor() as cursor:
        out = {}
        for table in (
            "reservations_reservation",
            "reservations_allocation",
            "device_bookings",
            "fake_daemon_assignments",
        ):
            cursor.execute(f"SELECT count(*) FROM {table}")
            out[table] = cursor.fetchone()[0]
        cursor.execute("SELECT coalesce(sum(used), 0) FROM quota_usage")
        out["quota_used"] = cursor.fetchone()[0]
        cursor.execute("SELECT coalesce(sum(allocated), 0) FROM inventory_noderesource")
        out["scalars_allocated"] = cursor.fetchone()[0]
        cursor.execute(
            "SELECT coalesce(json_agg(json_build_array(pool_id, resource, allocated, reserved)"
            " ORDER BY pool_id, resource)::text, '') FROM pool_capacity_rollup"
        )
        out["rollups"] = hash(cursor.fetchone()[0])
    return out


def rollup(pool: Pool, resource: str = "gpu") -> tuple[int, int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT allocated, reserved FROM pool_capacity_rollup WHERE pool_id = %s AND resource = %s",
            [pool.id, resource],
        )
        row = cursor.fetchone()
    return (row[0], row[1]) if row else (0, 0)


# --- The API ----------------------------------------------------------------------


@pytest.mark.django_db
def test_create_answers_201_then_200_for_the_same_request_and_conflict_for_another(
    owner_client: APIClient, owned_pool: Pool, gpu_node: Node
) -> None:
    first = post(owner_client, "reservations/create", reservation_body(owned_pool, "acme"))
    assert first.status_code == 201, first.json()
    reservation = first.json()
    assert reservation["state"] == "active"
    assert reservation["allocations"][0]["nodeId"] == gpu_node.id
    assert len(reservation["allocations"][0]["atoms"]) == 2
    assert reservation["end"] - reservation["start"] == 3600 * 1000

    again = post(owner_client, "reservations/create", reservation_body(owned_pool, "acme", duration=3600))
    assert again.status_code == 200
    assert again.json()["id"] == reservation["id"]

    other = post(
        owner_client,
        "reservations/create",
        reservation_body(owned_pool, "acme", devices=[{"class": "gpu", "count": 3}]),
    )
    assert other.status_code == 409
    assert other.json()["error"]["code"] == "CONFLICT"
    assert Reservation.objects.count() == 1


@pytest.mark.django_db
def test_create_that_does_not_fit_is_no_capacity_with_the_reason(
    owner_client: APIClient, owned_pool: Pool, gpu_node: Node
) -> None:
    response = post(
        owner_client,
        "reservations/create",
        reservation_body(owned_pool, "acme", devices=[{"class": "gpu", "count": 9}]),
    )
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "NO_CAPACITY"
    assert error["details"][0]["code"] == "NO_FIT"


@pytest.mark.django_db
def test_create_needs_write_on_a_visible_pool(
    api_client_for: Any, outsider_client: APIClient, owned_pool: Pool, archived_pool: Pool, gpu_node: Node
) -> None:
    viewer = api_client_for("acme", "viewer")
    assert post(viewer, "reservations/create", reservation_body(owned_pool, "acme")).status_code == 403
    assert (
        post(outsider_client, "reservations/create", reservation_body(owned_pool, "gamma")).status_code == 404
    )
    offered = api_client_for("beta", "member")
    assert post(offered, "reservations/create", reservation_body(archived_pool, "beta")).status_code == 404


@pytest.mark.django_db
def test_quota_exceeded_through_the_api(offered_client: APIClient, owned_pool: Pool, gpu_node: Node) -> None:
    QuotaUsageFactory(pool=owned_pool, tenant_id="beta", resource="gpu", max=3)
    assert (
        post(offered_client, "reservations/create", reservation_body(owned_pool, "beta", "a")).status_code
        == 201
    )
    response = post(offered_client, "reservations/create", reservation_body(owned_pool, "beta", "b"))
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "QUOTA_EXCEEDED"
    assert DeviceBooking.objects.count() == 2


@pytest.mark.django_db
def test_get_list_release_and_renew_through_the_api(
    owner_client: APIClient, offered_client: APIClient, owned_pool: Pool, gpu_node: Node
) -> None:
    created = post(
        owner_client, "reservations/create", reservation_body(owned_pool, "acme", leaseSeconds=60)
    ).json()
    ref = {"tenantId": "acme", "reservationId": created["id"]}
    got = post(owner_client, "reservations/get", ref)
    assert got.status_code == 200 and got.json()["id"] == created["id"]
    # Another tenant's reservation does not exist for the caller.
    assert (
        post(
            offered_client, "reservations/get", {"tenantId": "beta", "reservationId": created["id"]}
        ).status_code
        == 404
    )

    renewed = post(owner_client, "reservations/renew", ref)
    assert renewed.status_code == 200 and renewed.json()["leaseExpiresAt"] >= created["leaseExpiresAt"]

    listed = post(owner_client, "reservations/list", {"tenantId": "acme"}).json()
    assert [r["id"] for r in listed["reservations"]] == [created["id"]] and listed["nextCursor"] is None

    released = post(owner_client, "reservations/release", ref)
    assert released.status_code == 200 and released.json()["state"] == "released"
    assert post(owner_client, "reservations/release", ref).json() == released.json()
    renew_after = post(owner_client, "reservations/renew", ref)
    assert renew_after.status_code == 409 and renew_after.json()["error"]["code"] == "CONFLICT"


@pytest.mark.django_db
def test_list_pages_newest_first_with_a_cursor(owned_pool: Pool) -> None:
    make_node(owned_pool, gpus=8)
    ids = []
    for index in range(5):
        set_clock_offset(timedelta(seconds=index), local=True)  # distinct created_at
        ids.append(
            reservation_create(
                request=gpu_request(owned_pool, 1, idempotency_key=f"p{index}"), actor="t"
            ).reservation.id
        )
    set_clock_offset(timedelta(seconds=10), local=True)
    seen: list[str] = []
    cursor = None
    while True:
        page, cursor = reservation_list(tenant_id=owned_pool.owner_id, limit=2, cursor=cursor)
        seen.extend(r.id for r in page)
        if cursor is None:
            break
    assert seen == list(reversed(ids))
    active, _ = reservation_list(tenant_id=owned_pool.owner_id, state="active")
    assert len(active) == 5
    assert reservation_list(tenant_id=owned_pool.owner_id, state="released")[0] == []


# --- The services --------------------------------------------------------------------


@pytest.mark.django_db
def test_idempotent_create_through_the_service(owned_pool: Pool) -> None:
    make_node(owned_pool, gpus=4)
    request = gpu_request(owned_pool, 1, idempotency_key="same")
    first, created = reservation_create(request=request, actor="t")
    again, created_again = reservation_create(request=request, actor="t")
    assert created and not created_again and again.id == first.id
    with pytest.raises(IdempotencyConflict):
        reservation_create(request=gpu_request(owned_pool, 2, idempotency_key="same"), actor="t")


@pytest.mark.django_db
def test_release_ends_bookings_now_deletes_future_ones_and_gives_everything_back(owned_pool: Pool) -> None:
    node = make_node(owned_pool, gpus=4, resources={"vcpu": 32})
    QuotaUsageFactory(pool=owned_pool, tenant=owned_pool.owner, resource="gpu", max=8)
    running, _ = reservation_create(request=gpu_request(owned_pool, 2, resources={"vcpu": 8}), actor="t")
    later = compute_now() + timedelta(hours=3)
    future, _ = reservation_create(
        request=gpu_request(owned_pool, 2, start_ms=int(later.timestamp() * 1000)), actor="t"
    )
    assert rollup(owned_pool) == (2, 2)
    assert NodeResource.objects.get(node=node).allocated == 8

    set_clock_offset(timedelta(minutes=10), local=True)
    now = compute_now()
    reservation_release(reservation=running, actor="t")
    booking = DeviceBooking.objects.filter(allocation__reservation=running).first()
    assert booking is not None and booking.during.upper == now  # history kept, shortened
    reservation_release(reservation=future, actor="t")
    assert not DeviceBooking.objects.filter(allocation__reservation=future).exists()
    assert NodeResource.objects.get(node=node).allocated == 0
    assert rollup(owned_pool) == (0, 0)
    assert rollup(owned_pool, "vcpu") == (0, 0)
    from ledger.models import QuotaUsage

    assert QuotaUsage.objects.get(pool=owned_pool).used == 0
    # Twice is harmless: nothing is given back twice.
    again = reservation_release(reservation=running, actor="t")
    assert again.state == "released" and NodeResource.objects.get(node=node).allocated == 0
    assert Allocation.objects.filter(reservation=running, released=True).count() == 1


@pytest.mark.django_db
def test_state_follows_the_database_clock(owned_pool: Pool) -> None:
    make_node(owned_pool, gpus=1)
    later = compute_now() + timedelta(hours=1)
    reservation, _ = reservation_create(
        request=gpu_request(owned_pool, 1, start_ms=int(later.timestamp() * 1000), duration_seconds=600),
        actor="t",
    )
    assert reservation_state(reservation) == "scheduled"
    set_clock_offset(timedelta(hours=1, minutes=1), local=True)
    assert reservation_state(reservation) == "active"
    set_clock_offset(timedelta(hours=2), local=True)
    assert reservation_state(reservation) == "ended"


@pytest.mark.django_db
def test_an_unrenewed_lease_is_released_by_the_reconciler_hook(owned_pool: Pool) -> None:
    make_node(owned_pool, gpus=2)
    leased, _ = reservation_create(request=gpu_request(owned_pool, 1, lease_seconds=60), actor="t")
    kept, _ = reservation_create(request=gpu_request(owned_pool, 1, lease_seconds=600), actor="t")
    assert lease_expire_due() == 0
    set_clock_offset(timedelta(seconds=90), local=True)
    assert lease_expire_due() == 1
    leased.refresh_from_db()
    kept.refresh_from_db()
    assert leased.state == "released" and leased.release_reason == "lease expired"
    assert kept.state == "active"
    renewed = reservation_renew(reservation=kept, actor="t")
    assert renewed.lease_expires_at is not None and renewed.lease_expires_at > compute_now()
    from worker import reconciler

    # Every reconciler pass runs the reservations' time-driven work.
    assert reconciler.reservations_reconcile is deadlines.reservations_reconcile


# --- Preview ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_preview_writes_nothing_and_agrees_with_create(
    owner_client: APIClient, owned_pool: Pool, gpu_node: Node
) -> None:
    # Exactly three GPUs: the best node by bin packing, and no choice among its atoms (equally good
    # atoms are picked in a per-plan random order, so with a fourth the two answers could differ).
    make_node(owned_pool, gpus=3)
    before = table_counts()
    preview = post(
        owner_client,
        "capacity/preview",
        reservation_body(owned_pool, "acme", devices=[{"class": "gpu", "count": 3}]),
    )
    assert preview.status_code == 200, preview.json()
    answer = preview.json()
    assert table_counts() == before
    assert answer["fits"] and answer["reason"] is None and answer["preemptible"] is None
    assert 1 <= len(answer["candidates"]) <= 10
    best = answer["candidates"][0]
    created = post(
        owner_client,
        "reservations/create",
        reservation_body(owned_pool, "acme", devices=[{"class": "gpu", "count": 3}]),
    )
    allocation = created.json()["allocations"][0]
    assert allocation["nodeId"] == best["nodeId"]
    assert sorted(allocation["atoms"]) == sorted(best["atoms"])


@pytest.mark.django_db
def test_preview_reports_a_reason_and_preemptible_spot_without_ids(
    owner_client: APIClient, owned_pool: Pool
) -> None:
    make_node(owned_pool, gpus=2)
    spot = reservation_create(request=gpu_request(owned_pool, 2, spot=True), actor="t").reservation
    answer = post(owner_client, "capacity/preview", reservation_body(owned_pool, "acme")).json()
    assert answer["fits"] is False and answer["candidates"] == []
    assert answer["reason"]["code"] == "NO_FIT"
    assert answer["preemptible"]["count"] == 1
    assert answer["preemptible"]["startsAt"] >= answer["start"] + 30_000
    assert spot.id not in str(answer)
    # A spot request is never offered displacement.
    spot_answer = post(
        owner_client, "capacity/preview", reservation_body(owned_pool, "acme", spot=True)
    ).json()
    assert spot_answer["preemptible"] is None


@pytest.mark.django_db
def test_preview_of_a_gang_and_of_whole_nodes(owner_client: APIClient, owned_pool: Pool) -> None:
    a = make_node(owned_pool, gpus=2, labels={"fabric": "f1"}, node_atom=True)
    b = make_node(owned_pool, gpus=2, labels={"fabric": "f1"}, node_atom=True)
    gang = post(
        owner_client, "capacity/preview", reservation_body(owned_pool, "acme", gang={"size": 2})
    ).json()
    assert gang["fits"] and {c["nodeId"] for c in gang["candidates"]} == {a.id, b.id}
    whole = post(
        owner_client,
        "capacity/preview",
        reservation_body(owned_pool, "acme", binding="node", devices=[{"class": "gpu", "count": 1}]),
    ).json()
    assert whole["fits"] and all(len(c["atoms"]) == 3 for c in whole["candidates"])
    assert any(a.id in c["atoms"] for c in whole["candidates"])


@pytest.mark.django_db
def test_the_api_body_parses_into_the_request_the_placer_takes(owned_pool: Pool) -> None:
    request = parse_reservation_request(reservation_body(owned_pool, "acme", duration="90m", spot=True))
    assert request.duration_seconds == 5400 and request.spot and request.devices[0].count == 2


@pytest.mark.django_db
def test_a_reservation_that_ran_to_its_end_gives_back_quota_and_scalars(owned_pool: Pool) -> None:
    node = make_node(owned_pool, gpus=2, resources={"vcpu": 16})
    QuotaUsageFactory(pool=owned_pool, tenant=owned_pool.owner, resource="gpu", max=2)
    reservation, _ = reservation_create(
        request=gpu_request(owned_pool, 2, resources={"vcpu": 4}, duration_seconds=600), actor="t"
    )
    from ledger.models import QuotaUsage

    assert QuotaUsage.objects.get(pool=owned_pool).used == 2
    set_clock_offset(timedelta(minutes=11), local=True)
    deadlines.reservations_reconcile()
    reservation.refresh_from_db()
    assert reservation.state == "ended"
    assert QuotaUsage.objects.get(pool=owned_pool).used == 0
    assert NodeResource.objects.get(node=node).allocated == 0
    # The bookings are history, untouched.
    assert DeviceBooking.objects.filter(allocation__reservation=reservation).count() == 2
    # And the tenant can book again.
    assert reservation_create(request=gpu_request(owned_pool, 2), actor="t").created


@pytest.mark.django_db
def test_preview_does_not_check_quota_but_create_does(
    offered_client: APIClient, owned_pool: Pool, gpu_node: Node
) -> None:
    QuotaUsageFactory(pool=owned_pool, tenant_id="beta", resource="gpu", max=1)
    preview = post(offered_client, "capacity/preview", reservation_body(owned_pool, "beta")).json()
    assert preview["fits"] is True
    created = post(offered_client, "reservations/create", reservation_body(owned_pool, "beta"))
    assert created.status_code == 409 and created.json()["error"]["code"] == "QUOTA_EXCEEDED"
    assert not Reservation.objects.exists()
