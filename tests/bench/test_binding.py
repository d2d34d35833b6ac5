"""`python -m bench.binding`: each way of sending statements is set on the connection it measures."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from bench.binding import WAYS, _connect_as, binding_run
from core.services import token_issue
from inventory.models import Pool
from tests.support.placement import make_node

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def service_settings_back() -> Any:
    options = dict(connection.settings_dict["OPTIONS"])
    yield
    connection.close()
    connection.settings_dict["OPTIONS"] = options


def _prepared_after_runs() -> int:
    for _ in range(8):
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM inventory_pool WHERE id = %s", ["binding-probe"])
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements")
        return int(cursor.fetchone()[0])


def test_only_the_prepared_ways_prepare() -> None:
    by_name = {way.name: way for way in WAYS}
    _connect_as(by_name["bound in the process"])
    assert _prepared_after_runs() == 0
    _connect_as(by_name["bound on the server, never prepared"])
    assert _prepared_after_runs() == 0
    _connect_as(by_name["prepared, planned every run"])
    assert _prepared_after_runs() > 0
    with connection.cursor() as cursor:
        cursor.execute("SHOW plan_cache_mode")
        assert cursor.fetchone()[0] == "force_custom_plan"
    _connect_as(by_name["prepared"])
    assert _prepared_after_runs() > 0
    with connection.cursor() as cursor:
        cursor.execute("SHOW plan_cache_mode")
        assert cursor.fetchone()[0] == "auto"


def test_every_way_is_measured(owned_pool: Pool) -> None:
    make_node(owned_pool, gpus=2)
    _, token = token_issue(tenant_id=owned_pool.owner_id, role="member", name="binding")
    result = binding_run(
        token=token, tenant_id=owned_pool.owner_id, pool_id=owned_pool.pk, rounds=1, samples=2
    )
    assert list(result) == [way.name for way in WAYS]
    for row in result.values():
        assert row["wall_ms"] > 0 and row["cpu_ms"] > 0 and row["db_cpu_ms"] >= 0
