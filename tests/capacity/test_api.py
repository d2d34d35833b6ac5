"""The capacity reads through HTTP: who may see which pool, every input constraint, what a summary costs."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from inventory.models import Pool
from reservations.models import PoolCapacityRollup
from tests.support.api import ClientFor, assert_error, invalid_fields, post_json
from tests.support.factories import PoolFactory

SUMMARY = "capacity/summary"
BY_POOL = "capacity/byPool"
POOLS_CAPACITY = "pools/capacity"
ULID = "01k0000000000000000000000a"  # 26 Crockford characters


def rollup(pool: Pool, resource: str, **counts: int) -> PoolCapacityRollup:
    values = {"allocatable": 0, "provisioning": 0, "unhealthy": 0, "maintenance": 0, "unreachable": 0}
    values.update({k: v for k, v in counts.items() if k in values})
    total = sum(values.values())
    return PoolCapacityRollup.objects.create(
        pool=pool,
        resource=resource,
        total=total,
        allocated=counts.get("allocated", 0),
        reserved=counts.get("reserved", 0),
        **values,
    )


# --- Authentication and decisions ---------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("path", [SUMMARY, BY_POOL, POOLS_CAPACITY])
def test_no_token_is_unauthenticated(anonymous_client: APIClient, owned_pool: Pool, path: str) -> None:
    status, body = post_json(anonymous_client, path, {"tenantId": "acme", "poolId": owned_pool.pk})
    assert_error(status, body, "UNAUTHENTICATED", 401)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("path", "pool_id"),
    [
        pytest.param(SUMMARY, None, id="summary"),
        pytest.param(BY_POOL, f"pool_{ULID}", id="byPool-denied-before-the-pool-is-looked-up"),
    ],
)
def test_a_token_for_another_tenant_is_permission_denied(
    owner_client: APIClient, offered_tenant: Any, path: str, pool_id: str | None
) -> None:
    request = {"tenantId": "beta"} if pool_id is None else {"tenantId": "beta", "poolId": pool_id}
    status, body = post_json(owner_client, path, request)
    assert_error(status, body, "PERMISSION_DENIED", 403)


# A member of `tenant_id` names a pool it may not see: the answer is the one an unknown pool gets.
@pytest.mark.django_db
@pytest.mark.parametrize(
    ("tenant_id", "path", "pool"),
    [
        pytest.param("gamma", BY_POOL, "owned", id="neither-owned-nor-offered-byPool"),
        pytest.param("gamma", POOLS_CAPACITY, "owned", id="neither-owned-nor-offered-pools/capacity"),
        pytest.param("acme", BY_POOL, "unknown", id="an-unknown-pool-looks-like-an-invisible-one"),
        pytest.param("beta", BY_POOL, "archived", id="an-archived-pool-for-a-non-owner"),
    ],
)
def test_a_pool_the_caller_may_not_see_is_not_found(
    api_client_for: ClientFor,
    outsider_tenant: Any,
    owned_pool: Pool,
    archived_pool: Pool,
    tenant_id: str,
    path: str,
    pool: str,
) -> None:
    pool_id = {"owned": owned_pool.pk, "archived": archived_pool.pk, "unknown": f"pool_{ULID}"}[pool]
    client = api_client_for(tenant_id, "member")
    status, body = post_json(client, path, {"tenantId": tenant_id, "poolId": pool_id})
    assert_error(status, body, "NOT_FOUND", 404)


@pytest.mark.django_db
def test_an_offered_pool_answers_its_rows_ordered_by_resource(
    offered_client: APIClient, owned_pool: Pool
) -> None:
    rollup(owned_pool, "vcpu", allocatable=448)
    rollup(owned_pool, "gpu", allocatable=56, allocated=24, reserved=8, unhealthy=1, maintenance=7)

    status, body = post_json(offered_client, BY_POOL, {"tenantId": "beta", "poolId": owned_pool.pk})

    assert status == 200, body
    assert body["poolId"] == owned_pool.pk
    assert [row["resource"] for row in body["rows"]] == ["gpu", "vcpu"]
    # The whole row, as the contract names its fields (stated here, not taken from the code).
    gpu = body["rows"][0]
    updated_at = gpu.pop("updatedAt")
    assert isinstance(updated_at, int)
    assert gpu == {
        "poolId": owned_pool.pk,
        "resource": "gpu",
        "total": 64,
        "allocatable": 56,
        "allocated": 24,
        "reserved": 8,
        "available": 24,
        "provisioning": 0,
        "unhealthy": 1,
        "maintenance": 7,
        "unreachable": 0,
    }


@pytest.mark.django_db
def test_pools_capacity_answers_the_same_as_by_pool(owner_client: APIClient, owned_pool: Pool) -> None:
    rollup(owned_pool, "gpu", allocatable=8)
    body = {"tenantId": "acme", "poolId": owned_pool.pk}
    assert post_json(owner_client, POOLS_CAPACITY, body) == post_json(owner_client, BY_POOL, body)


@pytest.mark.django_db
def test_the_owner_sees_its_archived_pool(owner_client: APIClient, archived_pool: Pool) -> None:
    rollup(archived_pool, "gpu", allocatable=4)
    status, body = post_json(owner_client, BY_POOL, {"tenantId": "acme", "poolId": archived_pool.pk})
    assert status == 200
    assert body["rows"][0]["allocatable"] == 4


@pytest.mark.django_db
def test_summary_lists_owned_and_offered_pools_and_sums_gpu_rows_per_model(
    owner_client: APIClient, offered_client: APIClient, owned_pool: Pool, archived_pool: Pool
) -> None:
    other = PoolFactory.create(owner=owned_pool.owner, name="cpu-only", gpu_model="")
    rollup(owned_pool, "gpu", allocatable=8, allocated=2)
    rollup(owned_pool, "gpu.mig", allocatable=70)
    rollup(archived_pool, "gpu", allocatable=4)
    rollup(other, "gpu", allocatable=1)

    status, owner = post_json(owner_client, SUMMARY, {"tenantId": "acme"})
    assert status == 200
    assert {pool["poolId"] for pool in owner["pools"]} == {owned_pool.pk, archived_pool.pk, other.pk}
    assert owner["byGpuModel"]["H100"]["allocatable"] == 12
    assert owner["byGpuModel"]["H100"]["allocated"] == 2
    assert owner["byGpuModel"]["other"]["allocatable"] == 1

    status, offered = post_json(offered_client, SUMMARY, {"tenantId": "beta"})
    assert status == 200
    assert [pool["poolId"] for pool in offered["pools"]] == [owned_pool.pk]
    assert offered["pools"][0]["offered"] is True
    assert offered["byGpuModel"] == {
        "H100": {"total": 8, "allocatable": 8, "allocated": 2, "reserved": 0, "available": 6}
    }


@pytest.mark.django_db
def test_a_viewer_may_read_capacity(api_client_for: ClientFor, owned_pool: Pool) -> None:
    status, _ = post_json(
        api_client_for("acme", "viewer"), BY_POOL, {"tenantId": "acme", "poolId": owned_pool.pk}
    )
    assert status == 200


@pytest.mark.django_db
def test_an_operator_reads_every_tenant(operator_client: APIClient, owned_pool: Pool) -> None:
    status, body = post_json(operator_client, SUMMARY, {"tenantId": "beta"})
    assert status == 200
    assert [pool["poolId"] for pool in body["pools"]] == [owned_pool.pk]


@pytest.mark.django_db
def test_a_node_agent_may_not_read_capacity(node_agent_client: APIClient, owned_pool: Pool) -> None:
    status, body = post_json(node_agent_client, SUMMARY, {"tenantId": "acme"})
    assert_error(status, body, "PERMISSION_DENIED", 403)


# --- Input constraints (the seeds' tables) ------------------------------------------------

BAD_TENANT_IDS = [
    pytest.param("a" * 129, id="longer-than-128"),
    pytest.param("", id="empty"),
    pytest.param("acme corp", id="space"),
    pytest.param("acme/x", id="slash"),
    pytest.param("ácme", id="non-ascii"),
    pytest.param(" acme", id="leading-space"),
    pytest.param(12, id="number"),
    pytest.param(None, id="null"),
    pytest.param(["acme"], id="list"),
]

BAD_POOL_IDS = [
    pytest.param("pool_" + "0" * 53, id="longer-than-57"),
    pytest.param("pool_" + "0" * 25, id="ulid-too-short"),
    pytest.param("pool_01K0000000000000000000000A", id="uppercase"),
    pytest.param("pool_01k000000000000000000000il", id="excluded-letters"),
    pytest.param("node_" + ULID, id="wrong-prefix"),
    pytest.param(ULID, id="no-prefix"),
    pytest.param("", id="empty"),
    pytest.param(1, id="number"),
    pytest.param(None, id="null"),
]


@pytest.mark.django_db
@pytest.mark.parametrize("tenant_id", BAD_TENANT_IDS)
def test_summary_refuses_a_bad_tenant_id(owner_client: APIClient, tenant_id: Any) -> None:
    assert invalid_fields(*post_json(owner_client, SUMMARY, {"tenantId": tenant_id})) == {"tenantId"}


@pytest.mark.django_db
@pytest.mark.parametrize("tenant_id", BAD_TENANT_IDS)
def test_by_pool_refuses_a_bad_tenant_id(owner_client: APIClient, owned_pool: Pool, tenant_id: Any) -> None:
    fields = invalid_fields(
        *post_json(owner_client, BY_POOL, {"tenantId": tenant_id, "poolId": owned_pool.pk})
    )
    assert fields == {"tenantId"}


@pytest.mark.django_db
@pytest.mark.parametrize("path", [BY_POOL, POOLS_CAPACITY])
@pytest.mark.parametrize("pool_id", BAD_POOL_IDS)
def test_by_pool_refuses_a_bad_pool_id(
    owner_client: APIClient, owned_pool: Pool, path: str, pool_id: Any
) -> None:
    fields = invalid_fields(*post_json(owner_client, path, {"tenantId": "acme", "poolId": pool_id}))
    assert fields == {"poolId"}


@pytest.mark.django_db
def test_the_longest_valid_ids_are_accepted(api_client_for: ClientFor) -> None:
    from tests.support.factories import TenantFactory

    tenant_id = "t" * 128
    TenantFactory.create(id=tenant_id)
    client = api_client_for(tenant_id, "viewer")
    assert post_json(client, SUMMARY, {"tenantId": tenant_id})[0] == 200
    status, body = post_json(client, BY_POOL, {"tenantId": tenant_id, "poolId": "pool_" + "0" * 52})
    assert_error(status, body, "NOT_FOUND", 404)


@pytest.mark.django_db
def test_missing_required_fields_are_each_named(owner_client: APIClient) -> None:
    assert invalid_fields(*post_json(owner_client, BY_POOL, {})) == {"tenantId", "poolId"}
    assert invalid_fields(*post_json(owner_client, SUMMARY, {})) == {"tenantId"}


@pytest.mark.django_db
def test_an_unknown_field_is_refused_and_named(owner_client: APIClient, owned_pool: Pool) -> None:
    fields = invalid_fields(*post_json(owner_client, SUMMARY, {"tenantId": "acme", "tenantID": "acme"}))
    assert fields == {"tenantID"}


@pytest.mark.django_db
def test_every_bad_field_is_named_at_once(owner_client: APIClient) -> None:
    fields = invalid_fields(*post_json(owner_client, BY_POOL, {"tenantId": "", "poolId": "x", "extra": 1}))
    assert fields == {"tenantId", "poolId", "extra"}


@pytest.mark.django_db
def test_summary_costs_the_same_queries_whatever_the_number_of_pools(
    owner_client: APIClient, owned_pool: Pool
) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    rollup(owned_pool, "gpu", allocatable=8)
    post_json(owner_client, SUMMARY, {"tenantId": "acme"})  # records the token's first use
    with CaptureQueriesContext(connection) as one_pool:
        post_json(owner_client, SUMMARY, {"tenantId": "acme"})

    for index in range(5):
        pool = PoolFactory.create(owner=owned_pool.owner, name=f"more-{index}")
        rollup(pool, "gpu", allocatable=index)
        rollup(pool, "vcpu", allocatable=index)
    with CaptureQueriesContext(connection) as six_pools:
        status, body = post_json(owner_client, SUMMARY, {"tenantId": "acme"})

    assert status == 200 and len(body["pools"]) == 6
    assert len(six_pools) == len(one_pool)
