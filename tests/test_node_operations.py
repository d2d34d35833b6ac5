"""Node operations: through the services, the API and the commands; guard 4 and the rollup buckets."""

from __future__ import annotations

import io
import threading
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import OperationalError, connection, connections, transaction
from rest_framework.test import APIClient

from capacity.rollups import rollup_rebuild
from core.errors import InvalidInput
from core.models import AuditEvent, Principal, RoleBinding
from core.services import token_issue
from inventory import operations
from inventory.models import Device, Node, Taint
from inventory.selectors import node_detail
from ledger.models import PoolCapacityRollup
from tests.conftest import ClientFor, bearer_client
from tests.factories import DeviceFactory, NodeFactory, PoolFactory, TenantFactory

ACTOR = "ops@example.com"
UNKNOWN_NODE = "node_01k0000000000000000000000a"


def audit_trail(node: Node) -> list[str]:
    return list(
        AuditEvent.objects.filter(subject_type="node", subject_id=node.pk)
        .order_by("id")
        .values_list("action", flat=True)
    )


def post(client: APIClient, method: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    response = client.post(f"/api/compute/{method}", body, format="json")
    return response.status_code, response.json()


# --- Services -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_cordon_marks_the_node_and_writes_the_audit_event(gpu_node: Node) -> None:
    node = operations.node_cordon(node=gpu_node, reason="PSU swap", actor=ACTOR)

    row = Node.objects.get(pk=gpu_node.pk)
    assert node.cordoned and row.cordoned
    assert (row.cordon_reason, row.cordoned_by) == ("PSU swap", ACTOR)
    assert row.cordoned_at is not None
    event = AuditEvent.objects.get(subject_type="node", subject_id=gpu_node.pk)
    assert (event.actor, event.action, event.reason) == (ACTOR, "node.cordon", "PSU swap")
    assert event.data["hostname"] == gpu_node.hostname


@pytest.mark.django_db
def test_cordoning_a_cordoned_node_changes_nothing(gpu_node: Node) -> None:
    first = operations.node_cordon(node=gpu_node, reason="first", actor="alice")
    again = operations.node_cordon(node=gpu_node, reason="second", actor="bob")

    assert (again.cordon_reason, again.cordoned_by, again.cordoned_at) == (
        "first",
        "alice",
        first.cordoned_at,
    )
    assert audit_trail(gpu_node) == ["node.cordon"]


@pytest.mark.django_db
def test_a_cordon_needs_a_reason(gpu_node: Node) -> None:
    with pytest.raises(InvalidInput):
        operations.node_cordon(node=gpu_node, reason="  ", actor=ACTOR)
    assert not Node.objects.get(pk=gpu_node.pk).cordoned


@pytest.mark.django_db
def test_uncordon_clears_the_cordon(gpu_node: Node) -> None:
    operations.node_cordon(node=gpu_node, reason="PSU swap", actor=ACTOR)
    node = operations.node_uncordon(node=gpu_node, actor=ACTOR, reason="fixed")

    assert not node.cordoned
    assert (node.cordon_reason, node.cordoned_by, node.cordoned_at) == ("", "", None)
    assert audit_trail(gpu_node) == ["node.cordon", "node.uncordon"]
    operations.node_uncordon(node=gpu_node, actor=ACTOR)
    assert audit_trail(gpu_node) == ["node.cordon", "node.uncordon"]


@pytest.mark.django_db
def test_taint_keeps_the_noschedule_counter_on_the_node_row(gpu_node: Node) -> None:
    operations.node_taint(
        node=gpu_node, key="xid", value="79", effect="NoSchedule", reason="xid 79", actor=ACTOR
    )
    operations.node_taint(
        node=gpu_node, key="ecc", value="", effect="PreferNoSchedule", reason="", actor=ACTOR
    )
    assert Node.objects.get(pk=gpu_node.pk).noschedule_taints == 1

    operations.node_taint(
        node=gpu_node, key="ecc", value="", effect="NoSchedule", reason="worse", actor=ACTOR
    )
    assert Node.objects.get(pk=gpu_node.pk).noschedule_taints == 2

    operations.node_taint(
        node=gpu_node, key="xid", value="79", effect="PreferNoSchedule", reason="", actor=ACTOR
    )
    node = operations.node_untaint(node=gpu_node, key="ecc", actor=ACTOR)
    assert node.noschedule_taints == 0
    assert list(Taint.objects.filter(node=gpu_node).values_list("key", "effect")) == [
        ("xid", "PreferNoSchedule")
    ]
    assert audit_trail(gpu_node) == ["node.taint", "node.taint", "node.taint", "node.taint", "node.untaint"]


@pytest.mark.django_db
def test_repeating_a_taint_or_removing_a_missing_one_changes_nothing(gpu_node: Node) -> None:
    operations.node_taint(node=gpu_node, key="xid", value="79", effect="NoSchedule", reason="", actor=ACTOR)
    operations.node_taint(node=gpu_node, key="xid", value="79", effect="NoSchedule", reason="", actor=ACTOR)
    operations.node_untaint(node=gpu_node, key="nope", actor=ACTOR)
    assert Node.objects.get(pk=gpu_node.pk).noschedule_taints == 1
    assert audit_trail(gpu_node) == ["node.taint"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("key", "effect"),
    [("", "NoSchedule"), ("bad key", "NoSchedule"), ("-x", "NoSchedule"), ("ok", "NoExecute")],
)
def test_taint_refuses_bad_keys_and_effects(gpu_node: Node, key: str, effect: str) -> None:
    with pytest.raises(InvalidInput):
        operations.node_taint(node=gpu_node, key=key, value="", effect=effect, reason="", actor=ACTOR)
    assert not Taint.objects.exists()


@pytest.mark.django_db
def test_maintenance_on_and_off(gpu_node: Node) -> None:
    node = operations.node_set_maintenance(node=gpu_node, on=True, reason="firmware", actor=ACTOR)
    assert node.maintenance and node.maintenance_reason == "firmware"
    operations.node_set_maintenance(node=gpu_node, on=True, reason="again", actor=ACTOR)
    node = operations.node_set_maintenance(node=gpu_node, on=False, reason="", actor=ACTOR)
    assert not node.maintenance and node.maintenance_reason == ""
    assert audit_trail(gpu_node) == ["node.maintenance.on", "node.maintenance.off"]


@pytest.mark.django_db
def test_device_health_flips_and_a_partitioned_gpu_takes_its_atoms_along(gpu_node: Node) -> None:
    parent = DeviceFactory.create(node=gpu_node, bookable=False)
    mig = [
        DeviceFactory.create(
            node=gpu_node, parent=parent, device_class="gpu.mig", uid=f"{parent.uid}/gi{i}/ci0"
        )
        for i in (1, 2)
    ]

    device = operations.device_set_health(device=parent, healthy=False, reason="xid 79", actor=ACTOR)

    assert not device.healthy
    assert not any(Device.objects.filter(pk__in=[m.pk for m in mig]).values_list("healthy", flat=True))
    event = AuditEvent.objects.get(subject_type="device", subject_id=parent.uid)
    assert (event.action, event.actor, event.data["devicesChanged"]) == ("device.unhealthy", ACTOR, 3)

    operations.device_set_health(device=parent, healthy=True, reason="", actor=ACTOR)
    assert Device.objects.filter(node=gpu_node, healthy=False).count() == 0


@pytest.mark.django_db
def test_node_detail_reports_the_bucket_after_each_operation(gpu_node: Node) -> None:
    assert node_detail(node=gpu_node)["bucket"] == "schedulable"
    operations.node_taint(node=gpu_node, key="xid", value="", effect="NoSchedule", reason="", actor=ACTOR)
    assert node_detail(node=gpu_node)["bucket"] == "unhealthy"
    operations.node_cordon(node=gpu_node, reason="swap", actor=ACTOR)
    detail = node_detail(node=gpu_node)
    assert (detail["bucket"], detail["schedulable"]) == ("maintenance", False)
    assert [t["key"] for t in detail["taints"]] == ["xid"]
    assert len(detail["atoms"]) == 8


@pytest.mark.django_db
def test_a_cordon_then_a_rebuild_moves_the_gpus_from_allocatable_to_maintenance(gpu_node: Node) -> None:
    rollup_rebuild(pool_id=gpu_node.pool_id)
    before = PoolCapacityRollup.objects.get(pool_id=gpu_node.pool_id, resource="gpu")
    assert (before.allocatable, before.maintenance) == (8, 0)

    operations.node_cordon(node=gpu_node, reason="swap", actor=ACTOR)
    rollup_rebuild(pool_id=gpu_node.pool_id)

    after = PoolCapacityRollup.objects.get(pool_id=gpu_node.pool_id, resource="gpu")
    assert (after.allocatable, after.maintenance, after.total) == (0, 8, 8)


@pytest.mark.django_db
def test_a_noschedule_taint_then_a_rebuild_moves_the_gpus_to_unhealthy(gpu_node: Node) -> None:
    operations.node_taint(node=gpu_node, key="xid", value="", effect="NoSchedule", reason="", actor=ACTOR)
    rollup_rebuild(pool_id=gpu_node.pool_id)
    row = PoolCapacityRollup.objects.get(pool_id=gpu_node.pool_id, resource="gpu")
    assert (row.allocatable, row.unhealthy) == (0, 8)


# --- Guard 4: the operations write the rows the placer locks ------------------------------


def _run_in_thread(work: Any) -> BaseException | None:
    """Run `work` on its own connection with a short lock timeout; return what it raised."""
    outcome: list[BaseException | None] = [None]

    def target() -> None:
        try:
            with connections["default"].cursor() as cursor:
                cursor.execute("SET lock_timeout = '200ms'")
            work()
        except BaseException as exc:
            outcome[0] = exc
        finally:
            connections["default"].close()

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    return outcome[0]


def _fresh(node_pk: str) -> Node:
    return Node.objects.get(pk=node_pk)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "operation",
    [
        pytest.param(lambda n: operations.node_cordon(node=n, reason="swap", actor=ACTOR), id="cordon"),
        pytest.param(
            lambda n: operations.node_taint(
                node=n, key="k", value="", effect="NoSchedule", reason="", actor=ACTOR
            ),
            id="taint",
        ),
        pytest.param(
            lambda n: operations.node_set_maintenance(node=n, on=True, reason="fw", actor=ACTOR),
            id="maintenance",
        ),
    ],
)
def test_node_operations_wait_for_a_placer_holding_the_node_for_share(operation: Any) -> None:
    node = NodeFactory.create()
    with transaction.atomic(), connection.cursor() as cursor:
        # What the placer does before it books (guard 4).
        cursor.execute("SELECT 1 FROM inventory_node WHERE id = %s FOR SHARE", [node.pk])
        error = _run_in_thread(lambda: operation(_fresh(node.pk)))
    assert isinstance(error, OperationalError)
    assert "lock timeout" in str(error)
    # Once the placer's transaction is over, the operation goes through.
    assert _run_in_thread(lambda: operation(_fresh(node.pk))) is None


@pytest.mark.django_db(transaction=True)
def test_device_health_waits_for_a_placer_holding_the_atom_for_share() -> None:
    device = DeviceFactory.create()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM inventory_device WHERE id = %s FOR SHARE", [device.pk])
        error = _run_in_thread(
            lambda: operations.device_set_health(
                device=Device.objects.get(pk=device.pk), healthy=False, reason="xid", actor=ACTOR
            )
        )
    assert isinstance(error, OperationalError)
    assert Device.objects.get(pk=device.pk).healthy


@pytest.mark.django_db(transaction=True)
def test_concurrent_taints_on_one_node_keep_the_counter_exact() -> None:
    node = NodeFactory.create()
    workers = 6
    barrier = threading.Barrier(workers)
    errors: list[BaseException] = []

    def taint(index: int) -> None:
        try:
            barrier.wait()
            operations.node_taint(
                node=Node.objects.get(pk=node.pk),
                key=f"k{index}",
                value="",
                effect="NoSchedule" if index % 2 == 0 else "PreferNoSchedule",
                reason="",
                actor=ACTOR,
            )
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections["default"].close()

    threads = [threading.Thread(target=taint, args=(i,)) for i in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert Taint.objects.filter(node=node).count() == workers
    assert Node.objects.get(pk=node.pk).noschedule_taints == workers // 2


# --- The API ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_nodes_get_answers_the_node_with_state_taints_resources_and_atoms(
    operator_client: APIClient, gpu_node: Node
) -> None:
    status, body = post(operator_client, "nodes/get", {"nodeId": gpu_node.pk})
    assert status == 200, body
    assert (body["id"], body["hostname"], body["bucket"]) == (gpu_node.pk, "gpu-a-001", "schedulable")
    assert len(body["atoms"]) == 8
    assert {"taints", "resources", "cordoned", "maintenance", "connectivity"} <= set(body)


@pytest.mark.django_db
def test_cordon_and_uncordon_through_the_api(operator_client: APIClient, gpu_node: Node) -> None:
    status, body = post(operator_client, "nodes/cordon", {"nodeId": gpu_node.pk, "reason": "PSU swap"})
    assert status == 200, body
    assert (body["cordoned"], body["cordonReason"], body["bucket"]) == (True, "PSU swap", "maintenance")
    row = Node.objects.get(pk=gpu_node.pk)
    assert row.cordoned
    event = AuditEvent.objects.get(subject_id=gpu_node.pk, action="node.cordon")
    operator = Principal.objects.get(bindings__role="operator")
    assert operator.pk in event.actor

    status, body = post(operator_client, "nodes/uncordon", {"nodeId": gpu_node.pk})
    assert status == 200
    assert body["cordoned"] is False
    assert not Node.objects.get(pk=gpu_node.pk).cordoned
    assert audit_trail(gpu_node) == ["node.cordon", "node.uncordon"]


@pytest.mark.django_db
def test_taint_and_untaint_through_the_api(operator_client: APIClient, gpu_node: Node) -> None:
    body = {"nodeId": gpu_node.pk, "key": "gpu.example.com/xid", "value": "79", "effect": "NoSchedule"}
    status, answer = post(operator_client, "nodes/taint", body)
    assert status == 200, answer
    assert answer["noScheduleTaints"] == 1
    assert answer["taints"][0]["key"] == "gpu.example.com/xid"
    assert Node.objects.get(pk=gpu_node.pk).noschedule_taints == 1

    status, answer = post(
        operator_client, "nodes/untaint", {"nodeId": gpu_node.pk, "key": "gpu.example.com/xid"}
    )
    assert status == 200
    assert (answer["noScheduleTaints"], answer["taints"]) == (0, [])
    assert audit_trail(gpu_node) == ["node.taint", "node.untaint"]


@pytest.mark.django_db
def test_set_maintenance_through_the_api(operator_client: APIClient, gpu_node: Node) -> None:
    status, body = post(
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
    status, body = post(
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
        status, answer = post(api_client_for("acme", role), method, {"nodeId": gpu_node.pk, **body})
        assert status == 403, answer
        assert answer["error"]["code"] == "PERMISSION_DENIED"
    assert Node.objects.get(pk=gpu_node.pk).cordoned is False
    assert not AuditEvent.objects.filter(subject_type="node").exists()


@pytest.mark.django_db
def test_an_operator_role_bound_to_a_tenant_may_not_operate_nodes(gpu_node: Node) -> None:
    token, secret = token_issue(tenant_id=gpu_node.pool.owner_id, role="member")
    RoleBinding.objects.create(principal=token.principal, role="operator", tenant_id=gpu_node.pool.owner_id)
    status, body = post(bearer_client(secret), "nodes/cordon", {"nodeId": gpu_node.pk, "reason": "r"})
    assert status == 403
    assert body["error"]["code"] == "PERMISSION_DENIED"


@pytest.mark.django_db
def test_a_tenant_token_may_not_set_device_health(owner_client: APIClient, gpu_node: Node) -> None:
    device = gpu_node.devices.first()
    assert device is not None
    status, _ = post(owner_client, "devices/setHealth", {"deviceUid": device.uid, "healthy": False})
    assert status == 403
    assert Device.objects.get(pk=device.pk).healthy


@pytest.mark.django_db
def test_unknown_nodes_and_devices_are_not_found(operator_client: APIClient) -> None:
    status, body = post(operator_client, "nodes/cordon", {"nodeId": UNKNOWN_NODE, "reason": "r"})
    assert (status, body["error"]["code"]) == (404, "NOT_FOUND")
    status, body = post(operator_client, "devices/setHealth", {"deviceUid": "GPU-nope", "healthy": True})
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
    status, answer = post(operator_client, method, body)
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

    status, body = post(
        node_agent_client, "inventory/report", {"nodeId": node.pk, "report": a_report("gpu-b-001")}
    )
    assert status == 200, body
    assert body["nodeId"] == node.pk
    assert "GPU-5a2c1f6e-0c3b-4a8e-9d7e-1b2c3d4e5f60" in {d["uid"] for d in body["devices"]}

    status, body = post(node_agent_client, "nodes/cordon", {"nodeId": node.pk, "reason": "r"})
    assert (status, body["error"]["code"]) == (403, "PERMISSION_DENIED")
    assert not Node.objects.get(pk=node.pk).cordoned


@pytest.mark.django_db
def test_a_tenant_token_may_not_report_inventory(owner_client: APIClient, gpu_node: Node) -> None:
    status, _ = post(
        owner_client, "inventory/report", {"nodeId": gpu_node.pk, "report": a_report("gpu-a-001")}
    )
    assert status == 403


@pytest.mark.django_db
def test_a_malformed_report_names_its_fields_under_report(
    node_agent_client: APIClient, gpu_node: Node
) -> None:
    report = a_report("gpu-a-001")
    report["gpus"][0]["memoryMiB"] = "lots"
    status, body = post(node_agent_client, "inventory/report", {"nodeId": gpu_node.pk, "report": report})
    assert status == 400
    assert body["error"]["code"] == "INVALID_INPUT"
    assert "report.gpus[0].memoryMiB" in {d["field"] for d in body["error"]["details"]}
    status, body = post(node_agent_client, "inventory/report", {"nodeId": gpu_node.pk, "report": []})
    assert status == 400
    assert {d["field"] for d in body["error"]["details"]} == {"report"}


# --- Commands -----------------------------------------------------------------------------


def run(command: str, *args: str) -> str:
    out = io.StringIO()
    call_command(command, *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_commands_cordon_by_hostname_and_uncordon_by_id(gpu_node: Node) -> None:
    assert "cordoned" in run("cordon", "gpu-a-001", "--reason", "PSU swap", "--actor", "alice")
    row = Node.objects.get(pk=gpu_node.pk)
    assert (row.cordoned, row.cordoned_by) == (True, "alice")
    assert "already cordoned" in run("cordon", gpu_node.pk, "--reason", "again")

    assert "uncordoned" in run("uncordon", gpu_node.pk)
    assert not Node.objects.get(pk=gpu_node.pk).cordoned
    assert audit_trail(gpu_node) == ["node.cordon", "node.uncordon"]


@pytest.mark.django_db
def test_commands_taint_and_untaint(gpu_node: Node) -> None:
    run("taint", "gpu-a-001", "xid", "--value", "79", "--effect", "NoSchedule", "--reason", "xid 79")
    assert Node.objects.get(pk=gpu_node.pk).noschedule_taints == 1
    run("untaint", "gpu-a-001", "xid")
    assert Node.objects.get(pk=gpu_node.pk).noschedule_taints == 0
    assert "has no taint" in run("untaint", "gpu-a-001", "xid")


@pytest.mark.django_db
def test_commands_refuse_an_unknown_node() -> None:
    with pytest.raises(CommandError):
        run("cordon", "no-such-host", "--reason", "r")
