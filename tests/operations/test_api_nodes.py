"""Node operations through the API: `nodes/*` and `devices/setHealth` for operators only, and
`inventory/report` for node agents."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from core.models import AuditEvent, Principal, RoleBinding
from core.services import token_issue
from inventory.models import Device, Node
from tests.support.api import ClientFor, bearer_client, post_json
from tests.support.envelope import error_details
from tests.support.factories import NodeFactory, PoolFactory, TenantFactory
from tests.support.records import audit_trail

UNKNOWN_NODE = "node_01k0000000000000000000000a"


@pytest.mark.django_db
def test_nodes_get_answers_the_node_with_state_taints_resources_and_atoms(
    operator_client: APIClient, gpu_node: Node
) -> None:
    status, body = post_json(operator_client, "nodes/get", {"nodeId": gpu_node.pk})
    assert status == 200, body
    assert (body["id"], body["hostname"], body["bucket"]) == (gpu_node.pk, "gpu-a-001", "schedulable")
    assert len(body["atoms"]) == 8
    assert {"taints", "resources", "cordoned", "maintenance", "connectivity"} <= set(body)


@pytest.mark.django_db
def test_cordon_and_uncordon_through_the_api(operator_client: APIClient, gpu_node: Node) -> None:
    status, body = post_json(operator_client, "nodes/cordon", {"nodeId": gpu_node.pk, "reason": "PSU swap"})
    assert status == 200, body
    assert (body["cordoned"], body["cordonReason"], body["bucket"]) == (True, "PSU swap", "maintenance")
    row = Node.objects.get(pk=gpu_node.pk)
    assert row.cordoned
    event = AuditEvent.objects.get(subject_id=gpu_node.pk, action="node.cordon")
    operator = Principal.objects.get(bindings__role="operator")
    assert operator.pk in event.actor

    status, body = post_json(operator_client, "nodes/uncordon", {"nodeId": gpu_node.pk})
    assert status == 200
    assert body["cordoned"] is False
    assert not Node.objects.get(pk=gpu_node.pk).cordoned
    assert audit_trail(gpu_node) == ["node.cordon", "node.uncordon"]


@pytest.mark.django_db
def test_taint_and_untaint_through_the_api(operator_client: APIClient, gpu_node: Node) -> None:
    body = {"nodeId": gpu_node.pk, "key": "gpu.example.com/xid", "value": "79", "effect": "NoSchedule"}
    status, answer = post_json(operator_client, "nodes/taint", body)
    assert status == 200, answer
    assert answer["noScheduleTaints"] == 1
    assert answer["taints"][0]["key"] == "gpu.example.com/xid"
    assert Node.objects.get(pk=gpu_node.pk).noschedule_taints == 1

    status, answer = post_json(
        operator_client, "nodes/untaint", {"nodeId": gpu_node.pk, "key": "gpu.example.com/xid"}
    )
    assert status == 200
    assert (answer["noScheduleTaints"], answer["taints"]) == (0, [])
    assert audit_trail(gpu_node) == ["node.taint", "node.untaint"]


@pytest.mark.django_db
def test_set_maintenance_through_the_api(operator_client: APIClient, gpu_node: Node) -> None:
    status, body = post_json(
        operator_client, "nodes/setMaintenance", {"nodeId": gpu_node.pk, "on": True, "reason": "fw"}
    )
    assert status == 200
    assert (body["maintenance"], body["maintenanceReason"]) == (True, "fw")
    assert Node.objects.get(pk=gpu_node.pk).maintenance
    assert audit_trail(gpu_node) == ["node.maintenance.on"]


@pytest.mark.django_db
def test_set_health_through_the_api(operator_client: APIClient, gpu_node: Node) -> None:
    device = gpu_node.devices.first()
    assert device is not None
    status, body = post_json(
        operator_client, "devices/setHealth", {"deviceUid": device.uid, "healthy": False, "reason": "xid"}
    )
    assert status == 200, body
    assert (body["uid"], body["healthy"], body["class"]) == (device.uid, False, "gpu")
    assert not Device.objects.get(pk=device.pk).healthy
    assert AuditEvent.objects.filter(
        subject_type="device", subject_id=device.uid, action="device.unhealthy"
    ).exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("method", "body"),
    [
        ("nodes/get", {}),
        ("nodes/cordon", {"reason": "r"}),
        ("nodes/uncordon", {}),
        ("nodes/taint", {"key": "k", "effect": "NoSchedule"}),
        ("nodes/untaint", {"key": "k"}),
        ("nodes/setMaintenance", {"on": True, "reason": "r"}),
    ],
)
def test_tenant_tokens_may_not_operate_nodes(
    api_client_for: ClientFor, owner_tenant: Any, gpu_node: Node, method: str, body: dict[str, Any]
) -> None:
    for role in ("viewer", "member"):
        status, answer = post_json(api_client_for("acme", role), method, {"nodeId": gpu_node.pk, **body})
        assert status == 403, answer
        assert answer["error"]["code"] == "PERMISSION_DENIED"
    assert Node.objects.get(pk=gpu_node.pk).cordoned is False
    assert not AuditEvent.objects.filter(subject_type="node").exists()


@pytest.mark.django_db
def test_an_operator_role_bound_to_a_tenant_may_not_operate_nodes(gpu_node: Node) -> None:
    token, secret = token_issue(tenant_id=gpu_node.pool.owner_id, role="member")
    RoleBinding.objects.create(principal=token.principal, role="operator", tenant_id=gpu_node.pool.owner_id)
    status, body = post_json(bearer_client(secret), "nodes/cordon", {"nodeId": gpu_node.pk, "reason": "r"})
    assert status == 403
    assert body["error"]["code"] == "PERMISSION_DENIED"


@pytest.mark.django_db
def test_a_tenant_token_may_not_set_device_health(owner_client: APIClient, gpu_node: Node) -> None:
    device = gpu_node.devices.first()
    assert device is not None
    status, _ = post_json(owner_client, "devices/setHealth", {"deviceUid": device.uid, "healthy": False})
    assert status == 403
    assert Device.objects.get(pk=device.pk).healthy


@pytest.mark.django_db
def test_unknown_nodes_and_devices_are_not_found(operator_client: APIClient) -> None:
    status, body = post_json(operator_client, "nodes/cordon", {"nodeId": UNKNOWN_NODE, "reason": "r"})
    assert (status, body["error"]["code"]) == (404, "NOT_FOUND")
    status, body = post_json(operator_client, "devices/setHealth", {"deviceUid": "GPU-nope", "healthy": True})
    assert (status, body["error"]["code"]) == (404, "NOT_FOUND")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("method", "body", "field"),
    [
        ("nodes/cordon", {"nodeId": "node_x", "reason": "r"}, "nodeId"),
        ("nodes/cordon", {"nodeId": UNKNOWN_NODE}, "reason"),
        ("nodes/taint", {"nodeId": UNKNOWN_NODE, "key": "k", "effect": "NoExecute"}, "effect"),
        ("nodes/setMaintenance", {"nodeId": UNKNOWN_NODE, "on": "yes"}, "on"),
        ("devices/setHealth", {"deviceUid": "GPU-1", "healthy": 1}, "healthy"),
        ("nodes/uncordon", {"nodeId": UNKNOWN_NODE, "force": True}, "force"),
    ],
)
def test_node_operation_inputs_are_validated(
    operator_client: APIClient, method: str, body: dict[str, Any], field: str
) -> None:
    status, answer = post_json(operator_client, method, body)
    assert status == 400
    assert answer["error"]["code"] == "INVALID_INPUT"
    assert field in {d["field"] for d in answer["error"]["details"]}


def a_report(hostname: str) -> dict[str, Any]:
    return {
        "hostname": hostname,
        "resources": {"vcpu": 224, "memoryGiB": 2016},
        "gpus": [
            {
                "uuid": "GPU-5a2c1f6e-0c3b-4a8e-9d7e-1b2c3d4e5f60",
                "product": "NVIDIA H100 80GB HBM3",
                "memoryMiB": 81559,
                "numaNode": 0,
                "pciBusId": "00000000:18:00.0",
                "mig": {"enabled": False, "instances": []},
            }
        ],
    }


@pytest.mark.django_db
def test_a_node_agent_can_report_but_not_cordon(node_agent_client: APIClient) -> None:
    node = NodeFactory.create(
        pool=PoolFactory.create(owner=TenantFactory.create(id="acme")), hostname="gpu-b-001"
    )

    status, body = post_json(
        node_agent_client, "inventory/report", {"nodeId": node.pk, "report": a_report("gpu-b-001")}
    )
    assert status == 200, body
    assert body["nodeId"] == node.pk
    assert "GPU-5a2c1f6e-0c3b-4a8e-9d7e-1b2c3d4e5f60" in {d["uid"] for d in body["devices"]}

    status, body = post_json(node_agent_client, "nodes/cordon", {"nodeId": node.pk, "reason": "r"})
    assert (status, body["error"]["code"]) == (403, "PERMISSION_DENIED")
    assert not Node.objects.get(pk=node.pk).cordoned


@pytest.mark.django_db
def test_a_tenant_token_may_not_report_inventory(owner_client: APIClient, gpu_node: Node) -> None:
    status, _ = post_json(
        owner_client, "inventory/report", {"nodeId": gpu_node.pk, "report": a_report("gpu-a-001")}
    )
    assert status == 403


@pytest.mark.django_db
def test_a_malformed_report_names_its_fields_under_report(
    node_agent_client: APIClient, gpu_node: Node
) -> None:
    report = a_report("gpu-a-001")
    report["gpus"][0]["memoryMiB"] = "lots"
    status, body = post_json(node_agent_client, "inventory/report", {"nodeId": gpu_node.pk, "report": report})
    assert status == 400
    assert body["error"]["code"] == "INVALID_INPUT"
    assert "report.gpus[0].memoryMiB" in {d["field"] for d in body["error"]["details"]}
    status, body = post_json(node_agent_client, "inventory/report", {"nodeId": gpu_node.pk, "report": []})
    assert status == 400
    assert {d["field"] for d in error_details(body)} == {"report"}


@pytest.mark.django_db
def test_nodes_list_filters_by_pool_bucket_prefix_and_label_and_pages_in_hostname_order(
    operator_client: APIClient, node_agent_client: APIClient, owner_client: APIClient
) -> None:
    pool = PoolFactory.create()
    other = PoolFactory.create()
    names = [f"gpu-b-{index:03d}" for index in range(5)]
    for index, hostname in enumerate(names):
        NodeFactory.create(
            pool=pool, hostname=hostname, cordoned=index == 0, labels={"rack": "r1" if index < 3 else "r2"}
        )
    NodeFactory.create(pool=other, hostname="gpu-c-000")

    status, body = post_json(operator_client, "nodes/list", {"poolId": pool.pk, "limit": 2})
    assert status == 200, body
    assert [n["hostname"] for n in body["nodes"]] == names[:2]
    assert "atoms" not in body["nodes"][0]
    assert {"id", "bucket", "taints", "resources", "cordoned"} <= set(body["nodes"][0])
    seen = [n["hostname"] for n in body["nodes"]]
    while body["nextCursor"]:
        status, body = post_json(
            operator_client, "nodes/list", {"poolId": pool.pk, "limit": 2, "cursor": body["nextCursor"]}
        )
        assert status == 200, body
        seen += [n["hostname"] for n in body["nodes"]]
    assert seen == names

    def hostnames(**filters: Any) -> list[str]:
        status, answer = post_json(operator_client, "nodes/list", filters)
        assert status == 200, answer
        return [n["hostname"] for n in answer["nodes"]]

    assert hostnames(poolId=pool.pk, bucket="maintenance") == names[:1]
    assert hostnames(poolId=pool.pk, bucket="schedulable") == names[1:]
    assert hostnames(hostnamePrefix="gpu-c-") == ["gpu-c-000"]
    assert hostnames(poolId=pool.pk, label="rack=r2") == names[3:]
    assert hostnames(poolId=pool.pk, label="rack") == names

    # Node agents may list; tenants may not; a forged cursor is bad input.
    assert post_json(node_agent_client, "nodes/list", {"limit": 1})[0] == 200
    status, answer = post_json(owner_client, "nodes/list", {})
    assert (status, answer["error"]["code"]) == (403, "PERMISSION_DENIED")
    status, answer = post_json(operator_client, "nodes/list", {"cursor": "bm90LWEtY3Vyc29y"})
    assert (status, answer["error"]["details"][0]["field"]) == (400, "cursor")
    status, answer = post_json(operator_client, "nodes/list", {"bucket": "sleepy"})
    assert (status, answer["error"]["details"][0]["field"]) == (400, "bucket")


@pytest.mark.django_db
def test_set_maintenance_needs_no_reason_as_the_contract_says(
    operator_client: APIClient, gpu_node: Node
) -> None:
    status, body = post_json(operator_client, "nodes/setMaintenance", {"nodeId": gpu_node.pk, "on": True})
    assert status == 200, body
    assert (body["maintenance"], body["bucket"]) == (True, "maintenance")
    assert audit_trail(gpu_node) == ["node.maintenance.on"]
