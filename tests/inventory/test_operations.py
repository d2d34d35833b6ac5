"""Node operations through the services: guard 4 and the rollup buckets.

The services here are the inventory halves; the commands, the API and the
admin go through `operations.services`, which moves the rollups with them
(`tests/operations/`).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import OperationalError, connection, connections, transaction

from core.clock import compute_now
from core.errors import InvalidInput
from core.models import AuditEvent
from inventory.models import Device, Node, Taint
from inventory.selectors import node_detail
from inventory.services import nodes as operations
from reservations.models import PoolCapacityRollup
from reservations.rollups.recount import rollup_rebuild
from tests.support.factories import DeviceFactory, NodeFactory
from tests.support.records import audit_trail
from tests.support.threads import Worker

ACTOR = "ops@example.com"


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
def test_connectivity_is_a_guarded_write_audited_when_it_changes(gpu_node: Node) -> None:
    down = operations.node_set_connectivity(node=gpu_node, connected=False, actor="liveness", reason="silent")
    operations.node_set_connectivity(node=gpu_node, connected=False, actor="liveness", reason="silent")
    assert down.connectivity == "disconnected"
    assert node_detail(node=down)["bucket"] == "unreachable"
    up = operations.node_set_connectivity(node=gpu_node, connected=True, actor=ACTOR, reason="checked")
    assert up.connectivity == "connected"
    assert audit_trail(gpu_node) == ["node.disconnected", "node.connected"]


@pytest.mark.django_db
def test_a_disconnect_with_a_cutoff_spares_a_node_that_reported_after_it(gpu_node: Node) -> None:
    reported = compute_now()
    Node.objects.filter(pk=gpu_node.pk).update(last_heartbeat_at=reported)

    spared = operations.node_set_connectivity(
        node=gpu_node, connected=False, actor="liveness", reason="silent", heartbeat_before=reported
    )
    assert spared.connectivity == "connected"
    assert audit_trail(gpu_node) == []
    # A node that never reported has nothing newer than any cutoff.
    Node.objects.filter(pk=gpu_node.pk).update(last_heartbeat_at=None)
    gone = operations.node_set_connectivity(
        node=gpu_node, connected=False, actor="liveness", reason="silent", heartbeat_before=reported
    )
    assert gone.connectivity == "disconnected"


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

    def target() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '200ms'")
        work()

    worker = Worker(target)
    worker.start()
    worker.finish()
    return worker.error


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
def test_device_health_waits_for_a_placer_holding_the_atom() -> None:
    device = DeviceFactory.create()
    with transaction.atomic(), connection.cursor() as cursor:
        # What the placer does before it books (guard 4, `option._lock_atoms`).
        cursor.execute("SELECT 1 FROM inventory_device WHERE id = %s FOR NO KEY UPDATE", [device.pk])
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
