"""Node reports: what a node agent reports (`inventory/report`) moves the pool's counts at once.

New and vanished inventory, a reconnect, a layout change, resources a pool no longer has, a
node of scalars only, and a report that beats a disconnect; the numbers are read over HTTP
(`capacity/byPool`) and the rows must equal a rebuild's recount.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from rest_framework.test import APIClient

from inventory.models import Node, Pool
from reservations.nodes import changes as node_events
from reservations.rollups.recount import rollup_rebuild
from tests.support.api import post
from tests.support.factories import NodeFactory, PoolFactory, TenantFactory
from tests.support.node_events import a_report, by_pool, counts, report
from tests.support.placement import make_node
from tests.support.records import audit_trail, snapshot, snapshot_after_rebuild


@pytest.fixture
def node(owned_pool: Pool) -> Node:
    """A node of the owned pool that has not reported yet."""
    return NodeFactory.create(pool=owned_pool, hostname="gpu-001")


@pytest.mark.django_db
def test_a_disconnect_loses_to_a_report_newer_than_its_cutoff(
    node_agent_client: APIClient, node: Node
) -> None:
    assert (
        post(node_agent_client, "inventory/report", {"nodeId": node.pk, "report": a_report(node)}).status_code
        == 200
    )
    node.refresh_from_db()
    assert node.last_heartbeat_at is not None
    cutoff = node.last_heartbeat_at  # liveness read the node as stale before this report came in

    kept = node_events.node_set_connectivity(
        node=node, connected=False, actor="liveness", reason="stale", heartbeat_before=cutoff
    )
    assert kept.connectivity == "connected"
    gone = node_events.node_set_connectivity(
        node=node,
        connected=False,
        actor="liveness",
        reason="stale",
        heartbeat_before=cutoff + timedelta(seconds=1),
    )
    assert gone.connectivity == "disconnected"
    assert audit_trail(node) == ["node.disconnected"]


@pytest.mark.django_db
def test_new_inventory_shows_at_once_and_vanished_inventory_leaves_at_once(
    node_agent_client: APIClient, owner_client: APIClient, owned_pool: Pool
) -> None:
    make_node(owned_pool, gpus=2)
    rollup_rebuild(pool_id=owned_pool.id)
    node = NodeFactory.create(pool=owned_pool, hostname="gpu-n-001")

    report(node_agent_client, node, gpus=4, vcpu=224)
    rows = by_pool(owner_client, owned_pool)
    assert rows["gpu"] == counts(allocatable=6)
    assert rows["vcpu"] == counts(allocatable=224)
    assert snapshot([owned_pool.id]) == snapshot_after_rebuild(owned_pool)

    report(node_agent_client, node, gpus=1, vcpu=100)
    rows = by_pool(owner_client, owned_pool)
    assert (rows["gpu"]["allocatable"], rows["vcpu"]["allocatable"]) == (3, 100)
    assert snapshot([owned_pool.id]) == snapshot_after_rebuild(owned_pool)


@pytest.mark.django_db
def test_a_report_reconnects_a_disconnected_node_on_the_record_and_in_the_counts(
    node_agent_client: APIClient, owner_client: APIClient, owned_pool: Pool, node: Node
) -> None:
    report(node_agent_client, node, gpus=2)
    node_events.node_set_connectivity(
        node=node, connected=False, actor="liveness", reason="no report for 120s"
    )
    assert by_pool(owner_client, owned_pool)["gpu"] == counts(unreachable=2)

    report(node_agent_client, node, gpus=2)

    assert by_pool(owner_client, owned_pool)["gpu"] == counts(allocatable=2)
    assert audit_trail(node) == ["node.disconnected", "node.connected"]
    assert snapshot([owned_pool.id]) == snapshot_after_rebuild(owned_pool)
    report(node_agent_client, node, gpus=2)  # a connected node's report is no reconnect
    assert audit_trail(node) == ["node.disconnected", "node.connected"]


@pytest.mark.django_db
def test_a_layout_change_counts_its_bookings_as_running_on_the_new_atoms(
    node_agent_client: APIClient, owner_client: APIClient, owned_pool: Pool, node: Node
) -> None:
    report(node_agent_client, node, gpus=2)
    rollup_rebuild(pool_id=owned_pool.id)

    report(node_agent_client, node, gpus=2, mig=["3g.40gb", "3g.40gb"])

    rows = by_pool(owner_client, owned_pool)
    # The MIG GPU is no atom now; its two instances are, booked (guard 2) for the change window.
    assert rows["gpu"] == counts(allocatable=1)
    assert rows["gpu.mig"] == counts(allocatable=2, allocated=2)
    assert snapshot([owned_pool.id]) == snapshot_after_rebuild(owned_pool)


@pytest.mark.django_db
def test_rows_of_resources_a_pool_no_longer_has_go_as_a_rebuild_drops_them(
    node_agent_client: APIClient, owner_client: APIClient, owned_pool: Pool, node: Node
) -> None:
    report(node_agent_client, node, gpus=1, mig=["3g.40gb", "3g.40gb"])
    assert "gpu.mig" in by_pool(owner_client, owned_pool)
    with connection.cursor() as cursor:  # the change window passed: the layout bookings are history
        cursor.execute("DELETE FROM device_bookings")
    rollup_rebuild(pool_id=owned_pool.id)

    report(node_agent_client, node, gpus=1)

    assert "gpu.mig" not in by_pool(owner_client, owned_pool)
    assert snapshot([owned_pool.id]) == snapshot_after_rebuild(owned_pool)


@pytest.mark.django_db
def test_a_scalar_only_node_report_keeps_a_gpu_row_for_the_pool(
    node_agent_client: APIClient, owner_client: APIClient
) -> None:
    pool = PoolFactory.create(owner=TenantFactory.create(id="acme"), name="cpu-only")
    node = NodeFactory.create(pool=pool, hostname="cpu-001")
    report(node_agent_client, node, gpus=0, vcpu=32)
    rows = by_pool(owner_client, pool)
    assert rows["gpu"] == counts()
    assert (rows["node"]["allocatable"], rows["vcpu"]["allocatable"]) == (1, 32)
    assert snapshot([pool.id]) == snapshot_after_rebuild(pool)
