"""A node's agent reports a GPU unhealthy: the GPU and its atoms leave the schedulable capacity."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from core.models import AuditEvent
from inventory.models import Device, Node
from tests.support.api import assert_error, post_json
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
