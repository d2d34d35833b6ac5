"""Reads of nodes and devices for operators: `nodes/get`, `nodes/list`, the answers of node operations."""

from __future__ import annotations

from typing import Any

from django.db.models import Q
from django.db.models.expressions import RawSQL

from core.clock import to_millis
from core.cursors import cursor_decode, cursor_encode, cursor_invalid
from core.decisions import NodeScope
from core.errors import NotFound
from inventory.models import Device, Node
from inventory.schedulability import SCHEDULABLE, bucket_sql, node_bucket


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


def _node_row(node: Node) -> dict[str, Any]:
    """The node as `nodes/get` and `nodes/list` answer it, without its atoms.

    Reads `node.pool` (for the bucket), `node.taints` and `node.resources`:
    prefetch them for a list.
    """
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
        for t in sorted(node.taints.all(), key=lambda t: t.key)
    ]
    resources = [
        {
            "resource": r.resource,
            "allocatable": r.allocatable,
            "ratio": float(r.ratio),
            "allocated": r.allocated,
        }
        for r in sorted(node.resources.all(), key=lambda r: r.resource)
    ]
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
        "updatedAt": to_millis(node.updated_at),
    }


def node_detail(*, node: Node) -> dict[str, Any]:
    """The node with its state, bucket, taints, scalar resources and atoms (four queries)."""
    node = Node.objects.select_related("pool").get(pk=node.pk)
    atoms = list(
        Device.objects.filter(node=node, bookable=True)
        .select_related("parent")
        .order_by("device_class", "uid")
    )
    row = _node_row(node)
    updated_at = row.pop("updatedAt")
    return {
        **row,
        "atoms": [_device_row(d, d.parent.uid if d.parent else None) for d in atoms],
        "updatedAt": updated_at,
    }


NODE_LIST_DEFAULT = 100
NODE_LIST_MAX = 500


def node_bucket_expression() -> RawSQL:
    """The one bucket SQL over the node row as an annotation.

    The pool's owner comes by a scalar subquery, so the annotation stands alone
    (the admin paginator's COUNT(*) has no pool join).
    """
    return RawSQL(  # noqa: S611 - fixed SQL from inventory.schedulability, no user input
        bucket_sql(
            n="inventory_node",
            pool_owner="(SELECT p.owner_id FROM inventory_pool p WHERE p.id = inventory_node.pool_id)",
        ),
        [],
    )


def node_list(
    *,
    pool_id: str | None = None,
    bucket: str | None = None,
    hostname_prefix: str | None = None,
    label: str | None = None,
    limit: int = NODE_LIST_DEFAULT,
    cursor: str | None = None,
    scope: NodeScope | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """A page of nodes in hostname order (`nodes/list`) and the next page's cursor, or None.

    `label` is `key=value` (that value) or `key` (any value). The cursor is the
    last hostname of the page, so a node added meanwhile is neither skipped
    nor repeated. `scope` (the caller's credential) keeps only the nodes it
    covers; the filters narrow it further, never widen it. Three queries: the
    page, its taints, its resources.
    """
    nodes = Node.objects.select_related("pool").prefetch_related("taints", "resources").order_by("hostname")
    if scope is not None and not scope.everywhere:
        nodes = nodes.filter(Q(pool_id__in=scope.pool_ids) | Q(pk__in=scope.node_ids))
    if pool_id is not None:
        nodes = nodes.filter(pool_id=pool_id)
    if bucket is not None:
        nodes = nodes.annotate(bucket=node_bucket_expression()).filter(bucket=bucket)
    if hostname_prefix:
        nodes = nodes.filter(hostname__startswith=hostname_prefix)
    if label:
        key, has_value, value = label.partition("=")
        nodes = (
            nodes.filter(labels__contains={key: value}) if has_value else nodes.filter(labels__has_key=key)
        )
    if cursor is not None:
        nodes = nodes.filter(hostname__gt=_cursor_hostname(cursor))
    page = list(nodes[: limit + 1])
    more = len(page) > limit
    page = page[:limit]
    next_cursor = _cursor_of(page[-1].hostname) if more and page else None
    return [_node_row(node) for node in page], next_cursor


def _cursor_of(hostname: str) -> str:
    return cursor_encode("node", hostname, sep=":")


def _cursor_hostname(cursor: str) -> str:
    kind, hostname = cursor_decode(cursor, count=2, sep=":")
    if kind != "node" or not hostname or "\x00" in hostname:
        raise cursor_invalid()
    return hostname
