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
from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH
from rest_framework.test import APIClient

from core.auth_cache import auth_cache_forget, auth_cache_start
from core.models import ApiToken, Tenant
from core.services import token_issue
from inventory.models import Node, Pool
from tests.support.api import post, reservation_body, served
from tests.support.driver import sent_to_the_server
from tests.support.factories import (
    DeviceFactory,
    NodeFactory,
    NodeResourceFactory,
    OfferingFactory,
    PoolFactory,
    QuotaUsageFactory,
)

# Token + principal + bindings, and whether `last_used_at` is due: one statement, the first
# time; a token used again within a second is remembered (`core.auth_cache`): none.
AUTH = 1
# create, in the request's transaction (a test's own transaction: its savepoint counts, and the
# delivery after commit does not run): the pool with the write rate counters (one statement),
# the savepoint, the reservation insert (with the clock, its outbox row and the worker's wake-up
# in the same statement), the plan, then per member the node lock, the atom lock, the allocation
# with its bookings and the scalar claim, and one statement for quota and rollups together.
CREATE_MAX = 10
# release: the savepoint, the locked row with its state and clock, the cut (allocations with
# their nodes, the bookings' counts with their end, scalars, quota with rollups), the row update
# (with its outbox row, its audit event, both notifications, the answer and the write rate
# counters), the savepoint's release.
RELEASE_MAX = 7
# The whole of each, as a server runs it (BEGIN and COMMIT are not statements the server sends
# through a cursor; Django's health check would be, and sends nothing over a healthy connection):
# the request, then its delivery to the node after the response.
# create + delivery: the pool with the rate counters, the insert, the plan, the node lock, the
# atom lock, the allocation with its bookings, quota with rollups; then the outbox claim, the
# nodes (their daemons held), the assignments with what the nodes hold, the nodes' new rows.
CREATE_DELIVERED_MAX = 11
# release + delivery: the locked row, the cut's three, the row update with the answer and the
# rate counters; then the outbox claim, the nodes' daemons held with the agent nodes read, their
# records cut.
RELEASE_DELIVERED_MAX = 8
# summary and byPool: the pools, the rollup rows; byPool then its fragmentation
# (one pass over the pool's kept node counts).
READ_MAX = 2
BY_POOL_MAX = READ_MAX + 1


@pytest.fixture(autouse=True)
def remembered_long_enough(settings: Any) -> None:
    """A token read a moment ago stays remembered for the measured request.

    The budgets count a request made just after the one that read its token;
    on a loaded machine that moment can pass the second a token is kept by
    default, and the count then includes the look-up it is meant to leave out.
    Any change to tokens or bindings still forgets it at once.
    """
    settings.AUTH_CACHE_SECONDS = 60


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
    assert auth_cache_start()
    post(owner_client, "capacity/summary", {"tenantId": "acme"})  # records the token's first use
    with django_assert_max_num_queries(CREATE_MAX + 1):  # + the scalar claim
        created = post(
            owner_client,
            "reservations/create",
            reservation_body(owned_pool, "acme", "a", gpus=4, resources=resources),
        )
    assert created.status_code == 201, created.json()
    assert len(created.json()["allocations"][0]["atoms"]) == 4
    ref = {"tenantId": "acme", "reservationId": created.json()["id"]}
    with django_assert_max_num_queries(RELEASE_MAX + 1):  # + the scalars given back
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
    # The write's rate count rides in the statement that releases the row.
    (counted,) = [s for s in sql if "core_ratewindow" in s]
    assert "SET state = 'released'" in counted


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
    assert auth_cache_start()
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
    assert auth_cache_start()
    post(owner_client, "capacity/summary", {"tenantId": "acme"})
    assert ApiToken.objects.filter(last_used_at__isnull=False).exists()
    auth_cache_forget()  # as a request more than a second later
    with CaptureQueriesContext(connection) as capture:
        post(owner_client, "capacity/summary", {"tenantId": "acme"})
    sql = statements(capture)
    assert sum("core_apitoken" in s for s in sql) == AUTH
    assert not any("core_rolebinding" in s and "core_apitoken" not in s for s in sql)
    # Within the second: remembered, no statement at all.
    with CaptureQueriesContext(connection) as capture:
        post(owner_client, "capacity/summary", {"tenantId": "acme"})
    assert not any("core_apitoken" in s or "core_rolebinding" in s for s in statements(capture))


def parsed_per_call(sent: list[str]) -> list[int]:
    """The byte lengths of the statements too long for psycopg to keep parsed.

    psycopg parses a statement's text (its placeholders) once and keeps it when the text is at
    most `MAX_CACHED_STATEMENT_LENGTH` bytes; a longer one is parsed again on every call (about
    0.2 ms of CPU for the plan's 4 kB).
    """
    return [size for size in (len(s.encode()) for s in sent) if size > MAX_CACHED_STATEMENT_LENGTH]


@pytest.mark.django_db(transaction=True)
def test_a_create_and_a_release_with_their_deliveries_stay_within_their_budget(
    owned_pool: Pool, gpu_node: Node
) -> None:
    """The shape the bench measures (one GPU, one hour, no scalars), served, committed and delivered for real.

    Counted at the driver (`sent_to_the_server`): Django's health check and
    anything else sent past its cursor wrapper count too.
    """
    _, secret = token_issue(tenant_id="acme", role="member", name="budget")
    assert auth_cache_start()
    status, _ = served("capacity/summary", secret, {"tenantId": "acme"})  # records the token's first use
    assert status == 200
    with sent_to_the_server() as sent:
        body = reservation_body(owned_pool, "acme", "d", gpus=1)
        status, created = served("reservations/create", secret, body)
    assert status == 201, created
    assert any("INSERT INTO fake_daemon_assignments" in s for s in sent)  # the delivery ran
    assert len(sent) <= CREATE_DELIVERED_MAX, "\n".join(sent)
    assert parsed_per_call(sent) == [], "a statement is parsed per call"
    with sent_to_the_server() as sent:
        status, released = served(
            "reservations/release", secret, {"tenantId": "acme", "reservationId": created["id"]}
        )
    assert status == 200 and released["state"] == "released"
    assert any("fake_daemon_assignments f SET ends_at" in s for s in sent)  # the node's record was cut
    assert len(sent) <= RELEASE_DELIVERED_MAX, "\n".join(sent)
    assert parsed_per_call(sent) == [], "a statement is parsed per call"


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
