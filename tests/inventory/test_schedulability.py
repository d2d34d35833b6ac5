"""Which bucket each node state lands in, what the rollup then shows, and SQL and Python agree."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from django.db import connection

from inventory import schedulability
from inventory.models import Node
from inventory.schedulability import EXCLUDED, MAINTENANCE, PROVISIONING, SCHEDULABLE, UNHEALTHY, UNREACHABLE
from reservations.models import PoolCapacityRollup
from reservations.rollups.recount import rollup_rebuild
from tests.support.factories import (
    DeviceFactory,
    NodeFactory,
    NodeResourceFactory,
    PoolFactory,
    TenantFactory,
)

OWNER = "pool-owner"
OTHER = "other-tenant"


@dataclass(frozen=True)
class Case:
    name: str
    fields: dict[str, Any]
    bucket: str
    # Unhealthy atoms on the node (of its GPU_COUNT GPUs).
    unhealthy_atoms: int = 0


GPU_COUNT = 4
VCPU = 32
# The counts of a rollup row that a case predicts.
PREDICTED = ("allocatable", *schedulability.BUCKETS, "total")


def case(name: str, bucket: str, unhealthy_atoms: int = 0, **fields: Any) -> Case:
    return Case(name=name, fields=fields, bucket=bucket, unhealthy_atoms=unhealthy_atoms)


CASES = [
    case("a deployed platform host", SCHEDULABLE),
    case("an adopted host", SCHEDULABLE, provision_state="adopted"),
    case("tenant-owned in its owner's pool", SCHEDULABLE, trust="tenant-owned", owner=OWNER),
    case("tenant-owned in another tenant's pool", EXCLUDED, trust="tenant-owned", owner=OTHER),
    case("tenant-controlled", EXCLUDED, trust="tenant-controlled"),
    case("a controller", EXCLUDED, role="controller"),
    case("a storage node", EXCLUDED, role="storage"),
    case("a gateway in maintenance", EXCLUDED, role="gateway", maintenance=True),
    case("tenant-owned elsewhere and still deploying", EXCLUDED, trust="tenant-owned", owner=OTHER,
         provision_state="deploying"),
    case("discovered", PROVISIONING, provision_state="discovered"),
    case("adopting", PROVISIONING, provision_state="adopting"),
    case("deploying", PROVISIONING, provision_state="deploying"),
    case("deprovisioning", PROVISIONING, provision_state="deprovisioning"),
    case("failed", PROVISIONING, provision_state="failed"),
    case("no converged spec", PROVISIONING, converged_specs=0),
    case("no converged spec and in maintenance", PROVISIONING, converged_specs=0, maintenance=True),
    case("deploying and cordoned", PROVISIONING, provision_state="deploying", cordoned=True),
    case("in maintenance", MAINTENANCE, maintenance=True),
    case("cordoned", MAINTENANCE, cordoned=True),
    case("cordoned and disconnected", MAINTENANCE, cordoned=True, connectivity="disconnected"),
    case("in maintenance with a NoSchedule taint", MAINTENANCE, maintenance=True, noschedule_taints=1),
    case("disconnected", UNREACHABLE, connectivity="disconnected"),
    case("connectivity unknown", UNREACHABLE, connectivity="unknown"),
    case("disconnected and tainted", UNREACHABLE, connectivity="disconnected", noschedule_taints=2),
    case("a NoSchedule taint", UNHEALTHY, noschedule_taints=1),
    case("two NoSchedule taints and unhealthy atoms", UNHEALTHY, unhealthy_atoms=1, noschedule_taints=2),
    case("schedulable with unhealthy atoms", SCHEDULABLE, unhealthy_atoms=1),
    case("schedulable with every atom unhealthy", SCHEDULABLE, unhealthy_atoms=GPU_COUNT),
    case("cordoned with unhealthy atoms", MAINTENANCE, unhealthy_atoms=2, cordoned=True),
]  # fmt: skip


def expected_gpu_row(c: Case) -> dict[str, int]:
    """What the node's GPUs add to the pool's gpu row, per the seeds' bucket table."""
    numbers = dict.fromkeys(("allocatable", *schedulability.BUCKETS), 0)
    if c.bucket == SCHEDULABLE:
        numbers["allocatable"] = GPU_COUNT - c.unhealthy_atoms
        numbers[UNHEALTHY] = c.unhealthy_atoms
    elif c.bucket != EXCLUDED:
        # A node in a bucket puts all its atoms there, healthy or not.
        numbers[c.bucket] = GPU_COUNT
    numbers["total"] = sum(numbers.values())
    return numbers


def expected_vcpu_row(c: Case) -> dict[str, int] | None:
    if c.bucket == EXCLUDED:
        return None  # no counted node has vcpu: the pool gets no vcpu row
    numbers = dict.fromkeys(("allocatable", *schedulability.BUCKETS), 0)
    numbers["allocatable" if c.bucket == SCHEDULABLE else c.bucket] = VCPU
    numbers["total"] = VCPU
    return numbers


def make_node(c: Case) -> Node:
    owner = TenantFactory.create(id=OWNER)
    TenantFactory.create(id=OTHER)
    pool = PoolFactory.create(owner=owner)
    fields = dict(c.fields)
    if "owner" in fields:
        fields["owner_id"] = fields.pop("owner")
    node = NodeFactory.create(pool=pool, **fields)
    for index in range(GPU_COUNT):
        DeviceFactory.create(node=node, healthy=index >= c.unhealthy_atoms)
    # An unbookable MIG parent is not an atom: never counted anywhere.
    DeviceFactory.create(node=node, bookable=False)
    NodeResourceFactory.create(node=node, resource="vcpu", allocatable=VCPU)
    return node


def sql_bucket(node: Node) -> tuple[str, bool]:
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {schedulability.bucket_sql('n', 'p.owner_id')},"
            f" {schedulability.schedulable_sql('n', 'p.owner_id')}"
            " FROM inventory_node n JOIN inventory_pool p ON p.id = n.pool_id WHERE n.id = %s",
            [node.id],
        )
        row = cursor.fetchone()
    assert row is not None
    return row[0], row[1]


@pytest.mark.django_db
@pytest.mark.parametrize("c", CASES, ids=[c.name for c in CASES])
def test_the_node_lands_in_its_bucket_and_the_rollup_shows_it(c: Case) -> None:
    node = make_node(c)
    node = Node.objects.select_related("pool").get(pk=node.pk)

    bucket, schedulable = sql_bucket(node)
    assert schedulability.node_bucket(node) == c.bucket
    assert bucket == schedulability.node_bucket(node)
    assert schedulable is (c.bucket == SCHEDULABLE)
    assert all(term.ok for term in schedulability.predicate_terms(node)) is (c.bucket == SCHEDULABLE)

    rollup_rebuild(pool_id=node.pool_id)
    rows = {r.resource: r for r in PoolCapacityRollup.objects.filter(pool_id=node.pool_id)}
    gpu = rows["gpu"]
    shown = {name: getattr(gpu, name) for name in PREDICTED}
    assert shown == expected_gpu_row(c)
    assert gpu.allocated == gpu.reserved == 0
    assert gpu.available == gpu.allocatable

    vcpu_expected = expected_vcpu_row(c)
    if vcpu_expected is None:
        assert "vcpu" not in rows
    else:
        vcpu = rows["vcpu"]
        assert {name: getattr(vcpu, name) for name in PREDICTED} == vcpu_expected


@pytest.mark.django_db
def test_sql_and_python_agree_for_every_case_in_one_pool() -> None:
    """All the table's nodes side by side: one query classifies them as Python does, node by node."""
    owner = TenantFactory.create(id=OWNER)
    TenantFactory.create(id=OTHER)
    pool = PoolFactory.create(owner=owner)
    expected: dict[str, str] = {}
    for c in CASES:
        fields = dict(c.fields)
        if "owner" in fields:
            fields["owner_id"] = fields.pop("owner")
        node = NodeFactory.create(pool=pool, **fields)
        expected[node.id] = c.bucket
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT n.id, {schedulability.bucket_sql('n', 'p.owner_id')} FROM inventory_node n"
            " JOIN inventory_pool p ON p.id = n.pool_id WHERE n.pool_id = %s",
            [pool.id],
        )
        from_sql = dict(cursor.fetchall())
    nodes = Node.objects.select_related("pool").filter(pool=pool)
    from_python = {n.id: schedulability.node_bucket(n) for n in nodes}
    assert from_sql == from_python == expected


@pytest.mark.django_db
def test_a_node_of_a_pool_owned_by_its_owner_is_trusted_only_in_that_pool() -> None:
    owner = TenantFactory.create(id=OWNER)
    other = TenantFactory.create(id=OTHER)
    own_pool, their_pool = PoolFactory.create(owner=owner), PoolFactory.create(owner=other)
    mine = NodeFactory.create(pool=own_pool, trust="tenant-owned", owner=owner)
    moved = NodeFactory.create(pool=their_pool, trust="tenant-owned", owner=owner)
    for node in (mine, moved):
        DeviceFactory.create(node=node)
    rollup_rebuild(pool_id=own_pool.id)
    rollup_rebuild(pool_id=their_pool.id)
    assert PoolCapacityRollup.objects.get(pool=own_pool, resource="gpu").allocatable == 1
    assert PoolCapacityRollup.objects.get(pool=their_pool, resource="gpu").total == 0
