"""`manage.py check_invariants`: the ledger's invariants as an operator runs them (after a restore).

Run as an operator does, as a child process on this test database: it passes
on a ledger with live and released reservations, and fails naming the
invariant when one counter no longer equals its recount.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection

from core.models import Tenant
from inventory.models import Node, Pool
from reservations.rollups.recount import rollup_rebuild_all
from tests.support.api import post_json, reservation_body
from tests.support.commands import child_env_on_this_database, run_python

pytestmark = pytest.mark.django_db(transaction=True)


def _check(*args: str) -> tuple[int, str]:
    result = run_python("manage.py", "check_invariants", *args, env=child_env_on_this_database(), timeout=120)
    return result.returncode, result.stdout + result.stderr


def _ledger(api_client_for: Any, pool: Pool, tenant: Tenant) -> None:
    rollup_rebuild_all()
    client = api_client_for(tenant.id, "member")
    made = [
        post_json(client, "reservations/create", reservation_body(pool, tenant.id, f"k{i}")) for i in range(3)
    ]
    assert all(status == 201 for status, _ in made), made
    status, answer = post_json(
        client, "reservations/release", {"tenantId": tenant.id, "reservationId": made[0][1]["id"]}
    )
    assert status == 200, answer


def test_every_invariant_holds_on_a_ledger_the_api_wrote(
    api_client_for: Any, owned_pool: Pool, owner_tenant: Tenant, gpu_node: Node
) -> None:
    _ledger(api_client_for, owned_pool, owner_tenant)
    code, output = _check()
    assert code == 0, output
    assert "all 10 invariants hold" in output
    assert "FAIL" not in output


def test_a_counter_that_no_longer_equals_its_recount_fails_by_name(
    api_client_for: Any, owned_pool: Pool, owner_tenant: Tenant, gpu_node: Node
) -> None:
    _ledger(api_client_for, owned_pool, owner_tenant)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE pool_capacity_rollup SET allocated = allocated + 1"
            " WHERE pool_id = %s AND resource = 'gpu'",
            [owned_pool.id],
        )
        assert cursor.rowcount == 1
    code, output = _check()
    assert code == 1, output
    assert "FAIL rollups equal a recount" in output
    assert "ok   no atom booked twice" in output
    code, output = _check("--json")
    report = json.loads(output.splitlines()[0])
    assert report["rollups equal a recount"] and not report["no atom booked twice"]
