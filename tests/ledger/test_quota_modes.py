"""Concurrent quota (`quotaMode: "concurrent"`): the limit caps the peak over time, not the sum.

Set up through a fleet file, as an operator would, and booked through the
HTTP API, as a tenant would. The races are in
`tests/guarantees/test_concurrent_quota_races.py`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from core.clock import compute_now
from core.errors import InvalidInput
from core.models import Tenant
from fleets.load import fleet_load
from ledger.models import QuotaUsage
from ledger.services.quota import quota_limit_set
from reservations.selectors import holdings_peaks
from tests.support.api import ClientFor, assert_error, post_json
from tests.support.clock import HOUR_MS, now_ms
from tests.support.envelope import error_details
from tests.support.factories import TenantFactory
from tests.support.torture.checks import check_concurrent_quota, check_quota

DAY_MS = 24 * HOUR_MS
WEEK_MS = 7 * DAY_MS


def host(index: int, gpus: int = 8) -> dict[str, Any]:
    """A node of the test pool with `gpus` whole H100s and 64 vCPUs."""
    hostname = f"cq-{index:02d}"
    return {
        "hostname": hostname,
        "pool": "acme/cq",
        "report": {
            "hostname": hostname,
            "resources": {"vcpu": 64, "memoryGiB": 512},
            "gpus": [
                {
                    "uuid": f"GPU-00000000-0000-4000-8{index:03d}-{g:012d}",
                    "product": "NVIDIA H100 80GB HBM3",
                    "memoryMiB": 81559,
                    "numaNode": 0,
                    "pciBusId": f"00000000:{0x18 + g:02x}:00.0",
                    "mig": {"enabled": False, "instances": []},
                }
                for g in range(gpus)
            ],
        },
    }


def fleet(*, mode: str | None, quota: dict[str, int] | None = None, nodes: int = 3) -> dict[str, Any]:
    """acme's pool `cq` of `nodes` eight-GPU hosts, offered to beta with a 16-GPU quota."""
    offer: dict[str, Any] = {"tenant": "beta", "quota": quota or {"gpu": 16}}
    if mode is not None:
        offer["quotaMode"] = mode
    return {
        "tenants": [{"id": "acme", "name": "Acme"}, {"id": "beta", "name": "Beta"}],
        "pools": [{"name": "cq", "owner": "acme", "offers": [offer]}],
        "nodes": [host(i) for i in range(nodes)],
    }


def load(data: dict[str, Any]) -> str:
    """Load the fleet; the pool's id."""
    return fleet_load(data=data)["pools"]["acme/cq"]


def create(client: APIClient, pool_id: str, key: str, *, gpus: int = 8, **extra: Any) -> tuple[int, Any]:
    body = {
        "tenantId": "beta",
        "poolId": pool_id,
        "devices": [{"class": "gpu", "count": gpus}],
        "duration": "1d",
        "idempotencyKey": key,
        **extra,
    }
    return post_json(client, "reservations/create", body)


@pytest.fixture
def beta(api_client_for: ClientFor, offered_tenant: Tenant) -> APIClient:
    """A member of beta, the tenant the fleet's pool is offered to."""
    return api_client_for(offered_tenant.id, "member")


def book_today_and_next_week(client: APIClient, pool_id: str) -> list[tuple[int, Any]]:
    """16 GPUs today (two eight-GPU hosts), then 16 more next week."""
    next_week = now_ms() + WEEK_MS
    return [
        create(client, pool_id, "today-1"),
        create(client, pool_id, "today-2"),
        create(client, pool_id, "week-1", start=next_week),
        create(client, pool_id, "week-2", start=next_week),
    ]


@pytest.mark.django_db
def test_a_concurrent_quota_of_16_holds_16_today_and_16_next_week(beta: APIClient) -> None:
    pool_id = load(fleet(mode="concurrent"))
    answers = book_today_and_next_week(beta, pool_id)
    assert [status for status, _ in answers] == [201, 201, 201, 201], answers
    quota = QuotaUsage.objects.get(pool_id=pool_id, tenant_id="beta", resource="gpu")
    # `used` still counts everything held (it is what a release gives back); the limit is on each instant.
    assert (quota.mode, quota.used, quota.max) == ("concurrent", 32, 16)
    # A third host is free today, but the tenant already holds 16 then.
    status, body = create(beta, pool_id, "today-3")
    assert_error(status, body, "QUOTA_EXCEEDED", 409)
    assert error_details(body) == [
        {
            "field": "quota",
            "message": "gpu: 16 in use at the busiest instant of the window, a limit of 16, 8 asked",
            "resource": "gpu",
            "used": 16,
            "max": 16,
            "asked": 8,
        }
    ]
    assert "busiest instant" in body["error"]["message"]
    assert check_quota() == [] and check_concurrent_quota() == []


@pytest.mark.django_db
def test_a_counter_quota_refuses_next_weeks_16_as_before(beta: APIClient) -> None:
    pool_id = load(fleet(mode=None))
    answers = book_today_and_next_week(beta, pool_id)
    assert [status for status, _ in answers[:3]] == [201, 201, 409], answers
    assert error_details(answers[2][1]) == [
        {
            "field": "quota",
            "message": "gpu: 16 used, a limit of 16, 8 asked",
            "resource": "gpu",
            "used": 16,
            "max": 16,
            "asked": 8,
        }
    ]
    quota = QuotaUsage.objects.get(pool_id=pool_id, tenant_id="beta", resource="gpu")
    assert (quota.mode, quota.used) == ("counter", 16)


@pytest.mark.django_db
def test_a_window_that_overlaps_only_part_of_another_counts_the_peak_not_the_sum(beta: APIClient) -> None:
    """8 now for a day, 8 from tomorrow: at no instant are 16 held, so 8 more fit in the gap's overlap."""
    pool_id = load(fleet(mode="concurrent"))
    start = now_ms() + HOUR_MS
    assert create(beta, pool_id, "a", start=start, duration="1d")[0] == 201
    assert create(beta, pool_id, "b", start=start + DAY_MS, duration="1d")[0] == 201
    # Overlaps the end of the first and the start of the second: 16 at the peak, never 24.
    assert create(beta, pool_id, "c", start=start + 12 * HOUR_MS, duration="1d")[0] == 201
    # Any fourth eight that overlaps c and a or b would make 24.
    status, body = create(beta, pool_id, "d", start=start + 20 * HOUR_MS, duration="2h")
    assert_error(status, body, "QUOTA_EXCEEDED", 409)
    assert body["error"]["details"][0]["used"] == 16
    assert check_concurrent_quota() == []


@pytest.mark.django_db
def test_a_release_frees_the_window(beta: APIClient) -> None:
    pool_id = load(fleet(mode="concurrent"))
    created = [create(beta, pool_id, f"r-{i}") for i in range(2)]
    assert [status for status, _ in created] == [201, 201]
    assert create(beta, pool_id, "refused")[0] == 409
    status, _ = post_json(
        beta, "reservations/release", {"tenantId": "beta", "reservationId": created[0][1]["id"]}
    )
    assert status == 200
    assert create(beta, pool_id, "after-release")[0] == 201
    quota = QuotaUsage.objects.get(pool_id=pool_id, tenant_id="beta", resource="gpu")
    assert quota.used == 16
    assert check_quota() == [] and check_concurrent_quota() == []


@pytest.mark.django_db
def test_a_concurrent_scalar_quota_counts_claims_over_their_reservations_window(beta: APIClient) -> None:
    pool_id = load(fleet(mode="concurrent", quota={"vcpu": 64}))
    next_week = now_ms() + WEEK_MS
    assert create(beta, pool_id, "a", gpus=1, resources={"vcpu": 48})[0] == 201
    assert create(beta, pool_id, "b", gpus=1, resources={"vcpu": 48}, start=next_week)[0] == 201
    status, body = create(beta, pool_id, "c", gpus=1, resources={"vcpu": 32})
    assert_error(status, body, "QUOTA_EXCEEDED", 409)
    assert error_details(body) == [
        {
            "field": "quota",
            "message": "vcpu: 48 in use at the busiest instant of the window, a limit of 64, 32 asked",
            "resource": "vcpu",
            "used": 48,
            "max": 64,
            "asked": 32,
        }
    ]
    assert create(beta, pool_id, "d", gpus=1, resources={"vcpu": 16})[0] == 201
    assert check_quota() == [] and check_concurrent_quota() == []


@pytest.mark.django_db
def test_the_fleet_file_validates_quota_mode_and_a_reload_without_it_keeps_the_mode() -> None:
    bad = fleet(mode="peak")
    with pytest.raises(InvalidInput) as refused:
        fleet_load(data=bad)
    assert refused.value.details == [
        {"field": "pools[0].offers[0].quotaMode", "message": "must be one of counter, concurrent"}
    ]
    pool_id = load(fleet(mode="concurrent"))
    load(fleet(mode=None, quota={"gpu": 24}))
    quota = QuotaUsage.objects.get(pool_id=pool_id, tenant_id="beta", resource="gpu")
    assert (quota.mode, quota.max) == ("concurrent", 24)
    load(fleet(mode="counter"))
    quota.refresh_from_db()
    assert (quota.mode, quota.max) == ("counter", 16)


@pytest.mark.django_db
def test_switching_to_counter_raises_the_limit_to_what_is_held(beta: APIClient) -> None:
    """A concurrent quota may hold more in all than its limit; as a counter it keeps what is held."""
    pool_id = load(fleet(mode="concurrent"))
    book_today_and_next_week(beta, pool_id)
    quota_limit_set(pool_id=pool_id, tenant_id="beta", resource="gpu", limit=16, mode="counter")
    quota = QuotaUsage.objects.get(pool_id=pool_id, tenant_id="beta", resource="gpu")
    assert (quota.mode, quota.used, quota.max) == ("counter", 32, 32)
    # Lowering a concurrent limit keeps it as given: what is held stays, new charges wait for room.
    quota_limit_set(pool_id=pool_id, tenant_id="beta", resource="gpu", limit=8, mode="concurrent")
    quota.refresh_from_db()
    assert (quota.mode, quota.used, quota.max) == ("concurrent", 32, 8)
    assert create(beta, pool_id, "more", gpus=1, start=now_ms() + 3 * DAY_MS)[0] == 201
    assert create(beta, pool_id, "no-room", gpus=1)[0] == 409
    with pytest.raises(ValueError):
        quota_limit_set(pool_id=pool_id, tenant_id="beta", resource="gpu", limit=8, mode="peak")


@pytest.mark.django_db
def test_the_torture_check_catches_a_concurrent_quota_exceeded_at_some_instant(beta: APIClient) -> None:
    pool_id = load(fleet(mode="concurrent"))
    book_today_and_next_week(beta, pool_id)
    assert check_concurrent_quota() == []
    QuotaUsage.objects.filter(pool_id=pool_id, tenant_id="beta").update(max=12)
    problems = check_concurrent_quota()
    assert len(problems) == 2 and all("16 in use" in p and "limit 12" in p for p in problems), problems


# `copies` copies of one reservation with its allocation and its booking, `g` days later (or earlier),
# in state `state`, for one of `tenants` in turn: the bookings of one atom never overlap, so thousands
# fit on one GPU.
_COPIES_SQL = """
WITH src AS (
    SELECT r.*, a.node_id, a.resources, b.device_id, b.during
      FROM reservations_reservation r
      JOIN reservations_allocation a ON a.reservation_id = r.id
      JOIN device_bookings b ON b.allocation_id = a.id
     WHERE r.id = %(id)s
), copies AS (
    SELECT g, src.*, make_interval(days => g * %(direction)s) AS shift,
           (%(tenants)s::varchar[])[1 + g %% cardinality(%(tenants)s::varchar[])] AS copy_tenant
      FROM src, generate_series(1, %(copies)s) g
), reservations AS (
    INSERT INTO reservations_reservation
           (id, tenant_id, pool_id, request, request_digest, idempotency_key, spot, binding,
            starts_at, ends_at, state, release_reason, at_risk_reason, created_at)
    SELECT 'rsv_' || %(tag)s || lpad(g::text, 26, '0'), copy_tenant, pool_id, request, request_digest,
           %(tag)s || g, spot, binding, starts_at + shift, ends_at + shift, %(state)s, '', '', created_at
      FROM copies
    RETURNING id
), allocations AS (
    INSERT INTO reservations_allocation (id, reservation_id, node_id, resources, released, created_at)
    SELECT 'alloc_' || %(tag)s || lpad(g::text, 26, '0'), 'rsv_' || %(tag)s || lpad(g::text, 26, '0'),
           node_id, resources, %(state)s = 'released', created_at
      FROM copies WHERE 'rsv_' || %(tag)s || lpad(g::text, 26, '0') IN (SELECT id FROM reservations)
    RETURNING id
)
INSERT INTO device_bookings (device_id, allocation_id, purpose, during)
SELECT device_id, 'alloc_' || %(tag)s || lpad(g::text, 26, '0'), 'allocation',
       tstzrange(lower(during) + shift, upper(during) + shift, '[)')
  FROM copies WHERE 'alloc_' || %(tag)s || lpad(g::text, 26, '0') IN (SELECT id FROM allocations)
"""


@pytest.mark.django_db
def test_the_peak_query_reads_the_tenants_live_reservations_through_an_index(beta: APIClient) -> None:
    """Thousands of reservations in the pool (the tenant's history, others' calendars): the peak is a probe.

    `reservation_live_ends` alone would read every live reservation of the
    platform that ends after the window starts (here 3,000 future ones of 30
    other tenants); the tenant's and pool's index reads the tenant's own live
    ones, and their bookings come through `booking_allocation`.
    """
    pool_id = load(fleet(mode="concurrent", nodes=1))
    status, live = create(beta, pool_id, "live", gpus=1)
    assert status == 201
    others = [TenantFactory.create(id=f"cal-{index:02d}").id for index in range(30)]
    with connection.cursor() as cursor:
        # beta's history: released reservations, one a day before the live one.
        history: dict[str, Any] = {
            "direction": -1,
            "tag": "old",
            "tenants": ["beta"],
            "state": "released",
            "copies": 300,
        }
        cursor.execute(_COPIES_SQL, {"id": live["id"], **history})
        # Other tenants' calendars in the same pool: live reservations, one a day after it.
        calendar: dict[str, Any] = {
            "direction": 1,
            "tag": "cal",
            "tenants": others,
            "state": "scheduled",
            "copies": 3000,
        }
        cursor.execute(_COPIES_SQL, {"id": live["id"], **calendar})
        for table in ("reservations_reservation", "reservations_allocation", "device_bookings"):
            cursor.execute(f"ANALYZE {table}")
    plans: list[str] = []

    def explained(execute: Any, sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
        # The statement `holdings_peaks` sends, explained on its cursor first, then run.
        execute("EXPLAIN " + sql, params, many, context)
        plans.append("\n".join(row[0] for row in context["cursor"].fetchall()))
        return execute(sql, params, many, context)

    now = compute_now()
    with connection.execute_wrapper(explained):
        peaks = holdings_peaks(
            tenant_id="beta", pool_id=pool_id, start=now, end=now + timedelta(hours=1), resources=["gpu"]
        )
    assert peaks == {"gpu": 1}
    assert "reservation_tenant_pool_live" in plans[0], plans[0]
    assert "booking_allocation" in plans[0], plans[0]
    assert "Seq Scan" not in plans[0], plans[0]


@pytest.mark.django_db
def test_the_admin_shows_the_mode_and_an_operator_switches_it(operator: Client, beta: APIClient) -> None:
    pool_id = load(fleet(mode=None))
    book_today_and_next_week(beta, pool_id)
    quota = QuotaUsage.objects.get(pool_id=pool_id, tenant_id="beta", resource="gpu")
    assert quota.mode == "counter"
    page = operator.get(reverse("admin:ledger_quotausage_changelist"))
    assert page.status_code == 200 and "counter" in page.content.decode()
    response = operator.post(
        reverse("admin:ledger_quotausage_change", args=[quota.pk]), {"max": 16, "mode": "concurrent"}
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    quota.refresh_from_db()
    assert (quota.mode, quota.max) == ("concurrent", 16)
    # Next week's 16 fit now: the limit is on each instant.
    next_week = now_ms() + WEEK_MS
    assert create(beta, pool_id, "week-again", start=next_week)[0] == 201
