"""Registration: pools, nodes and taints as a fleet file (or an operator) declares them.

Node reports (`inventory.services.node_reports`) write what the hardware says; these write
what the platform declares. The fleet loader calls the batch forms, set-based
and idempotent (upserts by natural key); nothing here deletes a node or a pool.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.db.models import Func

from core.errors import InvalidInput
from inventory.models import Node, Pool, Taint, TaintEffect

# What registration (a fleet file, `node_register`) may set on a node; the
# rest is written by node reports and the operator services.
NODE_REGISTRATION_FIELDS = (
    "role",
    "trust",
    "owner",
    "provision_state",
    "connectivity",
    "maintenance",
    "maintenance_reason",
    "cordoned",
    "cordon_reason",
    "cordoned_by",
    "converged_specs",
    "labels",
)
NODE_FIELDS = {*NODE_REGISTRATION_FIELDS, "owner_id"}


def _compute_now() -> Func:
    return Func(function="compute_now")


@dataclass(frozen=True)
class NodeDeclaration:
    """A node as a fleet file declares it: where it is, its registration fields and its taints."""

    hostname: str
    pool_id: str
    fields: dict[str, Any]
    taints: list[dict[str, str]] = field(default_factory=list)


def nodes_register(*, nodes: list[NodeDeclaration], actor: str) -> dict[str, Node]:
    """Upsert a batch of nodes by hostname with their taints; return them by hostname.

    Cordon time is stamped when a node becomes cordoned here. No heartbeat is
    stamped: only a node's own report is proof of life, so liveness never
    watches (and never disconnects) a node that has not reported.
    The node's `noschedule_taints` counter is set from the declared taints in
    the same statement as the node, so the placer's predicate sees them at once.
    """
    rows = [
        Node(
            hostname=spec.hostname,
            pool_id=spec.pool_id,
            noschedule_taints=sum(1 for t in spec.taints if t["effect"] == TaintEffect.NO_SCHEDULE),
            cordon_reason="fleet file" if spec.fields["cordoned"] else "",
            cordoned_by=actor if spec.fields["cordoned"] else "",
            maintenance_reason="fleet file" if spec.fields["maintenance"] else "",
            **spec.fields,
        )
        for spec in nodes
    ]
    Node.objects.bulk_create(
        rows,
        update_conflicts=True,
        unique_fields=["hostname"],
        update_fields=["pool", *NODE_REGISTRATION_FIELDS, "noschedule_taints", "updated_at"],
    )
    by_host = {n.hostname: n for n in Node.objects.filter(hostname__in=[s.hostname for s in nodes])}
    hosts = list(by_host)
    Node.objects.filter(hostname__in=hosts, cordoned=True, cordoned_at__isnull=True).update(
        cordoned_at=_compute_now()
    )
    Node.objects.filter(hostname__in=hosts, cordoned=False, cordoned_at__isnull=False).update(
        cordoned_at=None
    )
    _taints_replace(nodes, by_host, actor=actor)
    return by_host


def _taints_replace(nodes: list[NodeDeclaration], by_host: dict[str, Node], *, actor: str) -> None:
    """The declared taints become the node's taints: upserted by (node, key), others removed."""
    node_pks = [by_host[s.hostname].pk for s in nodes]
    wanted = {(by_host[s.hostname].pk, t["key"]) for s in nodes for t in s.taints}
    stale = [
        pk
        for pk, node_id, key in Taint.objects.filter(node_id__in=node_pks).values_list("pk", "node_id", "key")
        if (node_id, key) not in wanted
    ]
    if stale:
        Taint.objects.filter(pk__in=stale).delete()
    rows = [
        Taint(
            node_id=by_host[s.hostname].pk,
            key=t["key"],
            value=t["value"],
            effect=t["effect"],
            reason=t["reason"],
            created_by=actor,
        )
        for s in nodes
        for t in s.taints
    ]
    if rows:
        Taint.objects.bulk_create(
            rows,
            update_conflicts=True,
            unique_fields=["node", "key"],
            update_fields=["value", "effect", "reason"],
        )


def node_register(*, hostname: str, pool: Pool, **fields: Any) -> Node:
    """Create the node or update its registration fields (the loader's and an operator's entry point).

    Only the fields named in `NODE_FIELDS` may be given; cordon time is stamped with
    `compute_now()` when a node becomes cordoned here.
    """
    unknown = set(fields) - NODE_FIELDS
    if unknown:
        raise InvalidInput.field(sorted(unknown)[0], "not a node registration field")
    with transaction.atomic():
        node, created = Node.objects.select_for_update().get_or_create(
            hostname=hostname, defaults={"pool": pool, **fields}
        )
        if not created:
            for key, value in fields.items():
                setattr(node, key, value)
            node.pool = pool
            node.save(
                update_fields=sorted(
                    {"owner" if k == "owner_id" else k for k in fields} | {"pool", "updated_at"}
                )
            )
        if node.cordoned and node.cordoned_at is None:
            Node.objects.filter(pk=node.pk).update(cordoned_at=Func(function="compute_now"))
        elif not node.cordoned and node.cordoned_at is not None:
            Node.objects.filter(pk=node.pk).update(cordoned_at=None)
        node.refresh_from_db()
        return node
