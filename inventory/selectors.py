"""Reads of one node or device for operators: `nodes/get`, the answers of node operations, the commands."""

from __future__ import annotations

from typing import Any

from core.clock import to_millis
from core.errors import NotFound
from inventory.models import Device, Node
from inventory.schedulability import SCHEDULABLE, node_bucket


def node_get(*, node_id: str) -> Node:
    """The node with its pool (the bucket needs the pool's owner), or NOT_FOUND."""
    node = Node.objects.select_related("pool").filter(pk=node_id).first()
    if node is None:
        raise NotFound("node not found")
    return node


def node_find(*, ref: str) -> Node:
    """A node by id or by hostname, as operators type it on a command line."""
    node = Node.objects.select_related("pool").filter(pk=ref).first()
    if node is None:
        node = Node.objects.select_related("pool").filter(hostname=ref).first()
    if node is None:
        raise NotFound(f"no node with id or hostname {ref!r}")
    return node


def device_get(*, uid: str) -> Device:
    device = Device.objects.select_related("parent").filter(uid=uid).first()
    if device is None:
        raise NotFound("device not found")
    return device


def _device_row(device: Device, parent_uid: str | None) -> dict[str, Any]:
    return {
        "uid": device.uid,
        "nodeId": device.node_id,
        "class": device.device_class,
        "parentUid": parent_uid,
        "attributes": device.attributes,
        "healthy": device.healthy,
        "bookable": device.bookable,
        "vanishedAt": to_millis(device.vanished_at),
    }


def device_detail(*, device: Device) -> dict[str, Any]:
    """One device as the API shows it (`devices/setHealth`, `inventory/report`)."""
    parent_uid = device.parent.uid if device.parent_id is not None and device.parent else None
    return _device_row(device, parent_uid)


def devices_detail(*, devices: list[Device]) -> list[dict[str, Any]]:
    """Several devices in one extra query for their parents' uids."""
    parent_ids = {d.parent_id for d in devices if d.parent_id is not None}
    uids = dict(Device.objects.filter(pk__in=parent_ids).values_list("pk", "uid")) if parent_ids else {}
    return [_device_row(d, uids.get(d.parent_id) if d.parent_id is not None else None) for d in devices]


def node_detail(*, node: Node) -> dict[str, Any]:
    """The node with its state, bucket, taints, scalar resources and atoms (four queries)."""
    node = Node.objects.select_related("pool").get(pk=node.pk)
    bucket = node_bucket(node)
    taints = [
        {
            "key": t.key,
            "value": t.value,
            "effect": t.effect,
            "reason": t.reason,
            "createdBy": t.created_by,
            "createdAt": to_millis(t.created_at),
        }
        for t in node.taints.order_by("key")
    ]
    resources = [
        {
            "resource": r.resource,
            "allocatable": r.allocatable,
            "ratio": float(r.ratio),
            "allocated": r.allocated,
        }
        for r in node.resources.order_by("resource")
    ]
    atoms = list(
        Device.objects.filter(node=node, bookable=True)
        .select_related("parent")
        .order_by("device_class", "uid")
    )
    return {
        "id": node.pk,
        "hostname": node.hostname,
        "poolId": node.pool_id,
        "role": node.role,
        "trust": node.trust,
        "ownerTenantId": node.owner_id,
        "provisionState": node.provision_state,
        "connectivity": node.connectivity,
        "maintenance": node.maintenance,
        "maintenanceReason": node.maintenance_reason,
        "cordoned": node.cordoned,
        "cordonReason": node.cordon_reason,
        "cordonedBy": node.cordoned_by,
        "cordonedAt": to_millis(node.cordoned_at),
        "noScheduleTaints": node.noschedule_taints,
        "convergedSpecs": node.converged_specs,
        "labels": node.labels,
        "lastHeartbeatAt": to_millis(node.last_heartbeat_at),
        "bucket": bucket,
        "schedulable": bucket == SCHEDULABLE,
        "taints": taints,
        "resources": resources,
        "atoms": [_device_row(d, d.parent.uid if d.parent else None) for d in atoms],
        "updatedAt": to_millis(node.updated_at),
    }
