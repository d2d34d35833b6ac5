"""A node's agent reports a GPU unhealthy: the GPU and its atoms leave the schedulable capacity.

A GPU reported with `clears: true` is held back by the node (a process outside every
reservation) and comes back with the first report that no longer holds it; nothing else does.
"""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from core.models import AuditEvent
from inventory.models import Device, Node
from reservations.rollups.recount import rollup_rebuild
from tests.support.api import assert_error, post_json
from tests.support.records import snapshot, snapshot_after_rebuild
from tests.support.reports import gpu, mig, report

SICK = {"healthy": False, "reason": "XID 79: GPU has fallen off the bus"}


def send(client: APIClient, node: Node, gpus: list[dict[str, Any]]) -> tuple[int, Any]:
    return post_json(client, "inventory/report", {"nodeId": node.pk, "report": report(node.hostname, gpus)})


@pytest.mark.django_db
def test_an_unhealthy_gpu_and_its_mig_atoms_are_marked_and_stay_marked(
    node_agent_client: APIClient, gpu_node: Node, owner_client: APIClient
) -> None:
    gpus = [gpu(0, mig=mig("3g.40gb", "3g.40gb")), gpu(1)]
    status, body = send(node_agent_client, gpu_node, [{**gpus[0], "health": SICK}, gpus[1]])
    assert status == 200, body
    sick = Device.objects.filter(uid__startswith=gpus[0]["uuid"], node=gpu_node)
    assert sick.count() == 3 and not sick.filter(healthy=True).exists()
    assert Device.objects.get(uid=gpus[1]["uuid"]).healthy
    event = AuditEvent.objects.get(action="device.reported-unhealthy", data__device=gpus[0]["uuid"])
    assert event.reason == SICK["reason"]
    # The next report says nothing is wrong: an operator clears it, not the next heartbeat.
    status, _ = send(node_agent_client, gpu_node, gpus)
    assert status == 200 and not sick.filter(healthy=True).exists()


@pytest.mark.django_db
def test_a_malformed_health_is_refused_with_its_field(node_agent_client: APIClient, gpu_node: Node) -> None:
    status, body = send(node_agent_client, gpu_node, [{**gpu(0), "health": {"healthy": "no"}}])
    assert_error(status, body, "INVALID_INPUT", 400)
    assert body["error"]["details"][0]["field"] == "report.gpus[0].health.healthy"


# --- A hold the node lifts itself (`health.clears`) ----------------------------------------

STRANGER = {"healthy": False, "reason": "in use outside any reservation (pid 4242, python3)", "clears": True}


def unhealthy(client: APIClient, node: Node, resource: str = "gpu") -> int:
    """The `unhealthy` count of the node's pool's `resource` row, as `capacity/byPool` answers it."""
    body = {"tenantId": node.pool.owner_id, "poolId": node.pool_id}
    status, answer = post_json(client, "capacity/byPool", body)
    assert status == 200, answer
    (row,) = [row for row in answer["rows"] if row["resource"] == resource]
    count: int = row["unhealthy"]
    return count


@pytest.fixture
def counted(gpu_node: Node) -> Node:
    """`gpu_node` with its pool's rollup rows counted, so each report's delta lands on true rows."""
    rollup_rebuild(pool_id=gpu_node.pool_id)
    return gpu_node


def assert_rollups_match_a_rebuild(node: Node) -> None:
    assert snapshot([node.pool_id]) == snapshot_after_rebuild(node.pool)


@pytest.mark.django_db
def test_a_gpu_the_node_holds_back_is_unhealthy_until_a_report_no_longer_holds_it(
    node_agent_client: APIClient, counted: Node, owner_client: APIClient
) -> None:
    gpus = [gpu(0, mig=mig("3g.40gb", "3g.40gb")), gpu(1)]
    status, body = send(node_agent_client, counted, gpus)
    assert status == 200, body
    before = unhealthy(owner_client, counted, "gpu.mig")

    status, body = send(node_agent_client, counted, [{**gpus[0], "health": STRANGER}, gpus[1]])
    assert status == 200, body
    held = Device.objects.filter(uid__startswith=gpus[0]["uuid"], node=counted)
    assert held.count() == 3 and not held.filter(healthy=True).exists()
    assert set(held.values_list("node_hold", flat=True)) == {STRANGER["reason"]}
    # The GPU's two MIG atoms leave the schedulable capacity, as with any unhealthy report.
    assert unhealthy(owner_client, counted, "gpu.mig") == before + 2
    event = AuditEvent.objects.get(action="device.reported-unhealthy", data__device=gpus[0]["uuid"])
    assert (event.reason, event.subject_type, event.subject_id) == (STRANGER["reason"], "node", counted.pk)
    assert_rollups_match_a_rebuild(counted)

    # Held again (the same stranger): nothing new is written or audited.
    send(node_agent_client, counted, [{**gpus[0], "health": STRANGER}, gpus[1]])
    assert AuditEvent.objects.filter(action="device.reported-unhealthy").count() == 3

    # The stranger is gone: the next report does not hold the GPU, and it is healthy again.
    status, body = send(node_agent_client, counted, gpus)
    assert status == 200, body
    assert held.filter(healthy=True, node_hold="").count() == 3
    assert unhealthy(owner_client, counted, "gpu.mig") == before
    healed = AuditEvent.objects.get(action="device.reported-healthy", data__device=gpus[0]["uuid"])
    assert (healed.subject_id, STRANGER["reason"] in healed.reason) == (counted.pk, True)
    assert_rollups_match_a_rebuild(counted)


@pytest.mark.django_db
def test_a_quarantined_gpu_is_not_cleared_by_the_nodes_report(
    node_agent_client: APIClient, operator_client: APIClient, counted: Node, owner_client: APIClient
) -> None:
    gpus = [gpu(0), gpu(1)]
    send(node_agent_client, counted, gpus)
    clean = unhealthy(owner_client, counted)
    uid = gpus[0]["uuid"]
    status, body = post_json(
        operator_client, "devices/setHealth", {"deviceUid": uid, "healthy": False, "reason": "XID 48"}
    )
    assert status == 200, body
    before = unhealthy(owner_client, counted)
    assert before == clean + 1
    # Held by the node while quarantined, then no longer held: the quarantine stays.
    send(node_agent_client, counted, [{**gpus[0], "health": STRANGER}, gpus[1]])
    assert Device.objects.get(uid=uid).node_hold == ""
    send(node_agent_client, counted, gpus)
    assert not Device.objects.get(uid=uid).healthy
    assert unhealthy(owner_client, counted) == before


@pytest.mark.django_db
def test_an_operator_quarantining_a_held_gpu_keeps_it_out_after_the_hold(
    node_agent_client: APIClient, operator_client: APIClient, counted: Node
) -> None:
    gpus = [gpu(0), gpu(1)]
    send(node_agent_client, counted, [{**gpus[0], "health": STRANGER}, gpus[1]])
    uid = gpus[0]["uuid"]
    status, body = post_json(
        operator_client, "devices/setHealth", {"deviceUid": uid, "healthy": False, "reason": "keep it out"}
    )
    assert status == 200, body
    assert Device.objects.get(uid=uid).node_hold == ""
    send(node_agent_client, counted, gpus)
    assert not Device.objects.get(uid=uid).healthy


@pytest.mark.django_db
def test_an_operator_clearing_a_held_gpu_drops_the_hold(
    node_agent_client: APIClient, operator_client: APIClient, counted: Node
) -> None:
    gpus = [gpu(0, mig=mig("3g.40gb")), gpu(1)]
    send(node_agent_client, counted, [{**gpus[0], "health": STRANGER}, gpus[1]])
    status, body = post_json(
        operator_client, "devices/setHealth", {"deviceUid": gpus[0]["uuid"], "healthy": True}
    )
    assert status == 200, body
    devices = Device.objects.filter(uid__startswith=gpus[0]["uuid"])
    assert devices.filter(healthy=True, node_hold="").count() == 2


@pytest.mark.django_db
def test_a_held_gpu_reported_unhealthy_without_clears_stays_unhealthy(
    node_agent_client: APIClient, counted: Node, owner_client: APIClient
) -> None:
    gpus = [gpu(0), gpu(1)]
    send(node_agent_client, counted, gpus)
    clean = unhealthy(owner_client, counted)
    send(node_agent_client, counted, [{**gpus[0], "health": STRANGER}, gpus[1]])
    held = unhealthy(owner_client, counted)
    assert held == clean + 1
    # The stranger is gone but the GPU fell off the bus meanwhile: the mark sticks.
    send(node_agent_client, counted, [{**gpus[0], "health": SICK}, gpus[1]])
    device = Device.objects.get(uid=gpus[0]["uuid"])
    assert (device.healthy, device.node_hold) == (False, "")
    sick = AuditEvent.objects.filter(action="device.reported-unhealthy", data__device=gpus[0]["uuid"])
    assert list(sick.order_by("id").values_list("reason", flat=True)) == [STRANGER["reason"], SICK["reason"]]
    send(node_agent_client, counted, gpus)
    assert not Device.objects.get(uid=gpus[0]["uuid"]).healthy
    assert unhealthy(owner_client, counted) == held
    assert not AuditEvent.objects.filter(action="device.reported-healthy").exists()


@pytest.mark.django_db
def test_a_malformed_clears_is_refused_with_its_field(node_agent_client: APIClient, counted: Node) -> None:
    status, body = send(node_agent_client, counted, [{**gpu(0), "health": {**STRANGER, "clears": "yes"}}])
    assert_error(status, body, "INVALID_INPUT", 400)
    assert body["error"]["details"][0]["field"] == "report.gpus[0].health.clears"
