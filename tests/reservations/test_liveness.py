"""Liveness (issue 12, item 3): a node that stops reporting is disconnected; its next report brings it back.

A node agent's report (`inventory/report`) marks the node connected with a
heartbeat at the database clock. `nodes_mark_stale()` disconnects a connected
node whose last report is older than `CAPACITY_NODE_STALE_SECONDS`, through
the guarded node write the placer locks against (guard 4), audited; the placer
then no longer offers it, over HTTP. Nodes that never reported (the fleet
file's and the demo's) are not watched, so they never flap.
"""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from rest_framework.test import APIClient

from core.clock import compute_now, set_clock_offset
from core.models import AuditEvent
from inventory.models import Node, Pool
from reservations.nodes.liveness import liveness_next_deadline, nodes_mark_stale
from tests.support.api import post_json, reservation_body
from tests.support.commands import run_command
from tests.support.factories import NodeFactory
from tests.support.paths import ROOT
from tests.support.reports import gpu, report
from tests.support.threads import JOIN_SECONDS, Worker

STALE = timedelta(seconds=120)


def _report(node: Node) -> dict[str, Any]:
    gpus = [{**gpu(i), "uuid": f"GPU-{node.hostname}-{i}"} for i in range(8)]
    return {"nodeId": node.pk, "report": report(node.hostname, gpus)}


@pytest.fixture
def reporting_node(owned_pool: Pool, node_agent_client: APIClient) -> Node:
    """A node whose agent has reported once, now: eight GPUs, scalars, a heartbeat."""
    node = NodeFactory.create(pool=owned_pool, hostname="gpu-live-001")
    status, body = post_json(node_agent_client, "inventory/report", _report(node))
    assert status == 200, body
    node.refresh_from_db()
    assert node.connectivity == "connected" and node.last_heartbeat_at is not None
    return node


def _preview(client: APIClient, pool: Pool) -> dict[str, Any]:
    status, body = post_json(client, "capacity/preview", reservation_body(pool, "acme", "live-preview"))
    assert status == 200, body
    return body


def _gpu_row(client: APIClient, pool: Pool) -> dict[str, Any]:
    status, body = post_json(client, "capacity/byPool", {"tenantId": "acme", "poolId": pool.id})
    assert status == 200, body
    return next(row for row in body["rows"] if row["resource"] == "gpu")


@pytest.mark.django_db
def test_a_node_that_stops_reporting_is_disconnected_and_its_next_report_reconnects_it(
    owned_pool: Pool, reporting_node: Node, owner_client: APIClient, node_agent_client: APIClient
) -> None:
    assert [c["nodeId"] for c in _preview(owner_client, owned_pool)["candidates"]] == [reporting_node.pk]

    # Just before the threshold nothing happens.
    set_clock_offset(STALE - timedelta(seconds=1))
    assert nodes_mark_stale() == 0
    assert Node.objects.get(pk=reporting_node.pk).connectivity == "connected"

    set_clock_offset(STALE + timedelta(seconds=5))
    assert nodes_mark_stale() == 1
    assert Node.objects.get(pk=reporting_node.pk).connectivity == "disconnected"
    event = AuditEvent.objects.get(subject_id=reporting_node.pk, action="node.disconnected")
    assert event.actor == "liveness" and event.reason.startswith("no report for 12"), event.reason
    assert nodes_mark_stale() == 0  # already disconnected: nothing more, no second event

    # The placer no longer offers it, in preview and in create.
    preview = _preview(owner_client, owned_pool)
    assert preview["fits"] is False and preview["candidates"] == []
    status, body = post_json(owner_client, "reservations/create", reservation_body(owned_pool, "acme", "k1"))
    assert status == 409 and body["error"]["code"] == "NO_CAPACITY", body
    gpus = _gpu_row(owner_client, owned_pool)
    assert (gpus["allocatable"], gpus["unreachable"]) == (0, 8)

    # Its next report brings it back.
    status, body = post_json(node_agent_client, "inventory/report", _report(reporting_node))
    assert status == 200, body
    assert Node.objects.get(pk=reporting_node.pk).connectivity == "connected"
    assert AuditEvent.objects.filter(subject_id=reporting_node.pk, action="node.connected").exists()
    assert [c["nodeId"] for c in _preview(owner_client, owned_pool)["candidates"]] == [reporting_node.pk]
    status, body = post_json(owner_client, "reservations/create", reservation_body(owned_pool, "acme", "k2"))
    assert status == 201, body
    assert _gpu_row(owner_client, owned_pool)["unreachable"] == 0


@pytest.mark.django_db(transaction=True)
def test_a_report_in_flight_wins_over_liveness(reporting_node: Node) -> None:
    """Guard 4: liveness takes the node row under its lock; a report holding it is left to decide."""
    holding = threading.Event()
    done = threading.Event()

    def report_in_flight() -> None:
        with transaction.atomic():
            Node.objects.select_for_update().get(pk=reporting_node.pk)
            holding.set()
            assert done.wait(JOIN_SECONDS)
            Node.objects.filter(pk=reporting_node.pk).update(last_heartbeat_at=compute_now())

    agent = Worker(report_in_flight)
    agent.start()
    assert holding.wait(JOIN_SECONDS)
    set_clock_offset(STALE * 2)  # this connection's clock only, reset below (no test transaction here)
    try:
        assert nodes_mark_stale() == 0
        done.set()
        agent.join_ok()
    finally:
        done.set()
        set_clock_offset(timedelta(0))
    assert Node.objects.get(pk=reporting_node.pk).connectivity == "connected"
    assert nodes_mark_stale() == 0


@pytest.mark.django_db
def test_the_next_liveness_deadline_is_the_oldest_heartbeat_plus_the_threshold(
    reporting_node: Node, owned_pool: Pool
) -> None:
    later = NodeFactory.create(pool=owned_pool, hostname="gpu-live-002")
    Node.objects.filter(pk=later.pk).update(last_heartbeat_at=reporting_node.last_heartbeat_at + STALE)
    assert liveness_next_deadline() == reporting_node.last_heartbeat_at + STALE
    Node.objects.filter(pk=reporting_node.pk).update(connectivity="disconnected")
    assert liveness_next_deadline() == reporting_node.last_heartbeat_at + STALE * 2


@pytest.mark.django_db
def test_fleet_file_nodes_that_never_report_are_not_watched_and_do_not_flap() -> None:
    ids = json.loads(run_command("load_fleet", str(ROOT / "fleets" / "demo.json")))
    before = dict(Node.objects.values_list("hostname", "connectivity"))
    assert len(before) == len(ids["nodes"]) and "connected" in before.values()
    assert not Node.objects.filter(last_heartbeat_at__isnull=False).exists()
    assert liveness_next_deadline() is None
    set_clock_offset(timedelta(days=3))
    assert nodes_mark_stale() == 0
    assert dict(Node.objects.values_list("hostname", "connectivity")) == before
    assert not AuditEvent.objects.filter(action="node.disconnected").exists()
