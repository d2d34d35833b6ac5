"""Reservations via the services and the API: create, get, list, release, renew, leases, waits, preview.

(The preview CLI: `tests/capacity/test_commands.py`.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, connections
from rest_framework.test import APIClient

from core.clock import compute_now, set_clock_offset
from core.errors import IdempotencyConflict, NoCapacity, TooManyRequests
from inventory.models import Node, NodeResource, Pool
from reservations import services
from reservations.models import Allocation, DeviceBooking, Reservation
from reservations.request.parse import parse_reservation_request
from reservations.selectors import reservation_list, reservation_state
from reservations.services import (
    lease_expire_due,
    reservation_create,
    reservation_release,
    reservation_renew,
)
from reservations.waits import LISTENER
from tests.support.api import post, reservation_body
from tests.support.factories import (
    DeviceFactory,
    NodeFactory,
    NodeResourceFactory,
    PoolFactory,
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
    assert reconciler.reservations_reconcile is services.reservations_reconcile


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


# --- Waiting for a release -------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_wait_timeout_is_satisfied_by_a_concurrent_release(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = PoolFactory()
    node = NodeFactory(pool=pool)
    DeviceFactory(node=node)
    NodeResourceFactory(node=node, resource="vcpu", allocatable=8)
    holder, _ = reservation_create(request=gpu_request(pool, 1), actor="t")

    result: dict[str, Any] = {}

    def waiter() -> None:
        try:
            result["value"] = reservation_create(
                request=gpu_request(pool, 1, wait_timeout_ms=30000, idempotency_key="waiter"), actor="t"
            )
        except Exception as exc:  # reported to the main thread
            result["value"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=waiter)
    thread.start()
    wait_until(lambda: LISTENER.waiting() == 1)
    reservation_release(reservation=holder, actor="t")
    thread.join(60)
    assert not thread.is_alive()
    value = result["value"]
    assert not isinstance(value, Exception), value
    reservation, created = value
    assert created and reservation.allocations.get().node_id == node.id


def wait_until(condition: Callable[[], bool], seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the condition"
        time.sleep(0.01)


def drain_waiters(threads: list[threading.Thread], results: list[Any]) -> None:
    """Release whatever the waiters get until every one of them has its answer."""
    released: set[str] = set()
    deadline = time.monotonic() + 60
    while any(thread.is_alive() for thread in threads):
        assert time.monotonic() < deadline, "waiters did not finish"
        for made in [r for r in results if not isinstance(r, Exception)]:
            if made.reservation.pk not in released:
                reservation_release(reservation=made.reservation, actor="t")
                released.add(made.reservation.pk)
        time.sleep(0.02)


def backends_of_this_database() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])


def start_waiters(pool: Pool, count: int, tenant_key: str) -> tuple[list[threading.Thread], list[Any]]:
    results: list[Any] = []

    def waiter(index: int) -> None:
        try:
            results.append(
                reservation_create(
                    request=gpu_request(
                        pool, 1, wait_timeout_ms=30000, idempotency_key=f"{tenant_key}{index}"
                    ),
                    actor="t",
                )
            )
        except Exception as exc:  # reported to the main thread
            results.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=waiter, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    return threads, results


@pytest.mark.django_db(transaction=True)
def test_waiting_creates_hold_no_database_connection_and_a_release_wakes_them() -> None:
    pool = PoolFactory()
    node = NodeFactory(pool=pool)
    DeviceFactory(node=node)
    holder, _ = reservation_create(request=gpu_request(pool, 1), actor="t")
    LISTENER.start()  # the process's one listening connection, counted in the baseline
    before = backends_of_this_database()

    threads, results = start_waiters(pool, 5, "w")
    wait_until(lambda: LISTENER.waiting() == 5)
    # Five requests wait; once their attempts are over none of them holds a backend (the
    # main thread's is the baseline's). Held connections would keep the count up for good.
    wait_until(lambda: backends_of_this_database() <= before)

    reservation_release(reservation=holder, actor="t")
    # One of them gets the GPU; each release after that wakes the next one.
    drain_waiters(threads, results)
    assert [r for r in results if isinstance(r, Exception)] == []
    assert len(results) == 5


@pytest.mark.django_db(transaction=True)
def test_a_tenant_beyond_its_waiting_slots_is_told_to_retry_at_once_and_others_still_wait(
    settings: Any,
) -> None:
    settings.CAPACITY_WAITERS_PER_TENANT = 2
    pool = PoolFactory()
    node = NodeFactory(pool=pool)
    DeviceFactory(node=node)
    holder, _ = reservation_create(request=gpu_request(pool, 1), actor="t")

    threads, results = start_waiters(pool, 2, "a")
    wait_until(lambda: LISTENER.waiting() == 2)
    with pytest.raises(TooManyRequests) as refused:
        reservation_create(
            request=gpu_request(pool, 1, wait_timeout_ms=30000, idempotency_key="a3"), actor="t"
        )
    assert refused.value.retry_after >= 1
    # Another tenant's create still waits (its own slots).
    other = PoolFactory()
    other_node = NodeFactory(pool=other)
    DeviceFactory(node=other_node)
    other_holder, _ = reservation_create(request=gpu_request(other, 1), actor="t")
    other_threads, other_results = start_waiters(other, 1, "b")
    wait_until(lambda: LISTENER.waiting() == 3)

    reservation_release(reservation=holder, actor="t")
    reservation_release(reservation=other_holder, actor="t")
    drain_waiters(threads, results)
    drain_waiters(other_threads, other_results)
    assert [r for r in [*results, *other_results] if isinstance(r, Exception)] == []


@pytest.mark.django_db(transaction=True)
def test_wait_timeout_ends_in_no_capacity_without_a_release() -> None:
    pool = PoolFactory()
    node = NodeFactory(pool=pool)
    DeviceFactory(node=node)
    reservation_create(request=gpu_request(pool, 1), actor="t")
    with pytest.raises(NoCapacity):
        reservation_create(request=gpu_request(pool, 1, wait_timeout_ms=50), actor="t")


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
    services.reservations_reconcile()
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
