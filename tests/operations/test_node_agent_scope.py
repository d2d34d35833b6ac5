"""Node-agent tokens scoped to a pool or a node (issue 11, item 4).

A node agent reports for the nodes its token was issued for (`issue_token
--platform --role node-agent --pool P` or `--node N`) and for nothing else: a
report for any other node is PERMISSION_DENIED and changes nothing (devices,
scalars, heartbeat, audit trail), and `nodes/list` shows it only its nodes. A
node-agent token issued before scopes existed (no scope on its binding) keeps
its platform-wide reach.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from core.models import AuditEvent, Tenant
from core.services import token_issue
from inventory.models import Device, Node, NodeResource, Pool
from tests.support.api import assert_error, bearer_client, post_json
from tests.support.commands import run_command
from tests.support.envelope import error_without_request_id
from tests.support.factories import NodeFactory, PoolFactory
from tests.support.reports import gpu, report

UNKNOWN_NODE = "node_01k0000000000000000000000a"


@dataclass
class Fleet:
    pool_a: Pool
    pool_b: Pool
    a1: Node
    a2: Node
    b1: Node


def agent(*args: str) -> APIClient:
    """A node-agent client whose token `issue_token` printed, with these scope flags."""
    secret = run_command(
        "issue_token", "--platform", "--role", "node-agent", *args, stderr=io.StringIO()
    ).strip()
    return bearer_client(secret)


def full_report(node: Node) -> dict[str, Any]:
    """Eight GPUs (uuids of this node's own), scalars, a NIC and a disk."""
    gpus = [{**gpu(i), "uuid": f"GPU-{node.hostname}-{i}"} for i in range(8)]
    return {"nodeId": node.pk, "report": report(node.hostname, gpus)}


def wiping_report(node: Node) -> dict[str, Any]:
    """The attack of the issue: no GPUs at all and every scalar at zero."""
    zero = {"vcpu": 0, "memoryGiB": 0, "diskGiB": 0, "hugepages1Gi": 0}
    empty = {"hostname": node.hostname, "resources": zero, "gpus": [], "nics": [], "disks": []}
    return {"nodeId": node.pk, "report": empty}


def snapshot(node: Node) -> dict[str, Any]:
    """Everything a report can change on a node."""
    row = Node.objects.values("connectivity", "last_heartbeat_at", "updated_at").get(pk=node.pk)
    return {
        "node": row,
        "devices": sorted(
            Device.objects.filter(node=node).values_list("uid", "device_class", "healthy", "vanished_at")
        ),
        "scalars": sorted(NodeResource.objects.filter(node=node).values_list("resource", "allocatable")),
        "audit": AuditEvent.objects.filter(subject_id=node.pk).count(),
    }


@pytest.fixture
def fleet(owner_tenant: Tenant, operator_client: APIClient) -> Fleet:
    """Two pools; nodes a1 and a2 in A, b1 in B, each with eight GPUs and scalars from a real report."""
    pool_a = PoolFactory.create(owner=owner_tenant, name="pool-a")
    pool_b = PoolFactory.create(owner=owner_tenant, name="pool-b")
    nodes = {
        "a1": NodeFactory.create(pool=pool_a, hostname="a-001"),
        "a2": NodeFactory.create(pool=pool_a, hostname="a-002"),
        "b1": NodeFactory.create(pool=pool_b, hostname="b-001"),
    }
    for node in nodes.values():
        status, body = post_json(operator_client, "inventory/report", full_report(node))
        assert status == 200, body
    Node.objects.update(last_heartbeat_at=timezone.now() - timedelta(hours=1))
    return Fleet(pool_a=pool_a, pool_b=pool_b, **nodes)


def assert_refused_and_untouched(client: APIClient, node: Node) -> None:
    before = snapshot(node)
    status, body = post_json(client, "inventory/report", wiping_report(node))
    assert_error(status, body, "PERMISSION_DENIED", 403)
    after = snapshot(node)
    assert after == before
    assert len([d for d in after["devices"] if d[1] == "gpu" and d[3] is None]) == 8
    assert all(allocatable > 0 for _, allocatable in after["scalars"])


@pytest.mark.django_db
def test_a_pool_scoped_agent_reports_for_its_pools_nodes_only(fleet: Fleet) -> None:
    client = agent("--pool", fleet.pool_a.pk)
    for node in (fleet.a1, fleet.a2):
        status, body = post_json(client, "inventory/report", full_report(node))
        assert status == 200, body
        assert body["nodeId"] == node.pk
    assert_refused_and_untouched(client, fleet.b1)


@pytest.mark.django_db
def test_a_node_scoped_agent_reports_for_its_node_only(fleet: Fleet) -> None:
    client = agent("--node", fleet.a1.pk)
    before = Node.objects.get(pk=fleet.a1.pk).last_heartbeat_at
    status, body = post_json(client, "inventory/report", full_report(fleet.a1))
    assert status == 200, body
    after = Node.objects.get(pk=fleet.a1.pk).last_heartbeat_at
    assert before is not None and after is not None and after > before
    # The other node of its own pool is as much out of reach as another pool's.
    assert_refused_and_untouched(client, fleet.a2)
    assert_refused_and_untouched(client, fleet.b1)


@pytest.mark.django_db
def test_a_scoped_agent_cannot_tell_an_unknown_node_from_one_out_of_scope(fleet: Fleet) -> None:
    for client in (agent("--pool", fleet.pool_a.pk), agent("--node", fleet.a1.pk)):
        unknown = post_json(client, "inventory/report", {**full_report(fleet.a1), "nodeId": UNKNOWN_NODE})
        foreign = post_json(client, "inventory/report", wiping_report(fleet.b1))
        # The same answer but for each request's own id.
        assert (unknown[0], error_without_request_id(unknown[1])) == (
            foreign[0],
            error_without_request_id(foreign[1]),
        )
        assert_error(*unknown, "PERMISSION_DENIED", 403)


@pytest.mark.django_db
def test_a_scoped_agent_is_still_refused_everything_but_reports(fleet: Fleet) -> None:
    client = agent("--node", fleet.a1.pk)
    for method, body in (
        ("nodes/get", {"nodeId": fleet.a1.pk}),
        ("nodes/cordon", {"nodeId": fleet.a1.pk, "reason": "mine"}),
        ("capacity/summary", {"tenantId": "acme"}),
    ):
        assert_error(*post_json(client, method, body), "PERMISSION_DENIED", 403)
    assert not Node.objects.get(pk=fleet.a1.pk).cordoned


@pytest.mark.django_db
def test_an_unscoped_agent_token_keeps_its_platform_wide_reach(fleet: Fleet) -> None:
    """Tokens issued before scopes existed have no scope on their binding: they report for any node."""
    _, secret = token_issue(tenant_id=None, role="node-agent", name="legacy agent")
    client = bearer_client(secret)
    for node in (fleet.a1, fleet.b1):
        status, body = post_json(client, "inventory/report", full_report(node))
        assert status == 200, body
    # `--all-nodes` issues the same reach on purpose.
    status, _ = post_json(agent("--all-nodes"), "inventory/report", full_report(fleet.b1))
    assert status == 200
    status, body = post_json(client, "inventory/report", {**full_report(fleet.a1), "nodeId": UNKNOWN_NODE})
    assert_error(status, body, "NOT_FOUND", 404)


def listed(client: APIClient, **filters: Any) -> list[str]:
    status, body = post_json(client, "nodes/list", filters)
    assert status == 200, body
    return [node["hostname"] for node in body["nodes"]]


@pytest.mark.django_db
def test_nodes_list_shows_a_scoped_agent_only_its_nodes(fleet: Fleet, operator_client: APIClient) -> None:
    pool_agent = agent("--pool", fleet.pool_a.pk)
    node_agent = agent("--node", fleet.b1.pk)
    assert listed(operator_client) == ["a-001", "a-002", "b-001"]
    assert listed(agent("--all-nodes")) == ["a-001", "a-002", "b-001"]
    assert listed(pool_agent) == ["a-001", "a-002"]
    assert listed(node_agent) == ["b-001"]
    # Asking for another pool narrows, it never widens.
    assert listed(pool_agent, poolId=fleet.pool_b.pk) == []
    assert listed(node_agent, poolId=fleet.pool_a.pk) == []
    # Pages stay within the scope.
    status, body = post_json(pool_agent, "nodes/list", {"limit": 1})
    assert [n["hostname"] for n in body["nodes"]] == ["a-001"] and body["nextCursor"]
    status, body = post_json(pool_agent, "nodes/list", {"limit": 1, "cursor": body["nextCursor"]})
    # The last page of the scope: b-001 comes after it in hostname order, and is not there.
    assert (status, [n["hostname"] for n in body["nodes"]], body["nextCursor"]) == (200, ["a-002"], None)


@pytest.mark.django_db
def test_a_node_moved_to_another_pool_leaves_a_pool_scoped_agents_reach(fleet: Fleet) -> None:
    client = agent("--pool", fleet.pool_a.pk)
    Node.objects.filter(pk=fleet.a2.pk).update(pool=fleet.pool_b)
    assert_refused_and_untouched(client, fleet.a2)
    assert listed(client) == ["a-001"]
