"""The statements a create and a release send again and again are planned once, not on every call.

A statement sent often enough is prepared (psycopg's `prepare_threshold`), and
PostgreSQL then plans it for the values of its first five runs; after that it
keeps one generic plan, unless that plan's estimate is worse than theirs, and
then it plans every run afresh. For a small statement that costs more of the
database's CPU than running it: the release's cut, written with `= ANY($1)`,
spent about 0.7 ms planning for 0.2 ms of work on the bench's fleet.

The choice follows the tables' statistics, so it is made here on a fleet with
a month of history (the bench's fill, analysed), not on a test's few rows.
`pg_prepared_statements` counts the plans of each statement on the connection.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection

from bench.fill import bookings_fill
from core.auth_cache import auth_cache_start
from core.postgres.conninfo import conninfo_of
from core.services import token_issue
from inventory.models import Pool
from tests.support.api import served

# PostgreSQL's own rule: five plans for the values given, then the generic one if it is no worse.
CUSTOM_PLANS_FIRST = 5
# The one-atom claim (`reservations.placer.option._lock_one_of`): its generic plan and the plans
# for the values given are estimated within a few per cent of each other, so which one PostgreSQL
# keeps depends on its version and the tables' statistics (on this fleet, the generic one under
# PostgreSQL 18 and a plan per create under 15). Left to the planner.
CLOSE_CALLS = ("SELECT d.id FROM inventory_device d WHERE d.id = ANY($1) AND d.node_id = $2",)
# Enough pairs that a statement planned on every run shows more than those five.
PAIRS = 16
NODES = 40
BOOKINGS_PER_NODE = 100


@pytest.fixture
def filled_pool(tmp_path: Path) -> Pool:
    """A generated fleet, loaded as an operator loads one and filled with a month of bookings."""
    path = tmp_path / "fleet.json"
    call_command("make_fleet", nodes=NODES, gpus_per_node=8, seed=1, out=str(path), stderr=io.StringIO())
    call_command("load_fleet", str(path), stdout=io.StringIO())
    bookings_fill(conninfo=conninfo_of(), target_bookings=NODES * BOOKINGS_PER_NODE)
    pool = Pool.objects.filter(sharing="exclusive", gpu_model="H100").order_by("owner_id", "name").first()
    assert pool is not None
    return pool


@pytest.mark.django_db(transaction=True)
def test_every_statement_a_create_and_a_release_repeat_is_planned_once_one_gpu_or_a_gang(
    filled_pool: Pool, settings: Any
) -> None:
    settings.AUTH_CACHE_SECONDS = 60
    tenant = filled_pool.owner_id
    _, secret = token_issue(tenant_id=tenant, role="member", name="plans")
    assert auth_cache_start()
    connection.close()  # the statements are prepared afresh, on the analysed tables
    # One GPU, the bench's create; then a gang of two, one allocation per node.
    for shape, extra in (("one", {}), ("gang", {"gang": {"size": 2}})):
        for index in range(PAIRS):
            body = {
                "tenantId": tenant,
                "poolId": filled_pool.pk,
                "devices": [{"class": "gpu", "count": 1}],
                "duration": 3600,
                "idempotencyKey": f"plans-{shape}-{index}",
                **extra,
            }
            status, created = served("reservations/create", secret, body)
            assert status == 201, created
            assert len(created["allocations"]) == (2 if extra else 1)
            ref = {"tenantId": tenant, "reservationId": created["id"]}
            status, released = served("reservations/release", secret, ref)
            assert status == 200 and released["state"] == "released", released
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements")
        plans = {" ".join(text.split()): (generic, custom) for text, generic, custom in cursor.fetchall()}
    cut = [text for text in plans if text.startswith("WITH bk AS MATERIALIZED")]
    assert len(cut) == 2, "the release's cut, for one allocation and for several: " + json.dumps(
        sorted(plans)
    )
    replanned = {
        text[:160]: counts
        for text, counts in plans.items()
        if counts[1] > CUSTOM_PLANS_FIRST and not text.startswith(CLOSE_CALLS)
    }
    assert replanned == {}, "planned on every run (generic, custom): " + repr(replanned)
    assert all(plans[text][0] > 0 for text in cut), "the cut never ran on a generic plan"
