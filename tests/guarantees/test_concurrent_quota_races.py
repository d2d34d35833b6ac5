"""A concurrent quota under 16 racing clients: exactly as many pass as fit, at every instant.

Each client is a thread with its own HTTP client and database connection,
all released at once. The windows of one group overlap each other, so at most
`limit / asked` of the group fit together; two groups a week apart fit
separately in `concurrent` mode and together in `counter` mode. The
deterministic interleaving of two charges is
`test_guard_counters.test_guard5_a_concurrent_charge_that_waited_for_the_row_lock_sees_the_first_ones_bookings`.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from core.services import token_issue
from inventory.models import Pool
from ledger.models import QuotaMode, QuotaUsage
from tests.support.api import bearer_client, post_json
from tests.support.clock import HOUR_MS, now_ms
from tests.support.factories import OfferingFactory, PoolFactory, QuotaUsageFactory, TenantFactory
from tests.support.placement import make_node
from tests.support.threads import workers_race
from tests.support.torture.checks import check_concurrent_quota, check_no_double_booking, check_quota

CLIENTS = 16
LIMIT = 16
ASKED = 4
WEEK_MS = 7 * 24 * HOUR_MS
MINUTE_MS = 60_000


def pool_offered(mode: str) -> Pool:
    """Eight eight-GPU nodes offered to beta under a 16-GPU quota of `mode`: room for every client at once."""
    owner = TenantFactory(id="acme")
    TenantFactory(id="beta")
    pool = PoolFactory(owner=owner, name="race", gpu_model="H100")
    OfferingFactory(pool=pool, tenant_id="beta")
    QuotaUsageFactory(pool=pool, tenant_id="beta", resource="gpu", max=LIMIT, mode=mode)
    for _ in range(8):
        make_node(pool)
    return pool


def bodies(pool: Pool) -> list[tuple[str, dict[str, Any]]]:
    """Two groups of eight: an hour from now and a week later, each start five minutes after the last.

    Every window of a group overlaps every other of it (two hours long, at most
    35 minutes apart); the groups are a week apart.
    """
    start = now_ms() + HOUR_MS
    made = []
    for index in range(CLIENTS):
        group = "today" if index < CLIENTS // 2 else "next-week"
        offset = (WEEK_MS if group == "next-week" else 0) + (index % (CLIENTS // 2)) * 5 * MINUTE_MS
        body = {
            "tenantId": "beta",
            "poolId": pool.id,
            "devices": [{"class": "gpu", "count": ASKED}],
            "start": start + offset,
            "duration": "2h",
            "idempotencyKey": f"race-{index}",
        }
        made.append((group, body))
    return made


def race(pool: Pool) -> Counter[tuple[str, str]]:
    """Send every body at once from its own thread; (group, outcome) counts."""
    _, secret = token_issue(tenant_id="beta", role="member", name="racer")

    def client(body: dict[str, Any]) -> Any:
        def run() -> tuple[int, Any]:
            return post_json(bearer_client(secret), "reservations/create", body)

        return run

    made = bodies(pool)
    workers = workers_race([client(body) for _, body in made])
    outcomes: Counter[tuple[str, str]] = Counter()
    for (group, _), worker in zip(made, workers, strict=True):
        assert worker.error is None, worker.error
        status, answer = worker.result
        outcomes[(group, "created" if status == 201 else answer["error"]["code"])] += 1
    return outcomes


@pytest.mark.django_db(transaction=True)
def test_16_racing_clients_get_exactly_the_concurrent_quota_in_each_window() -> None:
    pool = pool_offered(QuotaMode.CONCURRENT)
    outcomes = race(pool)
    # 16 GPUs at any instant, 4 asked each: four per group, whatever the order they got the row lock in.
    assert outcomes == {
        ("today", "created"): LIMIT // ASKED,
        ("today", "QUOTA_EXCEEDED"): CLIENTS // 2 - LIMIT // ASKED,
        ("next-week", "created"): LIMIT // ASKED,
        ("next-week", "QUOTA_EXCEEDED"): CLIENTS // 2 - LIMIT // ASKED,
    }, outcomes
    assert QuotaUsage.objects.get(pool=pool).used == 2 * LIMIT
    assert check_concurrent_quota() == [] and check_quota() == [] and check_no_double_booking() == []


@pytest.mark.django_db(transaction=True)
def test_16_racing_clients_get_exactly_the_counter_quota_in_all() -> None:
    pool = pool_offered(QuotaMode.COUNTER)
    outcomes = race(pool)
    created = sum(count for (_, outcome), count in outcomes.items() if outcome == "created")
    refused = sum(count for (_, outcome), count in outcomes.items() if outcome == "QUOTA_EXCEEDED")
    assert (created, refused) == (LIMIT // ASKED, CLIENTS - LIMIT // ASKED), outcomes
    assert QuotaUsage.objects.get(pool=pool).used == LIMIT
    assert check_quota() == [] and check_no_double_booking() == []
