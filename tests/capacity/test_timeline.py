"""capacity.selectors.timeline: buckets against hand-counted bookings, defaults, limits and the API."""

from __future__ import annotations

from datetime import UTC
from typing import Any

import pytest
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange
from rest_framework.test import APIClient

from capacity.selectors.timeline import timeline_compute
from core.clock import compute_now, to_millis
from core.errors import InvalidInput
from inventory.models import Device, Node, Pool
from reservations.models import Allocation, DeviceBooking, PoolCapacityRollup
from tests.support.api import post
from tests.support.clock import HOUR_MS, MAX_MS, T0, at
from tests.support.envelope import without_request_id
from tests.support.factories import AllocationFactory, DeviceFactory, NodeFactory, PoolFactory
from tests.support.records import book

TIMELINE = "capacity/timeline"
T0_MS = to_millis(T0)
assert T0_MS is not None


def set_allocatable(pool: Pool, allocatable: int) -> None:
    PoolCapacityRollup.objects.update_or_create(
        pool=pool, resource="gpu", defaults={"allocatable": allocatable, "total": allocatable}
    )


def booked(answer: dict[str, Any]) -> list[int]:
    return [bucket["booked"] for bucket in answer["buckets"]]


@pytest.fixture
def pool() -> Pool:
    return PoolFactory(name="timeline")


@pytest.fixture
def node(pool: Pool) -> Node:
    return NodeFactory(pool=pool)


@pytest.fixture
def gpus(node: Node) -> list[Device]:
    return [DeviceFactory(node=node) for _ in range(4)]


@pytest.fixture
def allocation(node: Node) -> Allocation:
    return AllocationFactory(node=node)


@pytest.mark.django_db
def test_buckets_count_hand_counted_bookings_including_those_straddling_edges(
    pool: Pool, node: Node, gpus: list[Device], allocation: Allocation
) -> None:
    g1, g2, g3, g4 = gpus
    book(
        g1, at(minutes=0), at(minutes=60), allocation=allocation
    )  # ends exactly where bucket 1 starts: bucket 0 only
    book(g1, at(minutes=120), at(minutes=121), allocation=allocation)  # bucket 2
    book(g2, at(minutes=30), at(minutes=150), allocation=allocation)  # straddles buckets 0, 1 and 2
    book(g3, at(minutes=10), at(minutes=20), allocation=allocation)  # bucket 0
    book(g3, at(minutes=239), at(minutes=300), allocation=allocation)  # starts in bucket 3 and runs past `to`
    book(g4, at(minutes=-60), at(minutes=0), allocation=allocation)  # ends where the window starts: nowhere
    book(g4, at(minutes=60), at(minutes=61), allocation=allocation)  # bucket 1 ...
    book(
        g4, at(minutes=90), at(minutes=100), allocation=allocation
    )  # ... and again in bucket 1: one GPU, counted once
    set_allocatable(pool, 3)

    answer = timeline_compute(pool=pool, from_ms=T0_MS, to_ms=T0_MS + 4 * HOUR_MS, step_minutes=60)

    assert booked(answer) == [3, 2, 2, 1]
    assert [b["free"] for b in answer["buckets"]] == [0, 1, 1, 2]
    assert [b["start"] for b in answer["buckets"]] == [T0_MS + k * HOUR_MS for k in range(4)]
    assert [b["end"] for b in answer["buckets"]] == [T0_MS + (k + 1) * HOUR_MS for k in range(4)]
    assert (answer["poolId"], answer["from"], answer["to"]) == (pool.pk, T0_MS, T0_MS + 4 * HOUR_MS)
    assert (answer["stepMinutes"], answer["allocatable"]) == (60, 3)


@pytest.mark.django_db
def test_the_last_bucket_is_cut_at_to(pool: Pool, gpus: list[Device], allocation: Allocation) -> None:
    book(gpus[0], at(minutes=80), at(minutes=100), allocation=allocation)  # in the short last bucket [60, 90)
    book(
        gpus[1], at(minutes=90), at(minutes=120), allocation=allocation
    )  # starts at `to`: outside the timeline
    answer = timeline_compute(pool=pool, from_ms=T0_MS, to_ms=T0_MS + 90 * 60_000, step_minutes=60)
    assert booked(answer) == [0, 1]
    assert answer["buckets"][-1]["end"] == T0_MS + 90 * 60_000


@pytest.mark.django_db
def test_closed_and_open_range_bounds_are_counted_exactly(
    pool: Pool, gpus: list[Device], allocation: Allocation
) -> None:
    g1, g2, g3, _ = gpus
    # An inclusive end on a bucket's start touches that bucket.
    during = DateTimeTZRange(at(minutes=0), at(minutes=60), "[]")
    DeviceBooking.objects.create(device=g1, allocation=allocation, during=during)
    # An open start on a bucket's end does not touch the bucket before.
    during = DateTimeTZRange(at(minutes=60), at(minutes=90), "()")
    DeviceBooking.objects.create(device=g2, allocation=allocation, during=during)
    # An unbounded end runs to the end of the timeline.
    DeviceBooking.objects.create(
        device=g3, allocation=allocation, during=DateTimeTZRange(at(minutes=150), None)
    )
    answer = timeline_compute(pool=pool, from_ms=T0_MS, to_ms=T0_MS + 3 * HOUR_MS, step_minutes=60)
    assert booked(answer) == [1, 2, 1]


@pytest.mark.django_db
def test_mig_and_slot_atoms_and_other_pools_are_not_counted(
    pool: Pool, node: Node, gpus: list[Device], allocation: Allocation
) -> None:
    parent = DeviceFactory(node=node, bookable=False)
    mig = DeviceFactory(node=node, device_class="gpu.mig", parent=parent, uid=f"{parent.uid}/gi1/ci0")
    slot = DeviceFactory(node=node, device_class="gpu.slot", parent=parent, uid=f"{parent.uid}/s0")
    other_pool_gpu = DeviceFactory(node=NodeFactory(pool=PoolFactory()))
    for device in (mig, slot, other_pool_gpu):
        book(device, at(minutes=0), at(minutes=240), allocation=allocation)
    book(gpus[0], at(minutes=0), at(minutes=30), allocation=allocation)
    answer = timeline_compute(pool=pool, from_ms=T0_MS, to_ms=T0_MS + 4 * HOUR_MS, step_minutes=60)
    assert booked(answer) == [1, 0, 0, 0]


@pytest.mark.django_db
def test_free_never_goes_below_zero(pool: Pool, gpus: list[Device], allocation: Allocation) -> None:
    for gpu in gpus:
        book(gpu, at(minutes=0), at(minutes=60), allocation=allocation)
    set_allocatable(pool, 2)
    answer = timeline_compute(pool=pool, from_ms=T0_MS, to_ms=T0_MS + 2 * HOUR_MS, step_minutes=60)
    assert booked(answer) == [4, 0]
    assert [b["free"] for b in answer["buckets"]] == [0, 2]


@pytest.mark.django_db
def test_allocatable_is_zero_without_a_gpu_rollup_row(pool: Pool, gpus: list[Device]) -> None:
    PoolCapacityRollup.objects.create(pool=pool, resource="gpu.mig", allocatable=7, total=7)
    answer = timeline_compute(pool=pool, from_ms=T0_MS, to_ms=T0_MS + HOUR_MS, step_minutes=60)
    assert answer["allocatable"] == 0
    assert answer["buckets"] == [{"start": T0_MS, "end": T0_MS + HOUR_MS, "booked": 0, "free": 0}]


@pytest.mark.django_db
def test_five_minute_buckets_split_a_booking_exactly(
    pool: Pool, gpus: list[Device], allocation: Allocation
) -> None:
    book(gpus[0], at(minutes=7), at(minutes=16), allocation=allocation)  # buckets [5,10), [10,15), [15,20)
    answer = timeline_compute(pool=pool, from_ms=T0_MS, to_ms=T0_MS + 30 * 60_000, step_minutes=5)
    assert booked(answer) == [0, 1, 1, 1, 0, 0]


@pytest.mark.django_db
def test_defaults_are_the_current_hour_24_hours_and_60_minutes(pool: Pool) -> None:
    # Inside the test's transaction `compute_now()` is fixed, so this is the function's "now" too.
    now = compute_now().astimezone(UTC)
    hour_ms = to_millis(now.replace(minute=0, second=0, microsecond=0))
    answer = timeline_compute(pool=pool, from_ms=None, to_ms=None, step_minutes=None)
    assert (answer["from"], answer["to"], answer["stepMinutes"]) == (hour_ms, hour_ms + 24 * HOUR_MS, 60)
    assert len(answer["buckets"]) == 24


@pytest.mark.django_db
def test_to_defaults_to_24_hours_after_a_given_from(pool: Pool) -> None:
    answer = timeline_compute(pool=pool, from_ms=T0_MS, to_ms=None, step_minutes=1440)
    assert answer["to"] == T0_MS + 24 * HOUR_MS
    assert len(answer["buckets"]) == 1


@pytest.mark.django_db
def test_a_timeline_is_one_statement_after_the_rollup_read(
    pool: Pool, django_assert_num_queries: Any
) -> None:
    with django_assert_num_queries(2):
        timeline_compute(pool=pool, from_ms=T0_MS, to_ms=T0_MS + 7 * 24 * HOUR_MS, step_minutes=30)


@pytest.mark.django_db
def test_the_limits_themselves_are_accepted(pool: Pool) -> None:
    answer = timeline_compute(pool=pool, from_ms=T0_MS, to_ms=T0_MS + 7 * 24 * HOUR_MS, step_minutes=30)
    assert len(answer["buckets"]) == 336
    assert len(timeline_compute(pool=pool, from_ms=0, to_ms=5 * 60_000, step_minutes=5)["buckets"]) == 1


@pytest.mark.parametrize(
    ("from_ms", "to_ms", "step", "field"),
    [
        (T0_MS, T0_MS + HOUR_MS, 4, "stepMinutes"),
        (T0_MS, T0_MS + HOUR_MS, 1441, "stepMinutes"),
        (T0_MS, T0_MS, 60, "to"),
        (T0_MS, T0_MS - HOUR_MS, 60, "to"),
        (T0_MS, T0_MS + 7 * 24 * HOUR_MS + 1, 1440, "to"),
        (T0_MS, T0_MS + 7 * 24 * HOUR_MS, 29, "stepMinutes"),  # 348 buckets
        (-1, T0_MS, 60, "from"),
        (T0_MS, MAX_MS + 1, 60, "to"),
    ],
)
@pytest.mark.django_db
def test_every_limit_is_invalid_input_naming_the_field(
    pool: Pool, from_ms: int, to_ms: int, step: int, field: str
) -> None:
    with pytest.raises(InvalidInput) as exc:
        timeline_compute(pool=pool, from_ms=from_ms, to_ms=to_ms, step_minutes=step)
    assert [d["field"] for d in exc.value.details] == [field]


# --- Through the API, with real tokens ----------------------------------------------------


@pytest.mark.django_db
def test_the_owner_reads_the_timeline(owner_client: APIClient, owned_pool: Pool, gpu_node: Node) -> None:
    allocation = AllocationFactory(node=gpu_node)
    for gpu in Device.objects.filter(node=gpu_node)[:3]:
        book(gpu, at(minutes=0), at(minutes=90), allocation=allocation)
    set_allocatable(owned_pool, 8)
    response = post(
        owner_client,
        TIMELINE,
        {
            "tenantId": "acme",
            "poolId": owned_pool.pk,
            "from": T0_MS,
            "to": T0_MS + 3 * HOUR_MS,
            "stepMinutes": 60,
        },
    )
    assert response.status_code == 200, response.json()
    body = response.json()
    assert list(body) == ["poolId", "from", "to", "stepMinutes", "allocatable", "buckets"]
    assert body["allocatable"] == 8
    assert [(b["booked"], b["free"]) for b in body["buckets"]] == [(3, 5), (3, 5), (0, 8)]


@pytest.mark.django_db
def test_the_offered_tenant_reads_the_timeline_with_defaults(
    offered_client: APIClient, owned_pool: Pool
) -> None:
    response = post(offered_client, TIMELINE, {"tenantId": "beta", "poolId": owned_pool.pk})
    assert response.status_code == 200, response.json()
    assert len(response.json()["buckets"]) == 24


@pytest.mark.django_db
def test_a_viewer_may_read_the_timeline(api_client_for: Any, owned_pool: Pool) -> None:
    response = post(api_client_for("acme", "viewer"), TIMELINE, {"tenantId": "acme", "poolId": owned_pool.pk})
    assert response.status_code == 200


@pytest.mark.django_db
def test_a_pool_the_tenant_cannot_see_is_not_found(
    outsider_client: APIClient, offered_client: APIClient, owned_pool: Pool, archived_pool: Pool
) -> None:
    assert post(outsider_client, TIMELINE, {"tenantId": "gamma", "poolId": owned_pool.pk}).json()["error"][
        "code"
    ] == ("NOT_FOUND")
    archived = post(offered_client, TIMELINE, {"tenantId": "beta", "poolId": archived_pool.pk})
    assert (archived.status_code, archived.json()["error"]["code"]) == (404, "NOT_FOUND")


@pytest.mark.django_db
def test_another_tenants_timeline_is_permission_denied(outsider_client: APIClient, owned_pool: Pool) -> None:
    response = post(outsider_client, TIMELINE, {"tenantId": "acme", "poolId": owned_pool.pk})
    assert (response.status_code, response.json()["error"]["code"]) == (403, "PERMISSION_DENIED")


@pytest.mark.django_db
def test_no_token_is_unauthenticated(anonymous_client: APIClient, owned_pool: Pool) -> None:
    response = post(anonymous_client, TIMELINE, {"tenantId": "acme", "poolId": owned_pool.pk})
    assert (response.status_code, response.json()["error"]["code"]) == (401, "UNAUTHENTICATED")


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"stepMinutes": 4}, "stepMinutes"),
        ({"stepMinutes": 1441}, "stepMinutes"),
        ({"stepMinutes": "60"}, "stepMinutes"),
        ({"from": -1}, "from"),
        ({"from": "now"}, "from"),
        ({"to": MAX_MS + 1}, "to"),
        ({"from": T0_MS, "to": T0_MS}, "to"),
        ({"from": T0_MS, "to": T0_MS + 8 * 24 * HOUR_MS}, "to"),
        ({"from": T0_MS, "to": T0_MS + 7 * 24 * HOUR_MS, "stepMinutes": 5}, "stepMinutes"),
        ({"tenantId": "a b"}, "tenantId"),
        ({"poolId": "pool_X"}, "poolId"),
        ({"until": T0_MS}, "until"),
    ],
)
@pytest.mark.django_db
def test_bad_input_through_the_api_is_invalid_input_naming_the_field(
    owner_client: APIClient, owned_pool: Pool, changes: dict[str, Any], field: str
) -> None:
    response = post(owner_client, TIMELINE, {"tenantId": "acme", "poolId": owned_pool.pk, **changes})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "INVALID_INPUT"
    assert [d["field"] for d in without_request_id(error["details"])] == [field]


@pytest.mark.django_db
def test_the_method_is_in_the_openapi_document(owner_client: APIClient) -> None:
    response = owner_client.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    text = response.content.decode()
    assert "/api/compute/capacity/timeline" in text
    assert "stepMinutes" in text
