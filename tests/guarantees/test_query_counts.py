"""Statements per call on the hot paths, so a regression (an N+1, a re-read, a loop of UPDATEs) is caught.

Each bound is what the path needs today; the counts do not grow with the
number of pools, resources, atoms or allocations a call touches. The node
daemon's delivery runs after commit (`on_commit`), which these tests (inside
one transaction) do not run; it is not part of the request's transaction.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from core.models import ApiToken, Tenant
from inventory.models import Node, Pool
from tests.support.api import post, reservation_body
from tests.support.factories import (
    DeviceFactory,
    NodeFactory,
    NodeResourceFactory,
    OfferingFactory,
    PoolFactory,
    QuotaUsageFactory,
)

# Token + principal + bindings, and whether `last_used_at` is due: one statement.
AUTH = 1
# create: auth, the pool, the write rate counters (one upsert), the idempotency
# look-up, the transaction's savepoint, the clock, the reservation insert (with its
# outbox row and the worker's wake-up in the same statement), the two plan queries,
# then per member the node lock, the atoms lock, the allocation, the bookings and
# the scalar claim, and one statement each for quota and rollups.
CREATE_MAX = 19
# release: auth, the write rate counters, the locked row with its state and clock, the cut (allocations,
# counts, delete, shorten, scalars, quota, rollups), the row update (with its outbox
# row and both notifications in the same statement), its audit event, the savepoint
# and its release, then the allocations with their atoms.
RELEASE_MAX = 17
# summary and byPool: auth, the pools, the rollup rows; byPool then its fragmentation
# (one pass over the pool's kept node counts).
READ_MAX = 3
BY_POOL_MAX = READ_MAX + 1


@pytest.fixture
def scalar_node(gpu_node: Node) -> Node:
    """`gpu_node` with scalar resources, so a create claims several scalars at once."""
    for resource in ("vcpu", "memoryGiB", "hugepages1Gi"):
        NodeResourceFactory.create(node=gpu_node, resource=resource, allocatable=1000)
    return gpu_node


def statements(capture: CaptureQueriesContext) -> list[str]:
    return [query["sql"] for query in capture.captured_queries]


@pytest.mark.django_db
def test_create_and_release_stay_within_their_statement_budget(
    owner_client: APIClient, owned_pool: Pool, scalar_node: Node, django_assert_max_num_queries: Any
) -> None:
    resources = {"vcpu": 8, "memoryGiB": 64, "hugepages1Gi": 4}
    QuotaUsageFactory.create(pool=owned_pool, tenant_id="acme", resource="gpu", max=64)
    QuotaUsageFactory.create(pool=owned_pool, tenant_id="acme", resource="vcpu", max=64)
    post(owner_client, "capacity/summary", {"tenantId": "acme"})  # records the token's first use
    with django_assert_max_num_queries(CREATE_MAX):
        created = post(
            owner_client,
            "reservations/create",
            reservation_body(owned_pool, "acme", "a", gpus=4, resources=resources),
        )
    assert created.status_code == 201, created.json()
    assert len(created.json()["allocations"][0]["atoms"]) == 4
    ref = {"tenantId": "acme", "reservationId": created.json()["id"]}
    with django_assert_max_num_queries(RELEASE_MAX):
        released = post(owner_client, "reservations/release", ref)
    assert released.status_code == 200
    assert released.json()["state"] == "released"


@pytest.mark.django_db
def test_create_claims_every_scalar_quota_and_rollup_in_one_statement_each(
    owner_client: APIClient, owned_pool: Pool, scalar_node: Node
) -> None:
    QuotaUsageFactory.create(pool=owned_pool, tenant_id="acme", resource="gpu", max=64)
    QuotaUsageFactory.create(pool=owned_pool, tenant_id="acme", resource="vcpu", max=64)
    resources = {"vcpu": 8, "memoryGiB": 64, "hugepages1Gi": 4}
    with CaptureQueriesContext(connection) as capture:
        created = post(
            owner_client,
            "reservations/create",
            reservation_body(owned_pool, "acme", "b", gpus=4, resources=resources),
        )
    assert created.status_code == 201, created.json()
    sql = statements(capture)
    assert sum("UPDATE inventory_noderesource" in s for s in sql) == 1
    assert sum("UPDATE quota_usage" in s for s in sql) == 1
    assert sum("INSERT INTO pool_capacity_rollup" in s for s in sql) == 1
    # Nothing that was just written is read back for the answer.
    assert not any(s.lstrip().startswith('SELECT "device_bookings"') for s in sql)

    with CaptureQueriesContext(connection) as capture:
        post(
            owner_client, "reservations/release", {"tenantId": "acme", "reservationId": created.json()["id"]}
        )
    sql = statements(capture)
    assert sum("UPDATE inventory_noderesource" in s for s in sql) == 1
    assert sum("UPDATE quota_usage" in s for s in sql) == 1
    assert sum("INSERT INTO pool_capacity_rollup" in s for s in sql) == 1


@pytest.mark.django_db
def test_summary_and_by_pool_cost_a_fixed_number_of_statements_whatever_the_number_of_pools(
    owner_client: APIClient,
    owner_tenant: Tenant,
    offered_tenant: Tenant,
    owned_pool: Pool,
    gpu_node: Node,
    django_assert_max_num_queries: Any,
) -> None:
    from reservations.rollups.recount import rollup_rebuild_all

    for index in range(6):
        pool = PoolFactory.create(owner=offered_tenant, name=f"offered-{index}", gpu_model="A100")
        OfferingFactory.create(pool=pool, tenant=owner_tenant)
        node = NodeFactory.create(pool=pool, hostname=f"gpu-o-{index}")
        DeviceFactory.create(node=node, attributes={"gpuModel": "A100", "vramGiB": 80, "numaNode": 0})
    rollup_rebuild_all()
    post(owner_client, "capacity/summary", {"tenantId": "acme"})  # records the token's first use
    with django_assert_max_num_queries(READ_MAX):
        summary = post(owner_client, "capacity/summary", {"tenantId": "acme"})
    assert summary.status_code == 200
    assert len(summary.json()["pools"]) == 7
    with django_assert_max_num_queries(BY_POOL_MAX):
        by_pool = post(owner_client, "capacity/byPool", {"tenantId": "acme", "poolId": owned_pool.id})
    assert by_pool.status_code == 200 and by_pool.json()["rows"]


@pytest.mark.django_db
def test_authentication_is_one_statement_once_the_use_is_recorded(
    owner_client: APIClient, owned_pool: Pool
) -> None:
    post(owner_client, "capacity/summary", {"tenantId": "acme"})
    assert ApiToken.objects.filter(last_used_at__isnull=False).exists()
    with CaptureQueriesContext(connection) as capture:
        post(owner_client, "capacity/summary", {"tenantId": "acme"})
    sql = statements(capture)
    assert sum("core_apitoken" in s for s in sql) == AUTH
    assert not any("core_rolebinding" in s and "core_apitoken" not in s for s in sql)


@pytest.mark.django_db
def test_reservation_list_reads_allocations_and_atoms_in_one_statement(
    owner_client: APIClient, owned_pool: Pool, gpu_node: Node, django_assert_max_num_queries: Any
) -> None:
    for key in ("l1", "l2", "l3", "l4"):
        body = reservation_body(owned_pool, "acme", key)
        assert post(owner_client, "reservations/create", body).status_code == 201
    # auth, the page, its allocations with their atoms' uids
    with django_assert_max_num_queries(3):
        listed = post(owner_client, "reservations/list", {"tenantId": "acme"})
    assert [len(r["allocations"][0]["atoms"]) for r in listed.json()["reservations"]] == [2, 2, 2, 2]
